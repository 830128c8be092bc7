"""Kata 14's checks of the swap half: programs of add / grow / fork / swap out / swap in / free on the
shared paged cache (``grader.paged.PagedKVCache``) and the learner's host pool, compared with the
reference after every operation. What is compared never names a block id: each sequence's length and
``gather`` of every layer, which sequences are swapped, and how many device and host blocks are free
(a leak or a double free shows there). An operation that runs out of blocks is recorded with the
error it raised, and the state after it must be the state before.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks.support import devices
from grader.checks.support.common import DTYPES, SEEDS, expect_value_error, randn
from grader.paged import OutOfBlocksError, PagedKVCache


# -- programs ------------------------------------------------------------------------------------
@st.composite
def swap_programs(draw, max_ops=12, blocks=(2, 8), host=(1, 6)):
    """Ops ("add", s, n), ("grow", s, n), ("fork", parent, child), ("out", s), ("in", s), ("free", s), valid
    if every earlier op succeeded (the replay skips what a failure made invalid)."""
    ex = {"num_blocks": draw(st.integers(*blocks)), "host_blocks": draw(st.integers(*host)),
          "block_size": draw(st.integers(1, 3)), "layers": draw(st.integers(1, 2)), "heads": draw(st.integers(1, 2)),
          "head_dim": draw(st.sampled_from([1, 2])), "dtype": draw(DTYPES), "seed": draw(SEEDS)}
    ops, live, out, fresh = [], [], [], 0
    for _ in range(draw(st.integers(1, max_ops))):
        kinds = ["add"] + (["grow", "fork", "out", "out", "free"] if live else []) + (["in", "in"] if out else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "add":
            ops.append(("add", fresh, draw(st.integers(0, 6))))
            live.append(fresh)
            fresh += 1
        elif kind == "fork":
            ops.append(("fork", draw(st.sampled_from(live)), fresh))
            live.append(fresh)
            fresh += 1
        elif kind == "grow":
            ops.append(("grow", draw(st.sampled_from(live)), draw(st.integers(1, 4))))
        elif kind == "in":
            seq = draw(st.sampled_from(out))
            ops.append(("in", seq))
            out.remove(seq)
            live.append(seq)
        else:
            seq = draw(st.sampled_from(live))
            ops.append((kind, seq))
            live.remove(seq)
            if kind == "out":
                out.append(seq)
    ex["ops"] = ops
    return ex


def say(op) -> str:
    return {"add": "add_sequence({1}); reserve({1}, {2}) and write every layer",
            "grow": "reserve({1}, {2}) and write every layer", "fork": "fork({1}, {2})",
            "out": "swap_out(cache, pool, {1})", "in": "swap_in(cache, pool, {1})", "free": "free({1})"}[op[0]].format(*op)


def _write(cache, ex, seq, n: int, step: int) -> None:
    slots = cache.reserve(seq, n)
    for layer in range(ex["layers"]):
        k, v = (randn(ex["seed"] + 100 * step + 2 * layer + i, ex["heads"], n, ex["head_dim"], dtype=ex["dtype"])
                for i in (0, 1))
        device = cache.k_pages[layer].device
        cache.write(layer, slots.to(device), k.to(device), v.to(device))


def _state(api, cache, pool, in_cache: set, ids: list) -> dict:
    return {"sequences": {str(s): {"length": cache.seq_len(s),
                                   "K and V of every layer": [devices.take(cache.gather(s, layer))
                                                              for layer in range(cache.n_layers)]}
                          for s in sorted(in_cache)},
            "swapped": [s for s in ids if api.is_swapped(pool, s)],
            "free device blocks": cache.allocator.num_free, "free host blocks": pool.num_free}


def _step(api, cache, pool, ex, op, n, in_cache: set, swapped: set) -> str | None:
    """Run one op when it is valid now; returns "skipped", or None when it ran; an out-of-blocks error raises."""
    kind, seq = op[0], op[1]
    if kind in ("grow", "fork", "out", "free") and seq not in in_cache or kind == "in" and seq not in swapped \
            or kind == "fork" and op[2] in in_cache | swapped:
        return "skipped"
    if kind == "add":
        cache.add_sequence(seq)
        in_cache.add(seq)
        _write(cache, ex, seq, op[2], n)
    elif kind == "grow":
        _write(cache, ex, seq, op[2], n)
    elif kind == "fork":
        cache.fork(seq, op[2])
        in_cache.add(op[2])
    elif kind == "free":
        cache.free(seq)
        in_cache.discard(seq)
    elif kind == "out":
        api.swap_out(cache, pool, seq)
        in_cache.discard(seq)
        swapped.add(seq)
    else:
        api.swap_in(cache, pool, seq)
        swapped.discard(seq)
        in_cache.add(seq)
    return None


def replay(api, ex, device="cpu"):
    """The program on a fresh cache and pool; the state after every op (and what it raised)."""
    cache = PagedKVCache(ex["num_blocks"], ex["block_size"], ex["layers"], ex["heads"], ex["head_dim"],
                         dtype=ex["dtype"], device=device)
    pool = api.HostBlockPool(ex["host_blocks"], ex["block_size"], ex["layers"], ex["heads"], ex["head_dim"],
                             dtype=ex["dtype"])
    ids = sorted({op[1] for op in ex["ops"]} | {op[2] for op in ex["ops"] if op[0] == "fork"})
    in_cache, swapped, seen = set(), set(), {}
    for n, op in enumerate(ex["ops"]):
        try:
            outcome = _step(api, cache, pool, ex, op, n, in_cache, swapped)
        except (OutOfBlocksError, api.OutOfHostBlocksError) as exc:
            outcome = f"raised {type(exc).__name__}"
        seen[f"{say(op)} (op {n})"] = {"outcome": outcome or "ran", **_state(api, cache, pool, in_cache, ids)}
    return seen


# -- pinned programs -------------------------------------------------------------------------------
GEOMETRY = {"block_size": 2, "layers": 2, "heads": 2, "head_dim": 2, "dtype": torch.float64, "seed": 7}
PINNED = {
    "the host pool one block short, then exactly big enough": dict(
        GEOMETRY, num_blocks=6, host_blocks=4, ops=[("add", 0, 5), ("add", 1, 3), ("out", 1), ("out", 0), ("in", 1),
                                                    ("out", 0), ("add", 2, 1), ("out", 2), ("out", 1), ("in", 0),
                                                    ("in", 2)]),
    "old block ids taken by another sequence before the swap-in": dict(
        GEOMETRY, num_blocks=4, host_blocks=4, ops=[("add", 0, 3), ("out", 0), ("add", 1, 4), ("in", 0), ("free", 1),
                                                    ("in", 0), ("grow", 0, 2)]),
    "a fork shares the prefix: the shared blocks stay, the host gets them too": dict(
        GEOMETRY, num_blocks=8, host_blocks=4, ops=[("add", 0, 3), ("fork", 0, 1), ("grow", 1, 2), ("out", 0),
                                                    ("grow", 1, 1), ("in", 0), ("grow", 0, 1), ("out", 1), ("free", 0),
                                                    ("in", 1)]),
    "an empty sequence, and the device one block short at swap-in": dict(
        GEOMETRY, num_blocks=3, host_blocks=2, ops=[("add", 0, 0), ("out", 0), ("in", 0), ("grow", 0, 3), ("out", 0),
                                                    ("add", 1, 5), ("in", 0), ("free", 1), ("in", 0)]),
}
LARGE = dict(GEOMETRY, heads=16, head_dim=4, block_size=16, num_blocks=40, host_blocks=20, layers=2,
             ops=[("add", 0, 260), ("fork", 0, 1), ("grow", 1, 20), ("out", 0), ("add", 2, 200), ("in", 0),
                  ("grow", 0, 3)])


def _body(c, ex):
    c.differential({**ex, "device": c.device.type}, lambda api, e: replay(api, e, e["device"]), "after each operation")


def device_scenario(s):
    """A paged cache on the session's device: a sequence swapped out and back (and a fork of it)."""
    ex = dict(GEOMETRY)
    cache = PagedKVCache(6, 2, 2, 2, 2, dtype=torch.float64, device=s.device)
    cache.add_sequence(0)
    _write(cache, ex, 0, 3, 0)
    cache.fork(0, 1)
    pool = s.ctx.t.HostBlockPool(4, 2, 2, 2, 2, dtype=torch.float64)
    s.call("swap_out(cache, pool, 0), the cache's pages on the test device", s.ctx.t.swap_out, cache, pool, 0)
    s.call("swap_in(cache, pool, 0), the cache's pages on the test device", s.ctx.t.swap_in, cache, pool, 0)
    for layer in range(2):
        s.call(f"gather(0, {layer}) after the swap-in", cache.gather, 0, layer)


