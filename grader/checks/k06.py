"""Hidden checks of kata 06 — paged block tables with copy-on-write.

The learner's cache replays a program of operations (add, reserve + write, fork, free) next to a
plain-Python model: each sequence a list of tokens per layer and a list of block *labels* that
says which logical blocks must share storage. After every step the checks compare structure —
which positions share a block, how many blocks are held, reference counts, free blocks — and the
gathered keys and values. They never compare block ids: an allocator may hand out any free block.
Failures carry id-free ``observed`` values (step, invariant, counts), so diagnosis is stable.
"""
from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from grader.engine import report
from grader.checks import k06_aliasing as aliasing
from grader.checks.support import devices, envelope
from grader.checks.support.common import DTYPES, SEEDS, attention, expect_value_error, randn, value_error_names
from grader.checks.k06_programs import Replay, kv_dict, new_kv, programs, replay
from grader.engine import Checks

CHECKS = Checks("06")


# -- pinned programs (worked by hand; block labels in the comments) -----------------------------
SMALL = {"layers": 2, "heads": 2, "head_dim": 2, "dtype": torch.float64}
COW_PROGRAM = {"num_blocks": 8, "block_size": 4, **SMALL, "ops": [
    ("add", 0), ("reserve", 0, 6),  # 0: [A B(2/4)]
    ("fork", 0, 1), ("reserve", 1, 1),  # 1: [A C(3/4)], B copied into C; 0 keeps B alone
    ("reserve", 0, 2),  # 0: [A B(4/4)], written in place: nobody else holds B now
    ("fork", 0, 2), ("reserve", 2, 3),  # 2: [A B D(3/4)], the full B stays shared
    ("reserve", 0, 1), ("free", 1), ("reserve", 2, 2)], "seed": 6}  # 0: [A B E], 2: [A B D F]
OOB_PROGRAM = {"num_blocks": 4, "block_size": 2, **SMALL, "ops": [
    ("add", 0), ("reserve", 0, 3), ("fork", 0, 1),  # 0, 1: [A B(1/2)]; 2 blocks free
    ("reserve", 1, 5),  # copy B + 2 new blocks = 3 > 2 free: OutOfBlocksError, nothing changes
    ("reserve", 1, 3),  # copy B + 1 new block = 2: fits exactly
    ("reserve", 0, 1), ("free", 0),  # 0 fills B in place, as 1 no longer holds it; freeing 0 frees B only
    ("reserve", 1, 3)], "seed": 7}  # 1: [A C D] + 2 new blocks > 1 free: OutOfBlocksError


# -- the checks -------------------------------------------------------------------------------------
@CHECKS.add("BlockAllocator counts references, frees at zero and refuses a double free", uses="BlockAllocator")
def allocator_refcounts(ctx):
    def body(c, ex):
        api, n = c.t, ex["num_blocks"]
        if not (isinstance(api.OutOfBlocksError, type) and issubclass(api.OutOfBlocksError, RuntimeError)):
            c.fail("OutOfBlocksError should be a subclass of RuntimeError", ex, ("not a RuntimeError",))
        alloc = api.BlockAllocator(n)
        seen = []
        for i in range(n):
            if alloc.num_free != n - i:
                c.fail(f"after {i} allocate() call(s), num_free is {alloc.num_free!r}, expected {n - i}", ex,
                       ("num_free", i))
            block = alloc.allocate()
            if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < n or block in seen:
                c.fail(f"allocate() call {i + 1} returned {block!r}; expected a free block id in 0 … {n - 1} "
                       f"not handed out yet (ids so far: {seen})", ex, ("bad id", i))
            if alloc.refcount(block) != 1:
                c.fail(f"refcount of a block just allocated is {alloc.refcount(block)!r}, expected 1", ex,
                       ("refcount new",))
            seen.append(block)
        try:
            got = alloc.allocate()
        except api.OutOfBlocksError:
            pass
        else:
            c.fail(f"with all {n} blocks in use, allocate() returned {got!r}; it must raise OutOfBlocksError "
                   "(a -1 or None would be used as a block id by the caller)", ex, ("no OutOfBlocksError",))
        a, b = seen[ex["pick"] % n], seen[(ex["pick"] + 1) % n]
        steps = [("incref", a, 2, 0), ("decref", a, 1, 0), ("decref", a, 0, 1)]
        if b != a:
            steps += [("decref", b, 0, 2)]
        for i, (op, block, refs, free) in enumerate(steps):
            getattr(alloc, op)(block)
            got = (alloc.refcount(block) if refs else 0, alloc.num_free)  # a free block's count: not asked
            if got != (refs, free):
                c.fail(f"after {', '.join(f'{o}({x})' for o, x, _, _ in steps[:i + 1])} on a full allocator: "
                       f"(refcount({block}), num_free) = {got}; expected {(refs, free)}", ex, ("counts", i) + got)
        for block, what in ((a, f"decref({a}) of a block already freed (a double free)"),
                            (n, f"decref({n}) of a block id past the end"), (-1, "decref(-1)")):
            expect_value_error(c, alloc.decref, block, what=what, names=("block",), example=ex)
        if alloc.num_free != len(steps) - 2:
            c.fail(f"after the refused decref calls num_free is {alloc.num_free!r}, expected {len(steps) - 2}: "
                   "a refused call must change nothing", ex, ("refused call changed", alloc.num_free))
        again = alloc.allocate()
        if again not in (a, b):
            c.fail(f"allocate() after freeing blocks {sorted({a, b})} returned {again!r}, which is still in use",
                   ex, ("reused a held block",))

    ctx.forall(st.fixed_dictionaries({"num_blocks": st.integers(1, 6), "pick": st.integers(0, 5), "seed": SEEDS}),
               body, max_examples=6)


