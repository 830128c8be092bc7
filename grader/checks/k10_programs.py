"""Programs for kata 10's checks: drawn operation sequences (allocate, append_token, free) replayed
on the learner's PrefixCache and on the reference side by side.

After every step the replay compares only what the SPEC makes observable: the reused-token count,
errors, each table's length, which (sequence, logical block) pairs share a physical block (a
partition, drawn as letters: same letter = same block), ``num_free_blocks`` and
``num_cached_blocks``. It never compares block ids. After an ``OutOfBlocksError`` it checks that
nothing changed. Failures carry id-free ``observed`` values, so diagnosis is stable.
"""
from __future__ import annotations

import random

from hypothesis import strategies as st

from grader.engine import Failure, GraderBug

SEQ_IDS = range(4)  # a small pool, so that ids are used again after free


# -- drawing programs -----------------------------------------------------------------------------
@st.composite
def programs(draw, blocks=(6, 16), block_sizes=(1, 4), max_ops=14, vocab=3, kinds=("allocate", "append", "free")):
    """An example dict whose ``ops`` are ("allocate", seq, tokens), ("append", seq, token), ("free", seq).

    Prompts start with one of two shared system prompts or with the tokens of an earlier sequence,
    then diverge; tokens come from a tiny vocabulary, so equal blocks after different prefixes occur.
    """
    P = draw(st.integers(*block_sizes))
    ex = {"num_blocks": draw(st.integers(*blocks)), "block_size": P}
    token = st.integers(0, vocab - 1)
    systems = [draw(st.lists(token, min_size=0, max_size=3 * P)) for _ in range(2)]
    ops, tokens, seen = [], {}, []  # tokens: live seq -> its tokens (as the reference would hold them)
    for _ in range(draw(st.integers(1, max_ops))):
        free_ids = [s for s in SEQ_IDS if s not in tokens]
        choices = [k for k in kinds if (k == "allocate" and free_ids) or (k != "allocate" and tokens)]
        if not choices:
            break
        kind = draw(st.sampled_from(choices))
        if kind == "allocate":
            start = draw(st.sampled_from(systems + seen)) if seen else draw(st.sampled_from(systems))
            prompt = list(start[:draw(st.integers(0, len(start)))] if draw(st.booleans()) else start)
            prompt += draw(st.lists(token, min_size=0 if prompt else 1, max_size=2 * P + 1))
            seq = draw(st.sampled_from(free_ids))
            ops.append(("allocate", seq, prompt))
            tokens[seq] = list(prompt)
            seen.append(list(prompt))
        elif kind == "append":
            seq, tok = draw(st.sampled_from(sorted(tokens))), draw(token)
            ops.append(("append", seq, tok))
            tokens[seq].append(tok)
            seen.append(list(tokens[seq]))
        else:
            seq = draw(st.sampled_from(sorted(tokens)))
            ops.append(("free", seq))
            del tokens[seq]
    ops += [("free", seq) for seq in sorted(tokens)]  # end with everything freed: what stays cached?
    ex["ops"] = ops
    return ex


def say(op, block_size: int) -> str:
    if op[0] == "allocate":
        toks = op[2]
        blocks = ["·".join(str(t) for t in toks[i:i + block_size]) for i in range(0, len(toks), block_size)]
        return f"allocate({op[1]}, [{' | '.join(blocks)}])"
    if op[0] == "append":
        return f"append_token({op[1]}, {op[2]})"
    return f"free({op[1]})"