# -- bad input -------------------------------------------------------------------------------------
def _bad_pools(c, ex) -> None:
    Pool = c.t.HostBlockPool
    good = (2, 2, 2, 2, 2)
    names = ("num_blocks", "block_size", "n_layers", "n_kv_heads", "head_dim")
    for i, name in enumerate(names):
        for bad in (0, -1, 1.5):
            args = good[:i] + (bad,) + good[i + 1:]
            expect_value_error(c, Pool, *args, what=f"HostBlockPool{args}", names=(name,), example=ex)
    for dtype in (torch.int64, "float32"):
        expect_value_error(c, Pool, *good, dtype=dtype, what=f"HostBlockPool(2, 2, 2, 2, 2, dtype={dtype!r})",
                           names=("dtype",), example=ex)
    for pin in ("yes", ""):
        expect_value_error(c, Pool, *good, pin_memory=pin, what=f"HostBlockPool(..., pin_memory={pin!r})",
                           names=("pin_memory",), example=ex)
    if not torch.cuda.is_available():
        expect_value_error(c, Pool, *good, pin_memory=True, what="HostBlockPool(..., pin_memory=True) without CUDA",
                           names=("pin_memory",), example=ex)
    if Pool(1, 1, 1, 1, 1).num_free != 1:
        c.fail("HostBlockPool(1, 1, 1, 1, 1), the smallest pool, should have num_free = 1", ex, ("smallest",))