@CHECKS.add("reserve, write and gather: slots, block counts and contents (no fork yet)", uses="PagedKVCache.reserve")
def reserve_write_gather(ctx):
    ctx.forall(programs(kinds=("reserve", "add", "free"), blocks=(12, 16)), replay, max_examples=12)


# Past the drawn sizes: 16 heads, blocks of 16, a 300-token prompt forked (its last block copied) and grown.
LARGE = {"num_blocks": 48, "block_size": 16, "heads": 16, "head_dim": 8, "seed": 16, "ops": [
    ("add", 0), ("reserve", 0, 300), ("fork", 0, 1), ("reserve", 1, 20), ("reserve", 0, 5),
    ("add", 2), ("reserve", 2, 100), ("free", 1), ("reserve", 2, 150)]}


@CHECKS.add("random programs of add, reserve + write, fork and free keep every invariant", uses="PagedKVCache.fork")
def random_programs(ctx):
    # the copy-on-write program once large, once in bfloat16 and float16 pages, once with transposed k, v views
    envelope.run(ctx, COW_PROGRAM, ("large", "half", "strided"), replay, large=LARGE)
    ctx.forall(programs(max_ops=12), replay, max_examples=25)


@CHECKS.add("fork shares every block; only a shared, partly filled block is copied, in every layer",
            uses="PagedKVCache.fork")
def copy_on_write(ctx):
    ctx.case(COW_PROGRAM, replay)
    ctx.forall(programs(kinds=("reserve", "reserve", "fork", "free"), blocks=(16, 24), max_ops=6,
                        fork_first=True, block_sizes=(2, 4)), replay, max_examples=15)


@CHECKS.add("out of blocks: reserve raises OutOfBlocksError and changes nothing", uses="PagedKVCache.reserve")
def out_of_blocks(ctx):
    ctx.case(OOB_PROGRAM, replay)
    ctx.forall(programs(blocks=(2, 5), max_ops=8, max_reserve=8), replay, max_examples=15)


@CHECKS.add("attention over the pages, read through the block table, equals attention over a contiguous cache",
            uses="PagedKVCache.gather")
