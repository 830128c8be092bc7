"""Programs for kata 06's checks: drawn operation sequences (add, reserve + write, fork, free),
a plain-Python model of what a paged cache must hold, and the replay that runs a program on the
learner's cache next to the model, checking every invariant after every step.

The model keeps token chunks per layer and block *labels* that are never reused, so checks
compare structure (which positions share a block, counts, refcounts) and never block ids.
"""
from __future__ import annotations

import math
from collections import defaultdict

import torch
from hypothesis import strategies as st

from grader.engine import report
from grader.checks.support.common import DTYPES, SEEDS, randn
from grader.engine import Failure


# -- programs -----------------------------------------------------------------------------------
@st.composite
def programs(draw, kinds=("reserve", "fork", "free", "add"), blocks=(6, 12), max_ops=10, max_reserve=5,
             fork_first=False, block_sizes=(1, 4), reuse=False):
    """An example dict whose ``ops`` is a valid program: ("add", s), ("reserve", s, n),
    ("fork", parent, child), ("free", s). Seq ids are 0, 1, 2, … in order of creation; with
    ``reuse``, a new sequence (added or forked) often takes the id of one freed before."""
    ex = {"num_blocks": draw(st.integers(*blocks)), "block_size": draw(st.integers(*block_sizes)),
          "layers": draw(st.integers(2, 3)), "heads": draw(st.integers(1, 2)),
          "head_dim": draw(st.sampled_from([1, 2])), "dtype": draw(DTYPES)}
    ops, live, freed = [("add", 0)], [0], []
    if fork_first:  # a partly filled prompt, then a fork: the copy-on-write situation
        ops += [("reserve", 0, draw(st.integers(1, 7))), ("fork", 0, 1)]
        live.append(1)
    for _ in range(draw(st.integers(0, max_ops))):
        if not live and "add" not in kinds:
            break
        kind = draw(st.sampled_from([k for k in kinds if live or k == "add"]))
        if kind == "add" or kind == "fork":
            child = max((o[-1] for o in ops if o[0] in ("add", "fork")), default=-1) + 1
            if reuse and freed and draw(st.booleans()):
                child = freed.pop(draw(st.integers(0, len(freed) - 1)))
            ops.append(("add", child) if kind == "add" else ("fork", draw(st.sampled_from(live)), child))
            live.append(child)
        elif kind == "reserve":
            ops.append(("reserve", draw(st.sampled_from(live)), draw(st.integers(1, max_reserve))))
        else:
            seq = draw(st.sampled_from(live))
            ops.append(("free", seq))
            live.remove(seq)
            freed.append(seq)
    ex["ops"] = ops
    ex["seed"] = draw(SEEDS)
    return ex


def _say(op) -> str:
    if op[0] == "reserve":
        return f"slots = reserve({op[1]}, {op[2]}); write(layer, slots, k, v) for every layer"
    if op[0] == "fork":
        return f"fork({op[1]}, {op[2]})"
    if op[0] == "add":
        return f"add_sequence({op[1]})"
    return op[1] if op[0] == "then" else f"free({op[1]})"


def new_kv(ex, step, layer, n, device):
    """Keys and values (H, n, D) of one write; with ``ex["strided"]``, views of (n, H, D) tensors, as a
    projection's ``.transpose`` makes them."""
    seed, H, D = ex["seed"] + 1000 * step + 2 * layer, ex["heads"], ex["head_dim"]
    if ex.get("strided"):
        return tuple(randn(seed + i, n, H, D, dtype=ex["dtype"], device=device).transpose(0, 1) for i in (0, 1))
    return tuple(randn(seed + i, H, n, D, dtype=ex["dtype"], device=device) for i in (0, 1))


