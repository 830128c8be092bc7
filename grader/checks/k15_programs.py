"""Programs for kata 15's cache checks: drawn sequences of packed rows (begin, then an update of every
layer) and frees, run on ``PackedKVCache`` with rows the grader builds (``k15_rows.row``), so the cache
is judged apart from the learner's ``pack``. Every returned (K, V) is copied at once (a cache may return
views of its storage, valid until its next call), and the caller's k and v are overwritten after each
update, as a caller that reuses its buffers does. Also here: two caches driven in turn.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks.k15_rows import row
from grader.checks.support import envelope, protocol
from grader.checks.support.common import DTYPES, SEEDS, expect_pair


@st.composite
def programs(draw, max_ops: int = 6):
    """Rows of 1 to 3 sequences (ids 0 to 3, in any order, 1 to 4 new tokens each) and frees of held ids."""
    ex = {"layers": draw(st.integers(1, 2)), "hkv": draw(st.integers(1, 2)), "d": draw(st.sampled_from([2, 4])),
          "dtype": draw(DTYPES)}
    ops, held = [], set()
    for _ in range(draw(st.integers(1, max_ops))):
        if held and draw(st.integers(0, 3)) == 0:
            victim = draw(st.sampled_from(sorted(held)))
            ops.append(("free", victim))
            held.discard(victim)
        else:
            ids = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True))
            ops.append(("row", tuple((i, draw(st.integers(1, 4))) for i in ids)))
            held |= set(ids)
    ex["ops"], ex["seed"] = tuple(ops), draw(SEEDS)
    return ex


def say(op) -> str:
    if op[0] == "free":
        return f"free({op[1]!r})"
    return "row " + ", ".join(f"{i!r}: {n} new" for i, n in op[1])


def new_kv(ex: dict, seed: int, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The row's new keys and values (1, Hkv, T, D), drawn in the example's dtype and layout."""
    return tuple(envelope.tensor(ex, seed + s, 1, ex["hkv"], T, ex["d"], device=device) for s in (0, 7919))


def run_program(api, ex: dict, device) -> dict:
    """Every (K, V) and seq_len the program shows, by step, as plain data."""
    cache, held, seen = api.PackedKVCache(), {}, {}
    for step, op in enumerate(ex["ops"], 1):
        where = f"step {step} ({say(op)})"
        if op[0] == "free":
            cache.free(op[1])
            held.pop(op[1])
            seen[f"{where}: seq_len({op[1]!r}) after the free"] = cache.seq_len(op[1])
            continue
        ids, new = [i for i, _ in op[1]], [n for _, n in op[1]]
        cache.begin(row(new, [held.get(i, 0) for i in ids], ids, device))
        for layer in range(ex["layers"]):
            k, v = new_kv(ex, ex["seed"] * 1000 + step * 10 + layer, sum(new), device)
            K, V = expect_pair(cache.update(layer, k, v), "update(layer, k, v)", "(K, V)")
            seen[f"{where}: (K, V) of layer {layer}"] = {"K": protocol.snapshot(K), "V": protocol.snapshot(V)}
            protocol.scribble((k, v))  # the caller reuses its buffers: the cache must hold its own copy
        for i, n in zip(ids, new):
            held[i] = held.get(i, 0) + n
        seen[f"{where}: seq_len(seq_id, layer) of the row's sequences, layers 0 to {ex['layers']}"] = [
            [cache.seq_len(i, layer) for layer in range(ex["layers"] + 1)] for i in ids]
    return seen


def new_cache(api, ex, i):
    """A cache and the grader's own count of what each of its sequences holds."""
    return {"cache": api.PackedKVCache(), "held": {}}


def cache_step(api, ex, instance, i, n):
    """Instance i, step n: a row of sequence "a" alone first, then "a" and "b", their order swapped each step."""
    ids = ["a"] if n == 0 else (["a", "b"] if n % 2 else ["b", "a"])
    new = [1 + (n + i + s) % 3 for s in range(len(ids))]
    held = instance["held"]
    instance["cache"].begin(row(new, [held.get(s, 0) for s in ids], ids, ex["device"]))
    for s, m in zip(ids, new):
        held[s] = held.get(s, 0) + m
    k, v = new_kv(ex, ex["seed"] * 100 + i * 10 + n, sum(new), ex["device"])
    return expect_pair(instance["cache"].update(0, k, v), "update(layer, k, v)", "(K, V)")