def attention_over_pages(ctx):
    def body(c, ex):
        r = Replay(c, ex, final="attention of 2 new queries over every sequence, each layer").run(False)
        cache, N, P, H, D = r.cache, ex["num_blocks"], ex["block_size"], ex["heads"], ex["head_dim"]
        pages = {"k_pages": cache.k_pages, "v_pages": cache.v_pages}
        for name, per_layer in pages.items():
            shapes = [tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__ for p in per_layer]
            if shapes != [(N, H, P, D)] * ex["layers"]:
                r.fail(f"{name} should be {ex['layers']} tensors (num_blocks, n_kv_heads, block_size, head_dim) = "
                       f"{(N, H, P, D)}, one per layer; got {shapes}", ("pages shape", name, tuple(shapes)))
        for seq, length in r.model.lens.items():
            if length == 0:  # nothing to attend to
                continue
            table = torch.tensor([int(b) for b in cache.block_table(seq)], dtype=torch.long, device=c.device)
            for layer in range(ex["layers"]):
                q = randn(ex["seed"] + 99 + layer, H, 2, D, dtype=ex["dtype"], device=c.device)
                want = r.model.expected(seq, layer, c.device)
                # what a paged-attention kernel does: read each block of the table from the pages
                K = cache.k_pages[layer][table].transpose(0, 1).reshape(H, -1, D)[:, :length]  # (H, S, D)
                V = cache.v_pages[layer][table].transpose(0, 1).reshape(H, -1, D)[:, :length]  # (H, S, D)
                got = {"through the block table": attention(q, K, V),
                       "over gather()": attention(q, *cache.gather(seq, layer))}
                for via, out in got.items():
                    problem = report.compare(attention(q, want["K"], want["V"]), out)
                    if problem:
                        r.fail(f"attention of sequence {seq}, layer {layer}, {via}, differs from attention over the "
                               f"contiguous keys and values written:\n  {problem}", ("attention", via, seq, layer))

    ctx.forall(programs(kinds=("reserve", "reserve", "fork", "add"), blocks=(40, 40), max_ops=8, fork_first=True),
               body, max_examples=10)


@st.composite
def prefix_runs(draw):
    return {"block_size": draw(st.integers(1, 4)), "prompt": draw(st.integers(1, 9)),
            "own": draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)), "decode": draw(st.booleans()),
            "layers": 2, "heads": draw(st.integers(1, 2)), "head_dim": 2, "dtype": draw(DTYPES), "seed": draw(SEEDS)}


def _prefix_program(ex):
    """Sequence 0 holds the system prompt; request i (1 … n) forks it and adds its own tokens."""
    own, bs, P = ex["own"], ex["block_size"], ex["prompt"]
    ops = [("add", 0), ("reserve", 0, P)] + [("fork", 0, i) for i in range(1, len(own) + 1)]
    if ex["decode"]:  # one token per request per step, round robin, as a decode loop would
        ops += [("reserve", i, 1) for t in range(max(own)) for i, s in enumerate(own, 1) if t < s]
    else:
        ops += [("reserve", i, s) for i, s in enumerate(own, 1)]
    alone = math.ceil(P / bs) + sum(math.ceil((P + s) / bs) for s in own)
    return {"num_blocks": alone + 1, **ex, "ops": ops}


@CHECKS.add("requests forked from one system prompt use shared + own blocks", uses="PagedKVCache.fork")
def prefix_sharing(ctx):
    def body(c, ex):
        ex = _prefix_program(ex)
        r = Replay(c, ex, final="count the blocks in use").run()
        bs, P, own = ex["block_size"], ex["prompt"], ex["own"]
        shared, partial = P // bs, int(P % bs > 0)
        mine = [math.ceil((P + s) / bs) - shared for s in own]
        used = ex["num_blocks"] - r.cache.allocator.num_free
        if used != shared + partial + sum(mine):
            r.fail(f"{used} block(s) are in use; expected {shared} full prompt block(s) shared by everyone + "
                   f"{partial} partly filled prompt block kept by sequence 0 + own blocks {mine} = "
                   f"{shared + partial + sum(mine)} (without sharing it would be {ex['num_blocks'] - 1})",
                   ("blocks in use", used))
        prompt_blocks = r.tables()[0][:shared]
        for seq in range(1, len(own) + 1):
            if r.tables()[seq][:shared] != prompt_blocks:
                r.fail(f"request {seq} does not point its first {shared} block(s) at the prompt's blocks "
                       f"{prompt_blocks}", ("prompt not shared", seq))
        r.free_all()

    # worked by hand: block size 4, a 10-token prompt (2 full blocks + 1 partly filled), requests of
    # 5, 2 and 7 own tokens need 2, 1 and 3 own blocks: 2 + 1 + 6 = 9 blocks in use, against 15 unshared.
    ctx.case({"block_size": 4, "prompt": 10, "own": [5, 2, 7], "decode": False, **SMALL, "seed": 10}, body)
    ctx.forall(prefix_runs(), body, max_examples=8)