# -- the model ----------------------------------------------------------------------------------
class Model:
    """A correct paged cache in plain Python: block labels stand for blocks, never reused."""

    def __init__(self, ex):
        self.ex, self.P = ex, ex["block_size"]
        self.labels: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}
        self.kv: dict[int, list[list[tuple]]] = {}  # seq -> per layer: list of (k, v) chunks
        self._next = 0

    def _fresh(self) -> int:
        self._next += 1
        return self._next - 1

    def refs(self, label) -> int:
        return sum(t.count(label) for t in self.labels.values())

    @property
    def num_free(self) -> int:
        return self.ex["num_blocks"] - len({b for t in self.labels.values() for b in t})

    def add(self, seq):
        self.labels[seq], self.lens[seq], self.kv[seq] = [], 0, [[] for _ in range(self.ex["layers"])]

    def needs(self, seq, n) -> tuple[int, bool]:
        """Blocks a reservation takes (fresh ones + a copy) and whether it copies."""
        table, length = self.labels[seq], self.lens[seq]
        copy = n > 0 and length % self.P > 0 and self.refs(table[-1]) > 1
        return math.ceil((length + n) / self.P) - len(table) + copy, copy

    def reserve(self, seq, n, chunks):
        needed, copy = self.needs(seq, n)
        if copy:
            self.labels[seq][-1] = self._fresh()
        self.labels[seq] += [self._fresh() for _ in range(needed - copy)]
        self.lens[seq] += n
        for layer, kv in enumerate(chunks):
            self.kv[seq][layer].append(kv)

    def fork(self, parent, child):
        self.labels[child], self.lens[child] = list(self.labels[parent]), self.lens[parent]
        self.kv[child] = [list(chunks) for chunks in self.kv[parent]]

    def free(self, seq):
        del self.labels[seq], self.lens[seq], self.kv[seq]

    def expected(self, seq, layer, device):
        chunks = self.kv[seq][layer]
        if not chunks:
            empty = torch.zeros(self.ex["heads"], 0, self.ex["head_dim"], dtype=self.ex["dtype"], device=device)
            return {"K": empty, "V": empty}
        return {"K": torch.cat([k for k, _ in chunks], 1), "V": torch.cat([v for _, v in chunks], 1)}  # (H, S, D)


def sharing(tables: dict) -> dict:
    """(seq, logical block) -> the other positions held in the same physical block."""
    holders = defaultdict(list)
    for seq, table in tables.items():
        for i, block in enumerate(table):
            holders[block].append((seq, i))
    return {pos: tuple(p for p in group if p != pos) for group in holders.values() for pos in group}


def _letters(tables: dict) -> dict:
    names: dict = {}
    return {s: [names.setdefault(b, chr(ord("A") + len(names) % 26)) for b in t] for s, t in tables.items()}


