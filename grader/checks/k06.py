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
from collections import defaultdict

import torch
from hypothesis import strategies as st

from grader import report
from grader.checks.common import DTYPES, SEEDS, randn, value_error_names
from grader.engine import Checks, Failure

CHECKS = Checks("06")


# -- programs -----------------------------------------------------------------------------------
@st.composite
def programs(draw, kinds=("reserve", "fork", "free", "add"), blocks=(6, 12), max_ops=10, max_reserve=5,
             fork_first=False, block_sizes=(1, 4)):
    """An example dict whose ``ops`` is a valid program: ("add", s), ("reserve", s, n),
    ("fork", parent, child), ("free", s). Seq ids are 0, 1, 2, … in order of creation."""
    ex = {"num_blocks": draw(st.integers(*blocks)), "block_size": draw(st.integers(*block_sizes)),
          "layers": draw(st.integers(2, 3)), "heads": draw(st.integers(1, 2)),
          "head_dim": draw(st.sampled_from([1, 2])), "dtype": draw(DTYPES)}
    ops, live = [("add", 0)], [0]
    if fork_first:  # a partly filled prompt, then a fork: the copy-on-write situation
        ops += [("reserve", 0, draw(st.integers(1, 7))), ("fork", 0, 1)]
        live.append(1)
    for _ in range(draw(st.integers(0, max_ops))):
        if not live and "add" not in kinds:
            break
        kind = draw(st.sampled_from([k for k in kinds if live or k == "add"]))
        if kind == "add" or kind == "fork":
            child = max((o[-1] for o in ops if o[0] in ("add", "fork")), default=-1) + 1
            ops.append(("add", child) if kind == "add" else ("fork", draw(st.sampled_from(live)), child))
            live.append(child)
        elif kind == "reserve":
            ops.append(("reserve", draw(st.sampled_from(live)), draw(st.integers(1, max_reserve))))
        else:
            seq = draw(st.sampled_from(live))
            ops.append(("free", seq))
            live.remove(seq)
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


def _new_kv(ex, step, layer, n, device):
    shape = (ex["heads"], n, ex["head_dim"])
    k = randn(ex["seed"] + 1000 * step + 2 * layer, *shape, dtype=ex["dtype"], device=device)
    v = randn(ex["seed"] + 1000 * step + 2 * layer + 1, *shape, dtype=ex["dtype"], device=device)
    return k, v


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
        copy = length % self.P > 0 and self.refs(table[-1]) > 1
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
        if not isinstance(slots, torch.Tensor) or tuple(slots.shape) != (n,) or slots.is_floating_point():
            self.fail(f"reserve({seq}, {n}) returned {report.describe(slots)}; expected a LongTensor of {n} slots",
                      ("slots type", report.describe(slots)))
        chunks = [_new_kv(self.ex, self.step, layer, n, self.ctx.device) for layer in range(self.ex["layers"])]
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
            got = cache.seq_len(seq)
            if got != length:
                self.fail(f"seq_len({seq}) is {got!r}, expected {length}", ("seq_len", seq, got))
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
                problem = report.compare(model.expected(seq, layer, self.ctx.device), _kv_dict(got))
                if problem:
                    self.fail(f"gather({seq}, {layer}) differs from the tokens written to sequence {seq}:\n  {problem}",
                              ("gather", seq, layer, problem.split(":")[0]))


def _kv_dict(pair):
    return dict(zip("KV", pair)) if isinstance(pair, (tuple, list)) and len(pair) == 2 else pair


def _replay(c, ex):
    Replay(c, ex).run().free_all()


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
            exc = c.raises(ValueError, alloc.decref, block, what=what, example=ex)
            if not value_error_names(exc, ("block",)):
                c.fail(f"{what} raised ValueError({str(exc)!r}); the message should name `block`", ex,
                       ("unnamed", what))
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
    ctx.forall(programs(kinds=("reserve", "add", "free"), blocks=(12, 16)), _replay, max_examples=12)


@CHECKS.add("random programs of add, reserve + write, fork and free keep every invariant", uses="PagedKVCache.fork")
def random_programs(ctx):
    ctx.forall(programs(max_ops=12), _replay, max_examples=25)


@CHECKS.add("fork shares every block; only a shared, partly filled block is copied, in every layer",
            uses="PagedKVCache.fork")
def copy_on_write(ctx):
    ctx.case(COW_PROGRAM, _replay)
    ctx.forall(programs(kinds=("reserve", "reserve", "fork", "free"), blocks=(16, 24), max_ops=6,
                        fork_first=True, block_sizes=(2, 4)), _replay, max_examples=15)


@CHECKS.add("out of blocks: reserve raises OutOfBlocksError and changes nothing", uses="PagedKVCache.reserve")
def out_of_blocks(ctx):
    ctx.case(OOB_PROGRAM, _replay)
    ctx.forall(programs(blocks=(2, 5), max_ops=8, max_reserve=8), _replay, max_examples=15)


def _attend(q, K, V):
    """Plain attention of queries (H, Tq, D) over keys and values (H, S, D)."""
    scores = q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (H, Tq, S)
    # softmax by hand: torch.softmax on tiny CPU tensors can cost milliseconds a call on a busy machine
    weights = (scores - scores.amax(-1, keepdim=True)).exp()
    return weights / weights.sum(-1, keepdim=True) @ V  # (H, Tq, D)


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
                got = {"through the block table": _attend(q, K, V),
                       "over gather()": _attend(q, *cache.gather(seq, layer))}
                for via, out in got.items():
                    problem = report.compare(_attend(q, want["K"], want["V"]), out)
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
        k, v = _new_kv(ex, 0, 0, 3, c.device)
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
        ]
        for what, fn, args, names in cases:
            exc = c.raises(ValueError, fn, *args, what=what, example=ex)
            if not value_error_names(exc, names):
                c.fail(f"{what} raised ValueError({str(exc)!r}); the message should name "
                       f"{' or '.join(names)}", ex, ("unnamed", what))
        state = (cache.seq_len(0), cache.seq_len(1), cache.allocator.num_free)
        if state != (3, 0, 6):
            c.fail(f"after the refused calls, (seq_len(0), seq_len(1), num_free) = {state}, expected (3, 0, 6): "
                   "a refused call must change nothing", ex, ("refused call changed", state))
        problem = report.compare({"K": k, "V": v}, _kv_dict(cache.gather(0, 0)))
        if problem:
            c.fail(f"after the refused calls, gather(0, 0) no longer returns the 3 tokens written:\n  {problem}",
                   ex, ("refused call changed", "gather"))

    ctx.forall(st.fixed_dictionaries({"layers": st.integers(1, 2), "heads": st.integers(1, 2),
                                      "head_dim": st.integers(1, 3), "dtype": DTYPES, "seed": SEEDS}),
               body, max_examples=3)