@CHECKS.add("PagedKVCache rejects bad input with a ValueError naming the argument", uses="PagedKVCache.add_sequence")
def paged_rejects_bad_input(ctx):
    def body(c, ex):
        L, H, D = ex["layers"], ex["heads"], ex["head_dim"]
        cache = c.t.PagedKVCache(8, 2, L, H, D, dtype=ex["dtype"], device=c.device)
        cache.add_sequence(0)
        cache.add_sequence(1)
        slots = cache.reserve(0, 3)
        k, v = new_kv(ex, 0, 0, 3, c.device)
        cache.write(0, slots, k, v)
        cases = [
            ("add_sequence(0) when sequence 0 is already in the cache", cache.add_sequence, (0,), ("seq_id",)),
            ("reserve(5, 1) of a sequence never added", cache.reserve, (5, 1), ("seq_id",)),
            ("reserve(0, -1)", cache.reserve, (0, -1), ("n_tokens",)),
            ("fork(5, 6) from a sequence never added", cache.fork, (5, 6), ("parent_id",)),
            ("fork(0, 1) into a sequence already in the cache", cache.fork, (0, 1), ("child_id",)),
            ("free(5) of a sequence never added", cache.free, (5,), ("seq_id",)),
            ("gather(5, 0) of a sequence never added", cache.gather, (5, 0), ("seq_id",)),
            (f"gather(0, {L}) of a layer past the last", cache.gather, (0, L), ("layer",)),
            ("block_table(5) of a sequence never added", cache.block_table, (5,), ("seq_id",)),
            ("seq_len(5) of a sequence never added", cache.seq_len, (5,), ("seq_id",)),
            (f"write({L}, ...) to a layer past the last", cache.write, (L, slots, k, v), ("layer",)),
            ("write with k holding 2 tokens for 3 slots", cache.write, (0, slots, k[:, :2], v), ("k", "slots")),
            ("write with v of another head width than k", cache.write, (0, slots, k, torch.cat([v, v], -1)), ("v",)),
            ("write to slot 16 of a cache of 8 blocks of 2", cache.write,
             (0, torch.tensor([0, 1, 16], device=c.device), k, v), ("slots",)),
            ("write with the slots as a 2-D tensor (3, 1)", cache.write, (0, slots.view(3, 1), k, v), ("slots",)),
            ("write with the slots as a float tensor", cache.write, (0, slots.double(), k, v), ("slots",)),
            ("write with k of one head more", cache.write, (0, slots, torch.cat([k, k[:1]]), v), ("k",)),
            ("write with k as a nested list", cache.write, (0, slots, k.tolist(), v), ("k",)),
            ("write with v of one token fewer", cache.write, (0, slots, k, v[:, :2]), ("v",)),
            ("gather(0, 0.0), a float layer", cache.gather, (0, 0.0), ("layer",)),
            ("reserve(0, '1'), a str n_tokens", cache.reserve, (0, "1"), ("n_tokens",)),
        ]
        for what, fn, args, names in cases:
            expect_value_error(c, fn, *args, what=what, names=names, example=ex)
        state = (cache.seq_len(0), cache.seq_len(1), cache.allocator.num_free)
        if state != (3, 0, 6):
            c.fail(f"after the refused calls, (seq_len(0), seq_len(1), num_free) = {state}, expected (3, 0, 6): "
                   "a refused call must change nothing", ex, ("refused call changed", state))
        gathered = kv_dict(cache.gather(0, 0))
        problem = report.compare({"K": k, "V": v}, gathered)
        if problem:  # observed: what came back, since every wrong gather fails here
            c.fail(f"after the refused calls, gather(0, 0) no longer returns the 3 tokens written:\n  {problem}",
                   ex, ("refused call changed", gathered))
        _other_dtype(c, ex, cache)

    ctx.forall(st.fixed_dictionaries({"layers": st.integers(1, 2), "heads": st.integers(1, 2),
                                      "head_dim": st.integers(1, 3), "dtype": DTYPES, "seed": SEEDS}),
               body, max_examples=3)
    ctx.case({"layers": 2, "heads": 2, "head_dim": 3, "dtype": torch.bfloat16, "seed": 4}, body)  # float32 into bf16