def _bad_swaps(c, ex) -> None:
    t, cache = c.t, PagedKVCache(6, 2, 2, 2, 2, dtype=torch.float64)
    for seq, n in ((0, 3), (1, 2)):
        cache.add_sequence(seq)
        _write(cache, GEOMETRY, seq, n, seq)
    pool = t.HostBlockPool(4, 2, 2, 2, 2, dtype=torch.float64)
    t.swap_out(cache, pool, 1)
    before = _state(t, cache, pool, {0}, [0, 1, 2])
    others = {"block_size 1": (4, 1, 2, 2, 2), "1 layer": (4, 2, 1, 2, 2), "1 KV head": (4, 2, 2, 1, 2),
              "head_dim 1": (4, 2, 2, 2, 1)}
    for what, args in others.items():
        expect_value_error(c, t.swap_out, cache, t.HostBlockPool(*args, dtype=torch.float64), 0,
                           what=f"swap_out with a pool of {what}", names=("pool",), example=ex)
    expect_value_error(c, t.swap_out, cache, t.HostBlockPool(4, 2, 2, 2, 2), 0,
                       what="swap_out of a float64 cache into a float32 pool", names=("pool",), example=ex)
    expect_value_error(c, t.swap_in, cache, t.HostBlockPool(4, 2, 2, 2, 1, dtype=torch.float64), 1,
                       what="swap_in with a pool of head_dim 1", names=("pool",), example=ex)
    for what, fn, seq in (("swap_out of sequence 2, never added", t.swap_out, 2),
                          ("swap_out of sequence 1, already swapped out", t.swap_out, 1),
                          ("swap_in of sequence 0, in the cache", t.swap_in, 0),
                          ("swap_in of sequence 2, never swapped out", t.swap_in, 2)):
        expect_value_error(c, fn, cache, pool, seq, what=what, names=("seq_id",), example=ex)
    cache.add_sequence(1)
    expect_value_error(c, t.swap_in, cache, pool, 1, what="swap_in of sequence 1 while a new sequence 1 is in the "
                       "cache", names=("seq_id",), example=ex)
    expect_value_error(c, t.swap_out, cache, pool, 1, what="swap_out of a new sequence 1 while the swapped-out "
                       "sequence 1 is in the pool", names=("seq_id",), example=ex)
    cache.free(1)
    after = _state(t, cache, pool, {0}, [0, 1, 2])
    if not _same(before, after):
        c.fail("the refused swap calls changed the cache or the pool (a refused call changes nothing)", ex,
               ("refusals changed",))


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def register(checks) -> None:
    """Add the swap checks to kata 14's list."""

    @checks.add("swap programs (add, grow, fork, swap out, swap in, free): every sequence's keys and values, "
                "free blocks, swapped ids", uses="swap_out")
    def swap_programs_match(ctx):
        ctx.forall(swap_programs(), _body, max_examples=40)
        ctx.forall(swap_programs(blocks=(2, 4), host=(1, 3)), _body, max_examples=20)  # often out of blocks
        ctx.case(LARGE, _body)

    @checks.add("worked swaps: exact fits and one block short (nothing changes), forks, old block ids reused",
                uses="swap_in")
    def worked_swaps(ctx):
        for what, program in PINNED.items():
            ctx.case({**program, "program": what}, _body)

    @checks.add("HostBlockPool, swap_out and swap_in refuse bad input with a ValueError naming it, changing nothing",
                uses="HostBlockPool")
    def swap_rejects_bad_input(ctx):
        def body(c, ex):
            _bad_pools(c, ex)
            _bad_swaps(c, ex)

        ctx.case({"case": "bad arguments"}, body)
