"""Hidden checks of kata 10 — prefix caching by block hash.

``block_hashes`` is checked by its properties only (one hash per full block, chained), never
against the reference's hash values: the hash function is free. ``PrefixCache`` replays programs
of allocate, append_token and free next to the reference (``prefix_programs``) and compares what
the SPEC makes observable: reused tokens, errors, table lengths, which positions share a block,
``num_free_blocks`` and ``num_cached_blocks`` — never block ids. Pinned programs carry numbers
worked by hand (the reference must agree with them too).
"""
from __future__ import annotations

from hypothesis import strategies as st

from grader.checks.support import protocol
from grader.checks.support.common import expect_value_error
from grader.checks.k10_programs import prefix_workload, programs, replay
from grader.engine import Checks

CHECKS = Checks("10")
TOKENS = st.lists(st.integers(0, 5), max_size=20)


def _hashes(c, ex, tokens, P, what):
    """The learner's block_hashes(tokens, P), checked to be a list of ints that left its input alone."""
    given = list(tokens)
    got = c.t.block_hashes(given, P)
    if given != tokens:
        c.fail(f"block_hashes({tokens}, {P}) changed its token_ids argument to {given}", ex, ("mutated",))
    if not isinstance(got, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in got):
        c.fail(f"block_hashes({tokens}, {P}) returned {got!r}; expected a list of int hashes ({what})", ex,
               ("not a list of ints",))
    return got