def _other_dtype(c, ex, cache) -> None:
    """write of keys and values in another dtype than the pages: converted to the pages' dtype, or a
    ValueError naming k or v (README: either is fine)."""
    other = torch.float64 if ex["dtype"] == torch.float32 else torch.float32
    slots = cache.reserve(1, 2)
    k, v = (t.to(other) for t in new_kv(ex, 1, 0, 2, c.device))
    what = f"write(0, slots, k, v) with k, v in {other} into {ex['dtype']} pages"
    try:
        c.call(cache.write, 0, slots, k, v)
    except ValueError as exc:
        if not value_error_names(exc, ("k", "v")):
            c.fail(f"{what} raised ValueError({str(exc)!r}); the message should name k or v", ex, ("unnamed", what))
        return
    except Exception as exc:
        c.fail(f"{what}: expected the keys and values converted to the pages' dtype, or a ValueError naming k or v; "
               f"your code raised {type(exc).__name__}: {exc}", ex, ("raised", type(exc).__name__, "other dtype"))
    got = kv_dict(cache.gather(1, 0))
    problem = report.compare({"K": k.to(ex["dtype"]), "V": v.to(ex["dtype"])}, got)
    if problem:
        c.fail(f"after {what} (convert them to the pages' dtype, or refuse them), gather(1, 0):\n  {problem}", ex,
               ("other dtype", problem.split(":")[0]))


# -- bad ids and sizes, reused ids, edge states --------------------------------------------------
def _refused(c, ex, what, names, fn, *args):
    """``fn(*args)`` must raise ValueError naming one of ``names``."""
    expect_value_error(c, fn, *args, what=what, names=names, example=ex)


def _empty_pool(c, ex, what, make, allocator_of):
    """``make()`` with ``num_blocks=0``: the README leaves it to the learner to refuse (a ValueError
    naming num_blocks) or to accept as an empty pool, where every allocation raises OutOfBlocksError."""
    try:
        made = c.call(make)
    except ValueError as exc:
        if not value_error_names(exc, ("num_blocks",)):
            c.fail(f"{what} raised ValueError({str(exc)!r}); the message should name num_blocks", ex,
                   ("unnamed", what))
        return
    alloc = allocator_of(made)
    if alloc.num_free != 0:
        c.fail(f"{what} was accepted as an empty pool, yet its num_free is {alloc.num_free!r}, expected 0", ex,
               ("empty pool", "num_free"))
    try:
        got = alloc.allocate()
    except c.t.OutOfBlocksError:
        return
    c.fail(f"{what} was accepted as an empty pool, yet allocate() returned {got!r}; with no block it must raise "
           "OutOfBlocksError (or refuse num_blocks=0 with a ValueError)", ex, ("empty pool", "allocated"))


@CHECKS.add("BlockAllocator refuses bad sizes and bad block ids (unknown, negative, not an int, free) everywhere",
            uses="BlockAllocator")
def allocator_rejects_bad_ids(ctx):
    def body(c, ex):
        n = ex["num_blocks"]
        for bad in (-1, 2.5, "2"):
            _refused(c, ex, f"BlockAllocator({bad!r})", ("num_blocks",), c.t.BlockAllocator, bad)
        _empty_pool(c, ex, "BlockAllocator(0)", lambda: c.t.BlockAllocator(0), lambda alloc: alloc)
        alloc = c.t.BlockAllocator(n)
        held = alloc.allocate()
        alloc.incref(held)  # two holders
        free = next(b for b in range(n) if b != held)  # only one block was handed out: any other is free
        for method in ("incref", "decref", "refcount"):
            for block, why in ((n, "an id past the end"), (-1, "a negative id"), (float(held), "a float id"),
                               (str(held), "a str id")):
                _refused(c, ex, f"{method}({block!r}), {why}, on an allocator of {n} blocks", ("block",),
                         getattr(alloc, method), block)
        for method in ("incref", "decref"):
            _refused(c, ex, f"{method}({free}) of a free block", ("block",), getattr(alloc, method), free)
        state = (alloc.refcount(held), alloc.num_free)
        if state != (2, n - 1) or not all(isinstance(x, int) and not isinstance(x, bool) for x in state):
            c.fail(f"after allocate(), incref({held}) and the refused calls, (refcount({held}), num_free) = "
                   f"{state!r}; expected the ints (2, {n - 1}): a refused call must change nothing", ex,
                   ("refused call changed", tuple(map(report.describe, state))))

    for n in (2, 5):
        ctx.case({"num_blocks": n, "seed": n}, body)