def letters(tables: dict) -> dict:
    """Block ids replaced by letters in order of first appearance: equal partitions, equal letters."""
    names: dict = {}

    def name(block):
        if block not in names:
            n = len(names)
            names[block] = chr(ord("A") + n % 26) + (str(n // 26) if n >= 26 else "")
        return names[block]

    return {seq: [name(b) for b in table] for seq, table in tables.items()}


def picture(labels: dict) -> str:
    if not labels:
        return "    (no sequences)"
    return "\n".join(f"    seq {seq}: {' '.join(f'[{x}]' for x in table) or '(empty)'}" for seq, table in labels.items())


# -- the replay -------------------------------------------------------------------------------------
class Replay:
    """Runs ``ex["ops"]`` on the learner's cache and the reference's, comparing after each step.

    ``ex["want"]``, when given, pins hand-worked numbers: step -> {"reused", "free", "cached"};
    the reference must agree with them (else it is a grader bug), and so must the learner.
    """

    def __init__(self, ctx, ex):
        self.ctx, self.ex, self.P = ctx, ex, ex["block_size"]
        self.ref = ctx.ref.PrefixCache(ex["num_blocks"], ex["block_size"])
        self.mine = ctx.t.PrefixCache(ex["num_blocks"], ex["block_size"])
        self.live: list = []  # sequences in the order they were allocated
        self.skipped: set[int] = set()  # steps on a sequence whose allocate ran out of blocks
        self.step = 0

    # what the SPEC lets us see
    def tables(self, cache, learner: bool) -> dict:
        out = {}
        for seq in self.live:
            table = cache.block_table(seq)
            if learner:
                if not isinstance(table, list) or any(isinstance(b, bool) or not isinstance(b, int) for b in table):
                    self.fail(f"block_table({seq}) returned {table!r}; expected a list of int block ids",
                              ("table type", seq))
                bad = [b for b in table if not 0 <= b < self.ex["num_blocks"]]
                if bad:
                    self.fail(f"block_table({seq}) = {table} holds id(s) {bad} outside 0 … {self.ex['num_blocks'] - 1}",
                              ("id out of range", seq))
            out[seq] = list(table)
        return out

    def observe(self, cache, learner: bool = False) -> dict:
        labels = letters(self.tables(cache, learner))
        return {"lengths": {s: len(t) for s, t in labels.items()}, "sharing": labels,
                "num_cached_blocks": cache.num_cached_blocks, "num_free_blocks": cache.num_free_blocks}

    def fail(self, what: str, observed, expected_labels: dict | None = None):
        ops = self.ex["ops"]
        listing = "\n".join(f"    {'→' if i == self.step else ' '} {i:2d}  {say(op, self.P)}"
                            + ("   (skipped: its allocate ran out of blocks)" if i in self.skipped else "")
                            for i, op in enumerate(ops) if i <= self.step)
        if len(ops) > self.step + 1:
            listing += f"\n          … {len(ops) - self.step - 1} more step(s), not run"
        raise Failure(
            f"on input PrefixCache(num_blocks={self.ex['num_blocks']}, block_size={self.P}), the program "
            f"(→ marks the failing step; blocks of a prompt split by |):\n{listing}\n"
            f"  after step {self.step}: {what}\n{self.pictures(expected_labels)}",
            observed=("step", self.step) + tuple(observed))

    def pictures(self, expected_labels: dict | None) -> str:
        """Your block tables beside the expected ones where they differ; one line where they do not (the
        failure is then about something else, and two identical pictures would only hide it)."""
        if expected_labels is None:
            expected_labels = letters({s: self.ref.block_table(s) for s in self.live})
        try:
            labels = letters({s: list(self.mine.block_table(s)) for s in self.live})
        except Exception as exc:  # the tables themselves are broken; say so instead of crashing
            return f"  your block tables: block_table raised {type(exc).__name__}: {exc}"
        if labels == expected_labels:
            return "  (your block tables hold and share blocks as expected)"
        return (f"  your block tables (same letter = same physical block):\n{picture(labels)}\n"
                f"  expected (any block ids will do, only the sharing counts):\n{picture(expected_labels)}")

    def run(self) -> "Replay":
        for self.step, op in enumerate(self.ex["ops"]):
            self.do(op)
        return self

    def do(self, op) -> None:
        kind, seq = op[0], op[1]
        if kind != "allocate" and seq not in self.live:
            self.skipped.add(self.step)
            return None
        call = {"allocate": "allocate", "append": "append_token", "free": "free"}[kind]
        available = self.ref.num_free_blocks
        try:
            want = getattr(self.ref, call)(*op[1:])
        except self.ctx.ref.OutOfBlocksError:
            return self.out_of_blocks(op, call)
        except Exception as exc:
            raise GraderBug(f"the reference failed on step {self.step} ({say(op, self.P)}): {exc!r}") from exc
        try:
            got = getattr(self.mine, call)(*op[1:])
        except self.ctx.t.OutOfBlocksError as exc:
            self.fail(f"{say(op, self.P)} raised OutOfBlocksError({exc}), but {available} block(s) were free or "
                      "evictable, enough for it (blocks it hits need no new block)", ("out of blocks too early",))
        self.live_update(kind, seq)
        pinned = self.ex.get("want", {}).get(self.step, {})
        if "reused" in pinned and pinned["reused"] != want:
            raise GraderBug(f"step {self.step}: the reference reuses {want} tokens, the worked case says {pinned}")
        if kind == "allocate" and (isinstance(got, bool) or not isinstance(got, int) or got != want):
            self.fail(f"{say(op, self.P)} returned {got!r} reused tokens; expected {want}", ("reused", got))
        self.compare()

    def live_update(self, kind, seq) -> None:
        if kind == "allocate":
            self.live.append(seq)
        elif kind == "free":
            self.live.remove(seq)

    def compare(self) -> None:
        want, got = self.observe(self.ref), self.observe(self.mine, learner=True)
        pinned = self.ex.get("want", {}).get(self.step)
        if pinned:
            seen = {"free": want["num_free_blocks"], "cached": want["num_cached_blocks"]}
            if any(seen[k] != v for k, v in pinned.items() if k in seen):
                raise GraderBug(f"step {self.step}: the reference gives {seen}, the worked case says {pinned}")
        for seq, n in want["lengths"].items():
            if got["lengths"][seq] != n:
                self.fail(f"sequence {seq} holds {got['lengths'][seq]} block(s); it has {n * self.P - self.P + 1} … "
                          f"{n * self.P} tokens, so it should hold {n}", ("blocks held", seq, got["lengths"][seq]))
        if got["sharing"] != want["sharing"]:
            self.fail(self.sharing_problem(got["sharing"], want["sharing"]), ("sharing", got["sharing"]),
                      want["sharing"])
        for name, why in (("num_cached_blocks", "blocks holding a hash, referenced or not"),
                          ("num_free_blocks", "free blocks plus cached blocks no sequence references")):
            if got[name] != want[name]:
                self.fail(f"{name} is {got[name]!r}, expected {want[name]} ({why})", (name, got[name]))

    @staticmethod
    def sharing_problem(got: dict, want: dict) -> str:
        def holders(labels):
            groups: dict = {}
            for seq, table in labels.items():
                for i, x in enumerate(table):
                    groups.setdefault(x, []).append((seq, i))
            return {pos: tuple(g) for g in groups.values() for pos in g}

        mine, theirs = holders(got), holders(want)
        for pos in theirs:
            if mine.get(pos) != theirs[pos]:
                return (f"logical block {pos[1]} of sequence {pos[0]} is held by {list(mine.get(pos, ()))} as "
                        f"(sequence, logical block); expected {list(theirs[pos])}")
        return "the block tables share blocks differently from what is expected"

    def out_of_blocks(self, op, call) -> None:
        before = self.observe(self.mine, learner=True)
        try:
            result = getattr(self.mine, call)(*op[1:])
        except self.ctx.t.OutOfBlocksError:
            pass
        else:
            expected = letters({s: self.ref.block_table(s) for s in self.live})  # without the refused sequence
            if op[0] == "allocate":
                self.live.append(op[1])
            self.fail(f"{say(op, self.P)} returned {result!r}, but it needs more blocks than can be had "
                      f"(free + evictable, not counting blocks this prompt hits): it must raise OutOfBlocksError",
                      ("no OutOfBlocksError",), expected)
        after = self.observe(self.mine, learner=True)
        for name in ("sharing", "num_cached_blocks", "num_free_blocks"):
            if before[name] != after[name]:
                self.fail(f"{say(op, self.P)} raised OutOfBlocksError but changed {name}: before {before[name]}, "
                          f"after {after[name]}. Count the blocks needed before you take or share any",
                          ("out of blocks changed", name, after[name]))
        if op[0] == "allocate":
            try:
                self.mine.block_table(op[1])
            except ValueError:
                return
            self.fail(f"allocate({op[1]}, ...) raised OutOfBlocksError but left sequence {op[1]} in the cache",
                      ("out of blocks kept the sequence",))
        self.compare()


def replay(c, ex) -> None:
    Replay(c, ex).run()


# -- a workload of many requests (the benchmark and the picture of kata 10) ------------------------
def prefix_workload(requests: int = 32, prefix: int = 512, suffix: tuple[int, int] = (32, 128),
                    seed: int = 0) -> list[list[int]]:
    """Prompts that share one ``prefix``-token system prompt, then diverge (own tokens, ``suffix`` long)."""
    rng = random.Random(seed)
    system = [rng.randrange(32000) for _ in range(prefix)]
    return [system + [rng.randrange(32000) for _ in range(rng.randint(*suffix))] for _ in range(requests)]