@CHECKS.add("block_hashes gives one hash per full block; a partly filled block has none", uses="block_hashes")
def hashes_one_per_full_block(ctx):
    def body(c, ex):
        tokens, P, tail = ex["tokens"], ex["block_size"], ex["tail"]
        hashes = _hashes(c, ex, tokens, P, "one per full block")
        if len(hashes) != len(tokens) // P:
            c.fail(f"block_hashes of {len(tokens)} tokens with block size {P} gave {len(hashes)} hash(es); expected "
                   f"{len(tokens)} // {P} = {len(tokens) // P}: only full blocks are hashed (a partly filled block "
                   "will still change, so it cannot be shared)", ex, ("count", len(tokens), P, len(hashes)))
        full = tokens[:len(tokens) // P * P]
        other = full + [t + 1 for t in tokens[len(full):]] + tail[:P - 1 - (len(tokens) - len(full))]
        for what, variant in (("the full blocks alone", full), ("another partly filled tail", other)):
            again = _hashes(c, ex, variant, P, "one per full block")
            if again != hashes:
                c.fail(f"block_hashes({variant}, {P}) ({what}) gave {again}, but block_hashes({tokens}, {P}) gave "
                       f"{hashes}: the same full blocks must give the same hashes, whatever follows them", ex,
                       ("tail changes the hashes", what))

    ctx.case({"tokens": [1, 2, 3, 4, 5], "block_size": 2, "tail": []}, body)  # 2 full blocks, token 5 alone: 2 hashes
    ctx.case({"tokens": [7, 7, 7], "block_size": 4, "tail": [1]}, body)  # no full block: []
    ctx.forall(st.fixed_dictionaries({"tokens": TOKENS, "block_size": st.integers(1, 5), "tail": TOKENS}), body,
               max_examples=25)


@CHECKS.add("block_hashes are chained: hash i stands for the whole prefix up to block i", uses="block_hashes")
def hashes_are_chained(ctx):
    def body(c, ex):
        P, a, b, block = ex["block_size"], ex["a"], ex["b"], ex["block"]
        ha, hb = _hashes(c, ex, a + block, P, "chained"), _hashes(c, ex, b + block, P, "chained")
        if len(ha) != len(a + block) // P or len(hb) != len(b + block) // P:
            c.fail("block_hashes gave the wrong number of hashes (see the first check)", ex, ("count",))
        if ha[-1] == hb[-1]:
            c.fail(f"block {block} gets the same hash after {a} as after {b}. Its keys and values depend on every "
                   "token before it, so hash i must be chained on hash i - 1 (hash the previous hash with the block)",
                   ex, ("not chained",))
        if _hashes(c, ex, a + block, P, "chained") != ha:
            c.fail(f"block_hashes({a + block}, {P}) gave different hashes on a second call: equal prefixes must "
                   "give equal hashes", ex, ("not repeatable",))
        same = [block] * 3
        hs = _hashes(c, ex, sum(same, []), P, "chained")
        if len(set(hs)) != len(hs):
            c.fail(f"block_hashes({sum(same, [])}, {P}) gave {hs}: three equal blocks at different depths are "
                   "three different prefixes and need three different hashes", ex, ("not chained",))
        changed = a + [block[0] + 100] + block[1:] + b[:len(b) // P * P]
        hc, hx = _hashes(c, ex, changed, P, "chained"), _hashes(c, ex, a + block + b[:len(b) // P * P], P, "chained")
        k = len(a) // P
        if hc[:k] != hx[:k] or any(x == y for x, y in zip(hc[k:], hx[k:])):
            c.fail(f"changing one token of block {k} must change hash {k} and every hash after it, and none "
                   f"before it: {hx} became {hc}", ex, ("change not propagated",))

    ctx.case({"block_size": 2, "a": [1, 2], "b": [5, 6], "block": [3, 4]}, body)
    ctx.case({"block_size": 2, "a": [1, 23], "b": [12, 3], "block": [0, 0]}, body)  # multi-digit ids, token id 0
    blocks = st.integers(1, 4).flatmap(lambda P: st.fixed_dictionaries({
        "block_size": st.just(P),
        "a": st.integers(0, 2).flatmap(lambda n: st.lists(st.integers(0, 3), min_size=n * P, max_size=n * P)),
        "b": st.integers(0, 2).flatmap(lambda n: st.lists(st.integers(0, 3), min_size=n * P, max_size=n * P)),
        "block": st.lists(st.integers(0, 3), min_size=P, max_size=P)})).filter(lambda ex: ex["a"] != ex["b"])
    ctx.forall(blocks, body, max_examples=20)


# -- pinned programs (worked by hand) ----------------------------------------------------------------
SYSTEM = [1, 2, 3, 4, 5, 6, 7, 8]  # a 2-block system prompt at block size 4
SHARED_PROMPT = {"num_blocks": 16, "block_size": 4, "ops": [
    ("allocate", 0, SYSTEM + [9, 10, 11, 12, 13]),  # 13 tokens, 4 blocks (3 full, cached): nothing reused
    ("allocate", 1, SYSTEM + [20, 21, 22]),  # the 2 system blocks hit: 8 reused, 1 new block
    ("allocate", 2, SYSTEM + [9, 10, 11, 12, 13]),  # 3 full blocks hit, 12 reused; the last token's block is new
    ("allocate", 3, SYSTEM + [9, 10, 11, 12]),  # 12 tokens, all 3 blocks cached, but the last is computed: 8
    ("free", 0), ("free", 3),  # 3's last block lost the hash race to 0's (older keeps it): it is just free
    ("free", 2), ("free", 1),  # the 3 cached blocks stay cached, unreferenced: all 16 can be had
    ("allocate", 0, SYSTEM + [9, 10, 11, 12])],  # hits the 2 system blocks; the third is taken from the free ones
    "want": {0: {"reused": 0, "free": 12, "cached": 3}, 1: {"reused": 8, "free": 11, "cached": 3},
             2: {"reused": 12, "free": 10, "cached": 3}, 3: {"reused": 8, "free": 9, "cached": 3},
             4: {"free": 10, "cached": 3}, 5: {"free": 11, "cached": 3}, 6: {"free": 13, "cached": 3},
             7: {"free": 16, "cached": 3}, 8: {"reused": 8, "free": 13, "cached": 3}}}
EVICTION = {"num_blocks": 4, "block_size": 2, "ops": [
    ("allocate", 0, [1, 2, 3, 4]), ("allocate", 1, [5, 6, 0]),  # 0: [A0 A1], 1: [B0 b]; b is partly filled
    ("free", 1), ("free", 0),  # b is free; eviction order B0, then A1 before A0 (a sequence's tail first)
    ("allocate", 2, [7, 8]),  # takes the free block b, evicts nothing
    ("allocate", 3, [9, 9]),  # no free block: evicts B0, released first
    ("allocate", 4, [7, 8, 1]),  # hits 2's block [7 8] (2 reused); evicts A1, not A0
    ("free", 2), ("free", 3),  # [7 8] still held by 4; [9 9] joins the order after A0
    ("allocate", 5, [1, 2, 3]),  # hits A0 (2 reused), which leaves the order; evicts [9 9]
    ("allocate", 6, [7, 8, 1, 2, 3]),  # would hit [7 8] and need 2 more blocks: none, OutOfBlocksError
    ("free", 4), ("allocate", 6, [7, 8, 1]),  # [7 8] is hit again; its new block comes from the free one
    ("free", 5), ("free", 6)],
    "want": {0: {"reused": 0, "free": 2, "cached": 2}, 1: {"reused": 0, "free": 0, "cached": 3},
             2: {"free": 2, "cached": 3}, 3: {"free": 4, "cached": 3}, 4: {"reused": 0, "free": 3, "cached": 4},
             5: {"reused": 0, "free": 2, "cached": 4}, 6: {"reused": 2, "free": 1, "cached": 3},
             7: {"free": 1, "cached": 3}, 8: {"free": 2, "cached": 3}, 9: {"reused": 2, "free": 0, "cached": 2},
             10: {"free": 0, "cached": 2}, 11: {"free": 2, "cached": 2}, 12: {"reused": 2, "free": 0, "cached": 2},
             13: {"free": 2, "cached": 2}, 14: {"free": 4, "cached": 2}}}
# A hit followed by a second release: the block's recency is its later release, not its first (nor the
# time it was allocated). Only then does eviction keep it and take the other cached block.
REHIT = {"num_blocks": 4, "block_size": 2, "ops": [
    ("allocate", 0, [1, 2, 9]),  # X = [1 2] cached, [9] partly filled
    ("free", 0),  # [9] is free; X released: the order is X
    ("allocate", 1, [3, 4, 9]),  # Y = [3 4] cached, from the free blocks
    ("free", 1),  # Y released after X: the order is X, Y
    ("allocate", 2, [1, 2, 8]),  # hits X (2 reused): X leaves the order
    ("free", 2),  # X released again, after Y: the order is Y, X
    ("allocate", 3, [5, 6, 7, 7, 7]),  # 3 new blocks: the 2 free ones, then evicts Y (released longest ago)
    ("free", 3),
    ("allocate", 4, [1, 2, 8]),  # X is still cached: 2 reused (evicting by X's first release, or by
    ("free", 4)],  # its allocation, took X at step 6: 0 reused)
    "want": {0: {"reused": 0, "free": 2, "cached": 1}, 1: {"free": 4, "cached": 1},
             2: {"reused": 0, "free": 2, "cached": 2}, 3: {"free": 4, "cached": 2},
             4: {"reused": 2, "free": 2, "cached": 2}, 5: {"free": 4, "cached": 2},
             6: {"reused": 0, "free": 1, "cached": 3}, 7: {"free": 4, "cached": 3},
             8: {"reused": 2, "free": 2, "cached": 3}, 9: {"free": 4, "cached": 3}}}
DECODE = {"num_blocks": 8, "block_size": 4, "ops": [
    ("allocate", 0, [1, 2, 3]), ("append", 0, 4),  # the block fills: hashed and cached
    ("append", 0, 5), ("append", 0, 6), ("append", 0, 7), ("append", 0, 8),  # a new block, full after 4 tokens
    ("allocate", 1, [1, 2, 3, 4, 5, 6, 7, 8, 9]),  # both decoded blocks hit: 8 reused
    ("allocate", 2, [1, 2, 3]), ("append", 2, 4),  # full, but 0's block holds that hash: the older keeps it
    ("append", 2, 9), ("free", 2),  # both of 2's blocks hold no hash: free again
    ("free", 0), ("free", 1),  # 2 cached blocks, now evictable
    ("allocate", 3, [1, 2, 3, 4, 5, 6, 7, 8]), ("free", 3)],  # 4 reused: the last token's block is computed
    "want": {0: {"reused": 0, "free": 7, "cached": 0}, 1: {"free": 7, "cached": 1}, 2: {"free": 6, "cached": 1},
             5: {"free": 6, "cached": 2}, 6: {"reused": 8, "free": 5, "cached": 2},
             7: {"reused": 0, "free": 4, "cached": 2}, 8: {"free": 4, "cached": 2}, 9: {"free": 3, "cached": 2},
             10: {"free": 5, "cached": 2}, 11: {"free": 5, "cached": 2}, 12: {"free": 8, "cached": 2},
             13: {"reused": 4, "free": 6, "cached": 2}, 14: {"free": 8, "cached": 2}}}


def _large() -> dict:
    """Past the drawn sizes: six requests on one 256-token system prompt (ids up to 31999, blocks of 16),
    two decoding 20 tokens, all freed, then the first prompt again with the cache full of evictable blocks."""
    prompts = prefix_workload(requests=6, prefix=256, suffix=(20, 60), seed=10)
    ops = [("allocate", i, p) for i, p in enumerate(prompts[:4])] + [("free", 1), ("free", 2)]
    ops += [("append", seq, 31999 - t) for t in range(20) for seq in (0, 3)]
    ops += [("allocate", 1, prompts[4]), ("allocate", 2, prompts[5])]
    ops += [("free", s) for s in range(4)] + [("allocate", 0, prompts[0]), ("free", 0)]
    return {"num_blocks": 64, "block_size": 16, "ops": ops}


LARGE = _large()


@CHECKS.add("requests sharing a system prompt reuse its cached blocks", uses="PrefixCache.allocate")
def shared_system_prompt(ctx):
    ctx.case(SHARED_PROMPT, replay)

    @st.composite
    def requests(draw):
        P, k = draw(st.integers(1, 4)), draw(st.integers(1, 3))
        system = draw(st.lists(st.integers(0, 3), min_size=k * P, max_size=k * P))
        own = draw(st.lists(st.integers(1, 2 * P + 1), min_size=2, max_size=4))
        # request i's own tokens start with 10 + i: every request diverges right after the system prompt
        ops = [("allocate", i, system + [10 + i] * n) for i, n in enumerate(own)]
        want = {i: {"reused": 0 if i == 0 else k * P} for i in range(len(own))}
        return {"num_blocks": sum(-(-(k * P + n) // P) for n in own), "block_size": P,
                "ops": ops + [("free", i) for i in range(len(own))], "want": want}

    ctx.forall(requests(), replay, max_examples=10)
    ctx.case(LARGE, replay)


@CHECKS.add("the prompt's last token is always computed: at most len - 1 tokens are reused",
            uses="PrefixCache.allocate")
def last_token_is_computed(ctx):
    def program(P, n, extra):
        prompt = [(3 * i) % 5 for i in range(n * P + extra)]
        reused = (len(prompt) - 1) // P * P  # an exact multiple of P: the last block is computed again
        return {"num_blocks": 3 * (n + 1), "block_size": P, "ops": [
            ("allocate", 0, prompt), ("allocate", 1, prompt), ("free", 0), ("free", 1), ("allocate", 2, prompt)],
            "want": {0: {"reused": 0}, 1: {"reused": reused}, 4: {"reused": reused}}}

    ctx.case(program(4, 2, 0), replay)  # 8 tokens, 2 blocks, both cached: 4 reused, not 8
    ctx.case(program(1, 5, 0), replay)  # block size 1: every token but the last, 4
    ctx.forall(st.builds(program, st.integers(1, 4), st.integers(1, 4), st.integers(0, 3)).filter(
        lambda ex: ex["ops"][0][2]), replay, max_examples=12)


@CHECKS.add("eviction takes the least recently released cached block, a freed sequence's tail first",
            uses="PrefixCache.free")
def eviction_order(ctx):
    ctx.case(EVICTION, replay)
    ctx.case(REHIT, replay)
    ctx.forall(programs(blocks=(3, 7), block_sizes=(1, 2), max_ops=16, vocab=2), replay, max_examples=15)


@CHECKS.add("decode tokens fill blocks that are hashed and cached (the older block keeps a hash)",
            uses="PrefixCache.append_token")
def decode_tokens_join_the_cache(ctx):
    ctx.case(DECODE, replay)
    ctx.forall(programs(kinds=("allocate", "append", "append", "append", "free"), block_sizes=(1, 3)), replay,
               max_examples=12)


@CHECKS.add("random programs of allocate, append_token and free match the reference", uses="PrefixCache.allocate")
def random_programs(ctx):
    ctx.forall(programs(), replay, max_examples=30)


@CHECKS.add("under memory pressure: OutOfBlocksError changes nothing, eviction never takes a held block",
            uses="PrefixCache.allocate")
def memory_pressure(ctx):
    ctx.case(SMALLEST, replay)
    ctx.forall(programs(blocks=(1, 5), block_sizes=(1, 3), max_ops=16), replay, max_examples=25)


# The smallest cache, PrefixCache(1, 1): one block of one token.
SMALLEST = {"num_blocks": 1, "block_size": 1, "ops": [
    ("allocate", 0, [0]), ("allocate", 1, [0, 1]),  # 0 holds the one block; 1 cannot get two: OutOfBlocksError
    ("append", 0, 1),  # the block is full, no other: OutOfBlocksError
    ("free", 0), ("allocate", 1, [0, 1]),  # hits [0] but needs one more block: none can be had
    ("allocate", 1, [0]), ("free", 1)]}  # the last token is computed: [0] evicted and taken again, 0 reused


@CHECKS.add("bad input raises ValueError naming the argument, and changes nothing", uses="PrefixCache")
def rejects_bad_input(ctx):
    def body(c, ex):
        api, bad = c.t, ex["bad"]
        cases = [(f"PrefixCache({bad!r}, 4)", api.PrefixCache, (bad, 4), ("num_blocks",)),
                 (f"PrefixCache(4, {bad!r})", api.PrefixCache, (4, bad), ("block_size",)),
                 (f"block_hashes([1, 2, 3], {bad!r})", api.block_hashes, ([1, 2, 3], bad), ("block_size",))]
        cache = api.PrefixCache(8, 4)
        if not (isinstance(api.OutOfBlocksError, type) and issubclass(api.OutOfBlocksError, RuntimeError)):
            c.fail("OutOfBlocksError should be a subclass of RuntimeError", ex, ("not a RuntimeError",))
        cache.allocate(0, [1, 2, 3, 4, 5])
        cases += [("allocate(0, [6]) while sequence 0 is in the cache", cache.allocate, (0, [6]), ("seq_id",)),
                  ("allocate(1, []) (an empty prompt)", cache.allocate, (1, []), ("token_ids",)),
                  ("append_token(7, 1) of a sequence never allocated", cache.append_token, (7, 1), ("seq_id",)),
                  ("free(7) of a sequence never allocated", cache.free, (7,), ("seq_id",)),
                  ("block_table(7) of a sequence never allocated", cache.block_table, (7,), ("seq_id",))]
        for what, fn, args, names in cases:
            expect_value_error(c, fn, *args, what=what, names=names, example=ex)
        state = (len(cache.block_table(0)), cache.num_free_blocks, cache.num_cached_blocks)
        if state != (2, 6, 1):
            c.fail(f"after the refused calls (len(block_table(0)), num_free_blocks, num_cached_blocks) = {state}, "
                   "expected (2, 6, 1): a refused call must change nothing", ex, ("refused call changed", state))
        c.raises(ValueError, cache.block_table, 1, what="block_table(1) after the refused allocate(1, [])", example=ex)

    ctx.case({"bad": 0}, body)
    for bad in (2.5, "4", None):  # not an int at all
        ctx.case({"bad": bad}, body)
    ctx.forall(st.fixed_dictionaries({"bad": st.integers(-5, 0)}), body, max_examples=3)


# -- state and aliasing (support/protocol.py), compared with the reference, block ids relabelled -----------
def _cache(api, ex):
    cache = api.PrefixCache(ex["num_blocks"], ex["block_size"])
    cache.allocate(0, ex["prompt"])
    return cache


def _state(cache, seqs) -> dict:
    return {**{f"block_table({s})": cache.block_table(s) for s in seqs},
            "num_free_blocks": cache.num_free_blocks, "num_cached_blocks": cache.num_cached_blocks}


def _table_scribbled(api, ex):
    cache = _cache(api, ex)
    program = protocol.changed_by_caller(
        lambda a, e: cache.block_table(0),
        lambda a, e: {"allocate(1, the same prompt)": cache.allocate(1, ex["prompt"]), **_state(cache, (0, 1)),
                      "free(0), free(1)": (cache.free(0), cache.free(1)), **_state(cache, ())},
        after="allocate(1, the same prompt), free(0), free(1)")
    return protocol.relabel(program(api, ex))


def _table_kept(api, ex):
    cache = _cache(api, ex)
    program = protocol.kept(lambda a, e: cache.block_table(0),
                            lambda a, e: [cache.append_token(0, 0) for _ in range(ex["block_size"])],
                            held="block_table(0)", after=f"{ex['block_size']} append_token(0, 0) calls")
    return protocol.relabel(program(api, ex))


def _two_caches(api, ex):
    def step(a, e, cache, i, n):
        seq = n + 1
        return {f"allocate({seq}, ...)": cache.allocate(seq, ex["prompt"][:len(ex["prompt"]) - n] + [i]),
                **_state(cache, (seq,))}

    program = protocol.interleaved(lambda a, e, i: _cache(a, {**ex, "prompt": ex["prompt"] + [i]}), step, steps=3)
    names: dict = {}  # each cache hands out its own ids
    return {key: protocol.relabel(value, names=names.setdefault(key.split(",")[0], {}))
            for key, value in program(api, ex).items()}


@CHECKS.add("block_table returns the caller's copy; two caches never share their books", uses="PrefixCache.block_table")
def results_stay_the_callers(ctx):
    def body(c, ex):
        for what, program in (("block_table(0) overwritten by the caller, then a hit and free", _table_scribbled),
                              ("block_table(0) kept while sequence 0 decodes a block", _table_kept),
                              ("two caches driven in turn (allocate each)", _two_caches)):
            c.differential(ex, program, what)

    ctx.case({"num_blocks": 12, "block_size": 2, "prompt": [3, 1, 4, 1, 5, 9, 2]}, body)