@CHECKS.add("PagedKVCache refuses sizes that are not positive ints, naming the argument", uses="PagedKVCache")
def paged_rejects_bad_sizes(ctx):
    def body(c, ex):
        good = {"num_blocks": 4, "block_size": 2, "n_layers": 2, "n_kv_heads": 1, "head_dim": 2}
        for name in good:
            for bad in (0, -1, 2.5, "2"):
                args = {**good, name: bad}
                what = f"PagedKVCache({', '.join(f'{k}={v!r}' for k, v in args.items())})"
                if name == "num_blocks" and bad == 0:  # an empty pool is the learner's choice
                    _empty_pool(c, ex, what, lambda: c.t.PagedKVCache(*args.values()), lambda cache: cache.allocator)
                    continue
                _refused(c, ex, what, (name,), c.t.PagedKVCache, *args.values())
        _smallest(c, ex)

    ctx.case({"seed": 0}, body)


def _smallest(c, ex) -> None:
    """The first valid value of every size: PagedKVCache(1, 1, 1, 1, 1) holds one token."""
    cache = c.t.PagedKVCache(1, 1, 1, 1, 1, dtype=torch.float64)
    cache.add_sequence(0)
    slots = cache.reserve(0, 1)
    k, v = new_kv({"heads": 1, "head_dim": 1, "dtype": torch.float64, "seed": 9}, 0, 0, 1, "cpu")
    cache.write(0, slots, k, v)
    problem = report.compare({"slots": [0], "K": k, "V": v}, {"slots": slots.tolist(), **kv_dict(cache.gather(0, 0))})
    if problem:
        c.fail(f"PagedKVCache(1, 1, 1, 1, 1) (every size at its smallest): reserve(0, 1), write, gather(0, 0):\n  "
               f"{problem}", ex, ("smallest", problem.split(":")[0]))
    c.raises(c.t.OutOfBlocksError, cache.reserve, 0, 1, example=ex,
             what="reserve(0, 1) a second time on PagedKVCache(1, 1, 1, 1, 1), whose one block is full")


@CHECKS.add("a freed sequence id is unknown everywhere; bad n_tokens, layers and slots are refused",
            uses="PagedKVCache.free")
def freed_ids_and_bad_arguments(ctx):
    def body(c, ex):
        L, H, D = ex["layers"], ex["heads"], ex["head_dim"]
        cache = c.t.PagedKVCache(8, 2, L, H, D, dtype=ex["dtype"], device=c.device)
        cache.add_sequence(0)
        cache.add_sequence(1)
        cache.reserve(1, 2)
        slots = cache.reserve(0, 3)
        k, v = new_kv(ex, 0, 0, 3, c.device)
        cache.write(0, slots, k, v)
        cache.free(1)
        for what, fn, args, names in [
            ("reserve(1, 1) of sequence 1, freed before", cache.reserve, (1, 1), ("seq_id",)),
            ("gather(1, 0) of a freed sequence", cache.gather, (1, 0), ("seq_id",)),
            ("seq_len(1) of a freed sequence", cache.seq_len, (1,), ("seq_id",)),
            ("block_table(1) of a freed sequence", cache.block_table, (1,), ("seq_id",)),
            ("free(1) a second time", cache.free, (1,), ("seq_id",)),
            ("fork(1, 2) from a freed sequence", cache.fork, (1, 2), ("parent_id",)),
            ("reserve(0, 1.5), half a token", cache.reserve, (0, 1.5), ("n_tokens",)),
            ("gather(0, -1)", cache.gather, (0, -1), ("layer",)),
            ("write(-1, slots, k, v)", cache.write, (-1, slots, k, v), ("layer",)),
            ("write to slot -1", cache.write, (0, torch.tensor([0, 1, -1], device=c.device), k, v), ("slots",)),
        ]:
            _refused(c, ex, what, names, fn, *args)
        table = cache.block_table(0)
        table.append(7)  # the caller's copy: the cache must not see this
        state = (cache.seq_len(0), len(cache.block_table(0)), cache.allocator.num_free)
        if state != (3, 2, 6):
            c.fail(f"after the refused calls and an append to the list block_table(0) returned, (seq_len(0), "
                   f"len(block_table(0)), num_free) = {state}, expected (3, 2, 6): a refused call changes nothing, "
                   "and block_table returns a copy", ex, ("changed", state))
        gathered = kv_dict(cache.gather(0, 0))
        problem = report.compare({"K": k, "V": v}, gathered)
        if problem:  # observed: what came back, since every wrong gather fails here
            c.fail(f"after the refused calls, gather(0, 0) no longer returns the 3 tokens written:\n  {problem}",
                   ex, ("refused call changed", gathered))

    ctx.case({"layers": 2, "heads": 2, "head_dim": 3, "dtype": torch.float32, "seed": 5}, body)