# -- replaying a program -------------------------------------------------------------------------
class Replay:
    """Runs ``ex["ops"]`` on the learner's cache and the model, checking invariants after each step."""

    def __init__(self, ctx, ex, final: str = "free every sequence still in the cache"):
        self.ctx, self.ex, self.api, self.final = ctx, ex, ctx.t, final
        self.cache = ctx.t.PagedKVCache(ex["num_blocks"], ex["block_size"], ex["layers"], ex["heads"],
                                        ex["head_dim"], dtype=ex["dtype"], device=ctx.device)
        self.model = Model(ex)
        self.step = 0

    def tables(self) -> dict:
        return {s: [int(b) for b in self.cache.block_table(s)] for s in self.model.labels}

    def fail(self, what: str, observed):
        ops = self.ex["ops"] + [("then", self.final)]
        listing = "\n".join(f"    {'→' if i == self.step else ' '} {i:2d}  {_say(op)}" for i, op in enumerate(ops)
                            if i <= self.step)
        if len(ops) > self.step + 1:
            listing += f"\n          … {len(ops) - self.step - 1} more step(s), not run"
        try:
            yours = report.block_table_picture(self.tables(), self.ex["block_size"])
        except Exception as exc:  # the tables themselves are broken; say so instead of crashing
            yours = f"    (block_table raised {type(exc).__name__}: {exc})"
        expected = report.block_table_picture(_letters(self.model.labels)) or "    (no sequences)"
        if not self.model.labels:
            yours = "    (no sequences)"
        raise Failure(
            f"on input {report.describe_input({k: v for k, v in self.ex.items() if k != 'ops'})}, the program "
            f"(→ marks the failing step):\n{listing}\n  after step {self.step}: {what}\n"
            f"  your block tables:\n{yours}\n  expected layout (same letter = same physical block; any ids will do):\n"
            f"{expected}", observed=("step", self.step) + observed)

    def run(self, check_every_step: bool = True) -> "Replay":
        for self.step, op in enumerate(self.ex["ops"]):
            getattr(self, "do_" + op[0])(*op[1:])
            if check_every_step:
                self.invariants()
        self.step = len(self.ex["ops"])
        return self

    def free_all(self) -> None:
        for seq in list(self.model.labels):
            self.cache.free(seq)
            self.model.free(seq)
        free = self.cache.allocator.num_free
        if free != self.ex["num_blocks"]:
            self.fail(f"every sequence was freed, yet allocator.num_free is {free!r}, not all "
                      f"{self.ex['num_blocks']} blocks: some block was never given back", ("leak", free))

    def do_add(self, seq):
        self.cache.add_sequence(seq)
        self.model.add(seq)

    def do_fork(self, parent, child):
        self.cache.fork(parent, child)
        self.model.fork(parent, child)

    def do_free(self, seq):
        self.cache.free(seq)
        self.model.free(seq)

    def do_reserve(self, seq, n):
        needed, _ = self.model.needs(seq, n)
        if needed > self.model.num_free:
            return self.out_of_blocks(seq, n, needed)
        before = self.model.lens[seq]
        try:
            slots = self.cache.reserve(seq, n)
        except self.api.OutOfBlocksError as exc:
            self.fail(f"reserve({seq}, {n}) raised OutOfBlocksError({exc}), but it needs only {needed} block(s) "
                      f"and {self.model.num_free} are free", ("out of blocks too early",))
        if not isinstance(slots, torch.Tensor) or tuple(slots.shape) != (n,) or slots.dtype != torch.long:
            self.fail(f"reserve({seq}, {n}) returned {report.describe(slots)}; expected a LongTensor (torch.int64) "
                      f"of {n} slots", ("slots type", report.describe(slots)))
        if n == 0:  # nothing to write; the invariants check that nothing changed
            return
        chunks = [new_kv(self.ex, self.step, layer, n, self.ctx.device) for layer in range(self.ex["layers"])]
        self.model.reserve(seq, n, chunks)
        table, P = [int(b) for b in self.cache.block_table(seq)], self.ex["block_size"]
        if len(table) != math.ceil((before + n) / P):
            self.fail(f"sequence {seq} holds {len(table)} block(s) for {before + n} token(s); with block size {P} "
                      f"that takes ceil({before + n} / {P}) = {math.ceil((before + n) / P)}",
                      ("blocks held", seq, len(table)))
        want = [table[p // P] * P + p % P for p in range(before, before + n)]
        bad = tuple(i for i, (g, w) in enumerate(zip(slots.tolist(), want)) if g != w)
        if bad:
            self.fail(f"reserve({seq}, {n}) returned slots {slots.tolist()} for positions {before}…{before + n - 1}; "
                      f"with your table {table} they should be table[pos // {P}] * {P} + pos % {P} = {want}",
                      ("slots", bad))
        for layer, (k, v) in enumerate(chunks):
            self.ctx.call(self.cache.write, layer, slots, k, v)

    def snapshot(self):
        gathered = {(s, layer): tuple(t.detach().clone() for t in self.cache.gather(s, layer))
                    for s in self.model.labels for layer in range(self.ex["layers"])}
        lens = {s: self.cache.seq_len(s) for s in self.model.labels}
        return self.tables(), lens, self.cache.allocator.num_free, gathered

    def out_of_blocks(self, seq, n, needed):
        tables, lens, free, gathered = self.snapshot()
        try:
            self.cache.reserve(seq, n)
        except self.api.OutOfBlocksError:
            pass
        else:
            self.fail(f"reserve({seq}, {n}) needs {needed} block(s) but only {free} are free: it must raise "
                      "OutOfBlocksError (never hand out a block that is not free, never return a sentinel)",
                      ("no OutOfBlocksError",))
        after = self.snapshot()
        for name, old, new in (("the block tables", tables, after[0]), ("seq_len", lens, after[1]),
                               ("allocator.num_free", free, after[2])):
            if old != new:
                self.fail(f"reserve({seq}, {n}) raised OutOfBlocksError but changed {name}: before {old}, after {new}. "
                          "Check that enough blocks are free before you allocate or copy anything",
                          ("out of blocks changed", name))
        for key, pair in gathered.items():
            if any(not torch.equal(a, b) for a, b in zip(pair, after[3][key])):
                self.fail(f"reserve({seq}, {n}) raised OutOfBlocksError but changed what gather{key} returns",
                          ("out of blocks changed", "gather"))

    def invariants(self):
        cache, model, P = self.cache, self.model, self.ex["block_size"]
        for seq, length in model.lens.items():
            got, table = cache.seq_len(seq), cache.block_table(seq)
            if isinstance(got, bool) or not isinstance(got, int):
                self.fail(f"seq_len({seq}) returned {report.describe(got)}; expected the int {length}",
                          ("seq_len type", report.describe(got)))
            if got != length:
                self.fail(f"seq_len({seq}) is {got!r}, expected {length}", ("seq_len", seq, got))
            if not isinstance(table, list) or any(isinstance(b, bool) or not isinstance(b, int) for b in table):
                self.fail(f"block_table({seq}) returned {report.describe(table)} of "
                          f"{sorted({type(b).__name__ for b in table}) if isinstance(table, (list, tuple)) else '?'}; "
                          "expected a list of int block ids", ("block_table type", report.describe(table)))
        tables = self.tables()
        for seq, table in tables.items():
            want = math.ceil(model.lens[seq] / P)
            if len(table) != want:
                self.fail(f"sequence {seq} holds {len(table)} block(s) for {model.lens[seq]} token(s); with block "
                          f"size {P} it should hold ceil({model.lens[seq]} / {P}) = {want}",
                          ("blocks held", seq, len(table)))
            if any(not 0 <= b < self.ex["num_blocks"] for b in table):
                self.fail(f"block_table({seq}) = {table} holds an id outside 0 … {self.ex['num_blocks'] - 1}",
                          ("block id out of range", seq))
        holders = defaultdict(list)
        for seq, table in tables.items():
            for i, block in enumerate(table):
                holders[block].append((seq, i))
        for block, where in holders.items():
            got = cache.allocator.refcount(block)
            if got != len(where):
                self.fail(f"allocator.refcount({block}) is {got!r}, but {len(where)} table entr"
                          f"{'y holds' if len(where) == 1 else 'ies hold'} it: {where} as (sequence, logical block)",
                          ("refcount", where[0], len(where), got))
        free, want = cache.allocator.num_free, self.ex["num_blocks"] - len(holders)
        if free != want:
            self.fail(f"allocator.num_free is {free!r}; {len(holders)} distinct block(s) are in the tables, "
                      f"so {self.ex['num_blocks']} - {len(holders)} = {want} should be free", ("num_free", want, free))
        got_sharing, want_sharing = sharing(tables), sharing(model.labels)
        for pos, want in want_sharing.items():
            if got_sharing[pos] != want:
                why = ("a full block is never copied, and fork shares every block" if set(want) - set(got_sharing[pos])
                       else "a shared, partly filled block must be copied before it is written; a new block is fresh")
                self.fail(f"logical block {pos[1]} of sequence {pos[0]} shares its physical block with "
                          f"{list(got_sharing[pos])} (sequence, logical block); expected {list(want)}: {why}",
                          ("sharing", pos, got_sharing[pos], want))
        for seq in model.labels:
            for layer in range(self.ex["layers"]):
                got = cache.gather(seq, layer)
                problem = report.compare(model.expected(seq, layer, self.ctx.device), kv_dict(got))
                if problem:
                    self.fail(f"gather({seq}, {layer}) differs from the tokens written to sequence {seq}:\n  {problem}",
                              ("gather", seq, layer, problem.split(":")[0]))


def kv_dict(pair):
    return dict(zip("KV", pair)) if isinstance(pair, (tuple, list)) and len(pair) == 2 else pair


def replay(c, ex):
    Replay(c, ex).run().free_all()