# Worked by hand with 2 blocks of 2 tokens (block labels in the comments).
EDGE_PROGRAM = {"num_blocks": 2, "block_size": 2, **SMALL, "ops": [
    ("add", 0), ("fork", 0, 1), ("reserve", 1, 0),  # forking an empty sequence; reserving 0 tokens
    ("reserve", 0, 3),  # 0: [A B(1/2)]: every block in use
    ("free", 1), ("add", 1),  # id 1 again: a new, empty sequence
    ("fork", 0, 2), ("reserve", 0, 0),  # with 0 free blocks a fork and an empty reserve still work
    ("reserve", 2, 1),  # B is shared and partly filled: its copy needs a block, none is free
    ("free", 0), ("reserve", 2, 1),  # 2 alone holds [A B] now: B filled in place, 0 blocks free
    ("reserve", 1, 1),  # 1 needs its first block: none free
    ("free", 2), ("fork", 1, 2), ("reserve", 2, 3),  # id 2 again, a fork of the empty 1: 2 = [C D]
    ("free", 1), ("add", 0), ("reserve", 0, 1)], "seed": 12}  # id 0 again, and no block for it


@CHECKS.add("ids reused after free and after fork; empty sequences and a pool with 0 free blocks",
            uses="PagedKVCache.add_sequence")
def reused_ids_and_edge_states(ctx):
    ctx.case(EDGE_PROGRAM, replay)
    ctx.forall(programs(blocks=(2, 8), max_ops=14, reuse=True), replay, max_examples=12)


def _device_scenario(s):
    api, where = s.ctx.t, "PagedKVCache(8, 4, 2, 2, 4, device=<the test device>)"
    cache = s.call(where, api.PagedKVCache, 8, 4, 2, 2, 4, dtype=torch.float64, device=s.device)
    s.expect_on([cache.k_pages, cache.v_pages], f"{where}.k_pages/.v_pages", "holds")
    cache.add_sequence(0)
    k, v = s.put(randn(1, 2, 6, 4)), s.put(randn(2, 2, 6, 4))  # (Hkv=2, T=6, D=4)
    steps = [(0, 6, "reserve(0, 6)"), ("fork", 0, 1), (1, 1, "reserve(1, 1) on a shared, partly filled block"),
             (0, 1, "reserve(0, 1)"), (0, 3, "reserve(0, 3) across a block boundary")]
    for step in steps:
        if step[0] == "fork":
            cache.fork(step[1], step[2])
            continue
        seq, n, what = step
        s.running(what)
        slots = s.ctx.call(cache.reserve, seq, n)  # on the CPU or the device: either indexes the pages
        for layer in (0, 1):
            s.call(f"write({layer}, slots, k, v) with the slots of {what}", cache.write, layer, slots,
                   k[:, :n], v[:, :n])
        s.call(f"gather({seq}, 1) after {what}", cache.gather, seq, 1)
    cache.free(1)
    s.call("gather(0, 0) after free(1)", cache.gather, 0, 0)


@CHECKS.add("the pages live on the cache's device= and gathers stay there; slots may be on either device",
            uses="PagedKVCache")
def keeps_the_device(ctx):
    ctx.case({"num_blocks": 8, "block_size": 4, "n_layers": 2, "n_kv_heads": 2, "head_dim": 4},
             lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))


@CHECKS.add("what reserve and block_table return is the caller's; two caches never share storage",
            uses="PagedKVCache.block_table")
def results_stay_the_callers(ctx):
    def body(c, ex):
        for what, program in aliasing.PROGRAMS.items():
            c.differential(ex, program, what)

    ctx.case({"heads": 2, "head_dim": 3, "dtype": torch.float64, "seed": 3}, body)
