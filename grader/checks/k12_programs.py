"""Programs for kata 12's cache checks: drawn sequences of updates (every layer, T new tokens) and
crops, replayed on the learner's ``RollbackKVCache`` next to a plain list of chunks per layer,
comparing every returned (K, V) bit for bit and every ``seq_len`` after every step. The keys and
values are drawn by ``envelope.tensor``: an envelope case makes them half precision or transposed views.
Also here: the steps of two caches driven in turn (``protocol.interleaved``) and the bad calls.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.engine import report
from grader.checks.support import envelope
from grader.checks.support.common import DTYPES, SEEDS, randn


@st.composite
def programs(draw, max_ops=8):
    """Updates of every layer (T new tokens) and crops to a valid n, with the shapes they use."""
    ex = {"layers": draw(st.integers(1, 3)), "batch": draw(st.integers(1, 2)), "heads": draw(st.integers(1, 2)),
          "head_dim": draw(st.sampled_from([2, 4])), "dtype": draw(DTYPES)}
    ops, length = [], 0
    for _ in range(draw(st.integers(1, max_ops))):
        if length and draw(st.booleans()):
            n = draw(st.integers(0, length))
            ops.append(("crop", n))
            length = n
        else:
            T = draw(st.integers(1, 4))
            ops.append(("update", T))
            length += T
    ex["ops"], ex["seed"] = ops, draw(SEEDS)
    return ex


def _say(op) -> str:
    return f"crop({op[1]})" if op[0] == "crop" else f"update(layer, k, v) with {op[1]} new tokens, every layer"


def replay(c, ex):
    """Run the program on the learner's cache next to a list of chunks per layer; fail at the first difference."""
    cache = c.t.RollbackKVCache()
    model: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(ex["layers"])]
    shape = (ex["batch"], ex["heads"], None, ex["head_dim"])
    for step, op in enumerate(ex["ops"]):
        program = "\n    ".join(_say(o) + ("   <- here" if i == step else "") for i, o in enumerate(ex["ops"][:step + 1]))
        if op[0] == "crop":
            cache.crop(op[1])
            for chunks in model:
                kept, left = [], op[1]
                for k, v in chunks:
                    if left > 0:
                        kept.append((k[:, :, :left], v[:, :, :left]))
                        left -= k.shape[2]
                chunks[:] = kept
        for layer, chunks in enumerate(model):
            if op[0] == "update":
                seed = ex["seed"] * 1000 + step * 10 + layer
                k, v = (envelope.tensor(ex, seed + s, *shape[:2], op[1], shape[3], device=c.device)
                        for s in (0, 500_000))
                chunks.append((k, v))
                got = cache.update(layer, k.clone(), v.clone())
                want = (torch.cat([p[0] for p in chunks], 2), torch.cat([p[1] for p in chunks], 2))
                if not isinstance(got, (tuple, list)) or len(got) != 2 or not all(
                        isinstance(g, torch.Tensor) and g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)
                        for g, w in zip(got, want)):
                    c.fail(f"program:\n    {program}\n  update of layer {layer} should return the {want[0].shape[2]} "
                           f"tokens the layer holds, each tensor {tuple(want[0].shape)} {ex['dtype']} equal to what it "
                           f"was fed since the crops; got {_describe(got)}{_first_diff(got, want)}",
                           ex, ("update", step, layer, _summary(got, want)))
            held = sum(p[0].shape[2] for p in chunks)
            if cache.seq_len(layer) != held:
                c.fail(f"program:\n    {program}\n  seq_len({layer}) = {cache.seq_len(layer)}, expected {held}",
                       ex, ("seq_len", step, layer, cache.seq_len(layer)))
        if cache.seq_len(ex["layers"]) != 0:
            c.fail(f"program:\n    {program}\n  seq_len({ex['layers']}) of a layer never fed should be 0, got "
                   f"{cache.seq_len(ex['layers'])}", ex, ("unseen", cache.seq_len(ex["layers"])))


def _describe(got) -> str:
    if isinstance(got, (tuple, list)):
        return "(" + ", ".join(report.describe(g) for g in got) + ")"
    return report.describe(got)


def _first_diff(got, want) -> str:
    if isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(g, torch.Tensor) for g in got):
        for name, g, w in zip("KV", got, want):
            if g.shape == w.shape and not torch.equal(g.to(w.dtype), w):
                return f"; {name} differs by up to {float((g.to(w.dtype) - w).abs().max()):.3g}"
            if g.shape != w.shape:
                return f"; {name} has shape {tuple(g.shape)}"
    return ""


def _summary(got, want):
    if isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(g, torch.Tensor) for g in got):
        return tuple((tuple(g.shape), str(g.dtype), g.shape == w.shape and torch.equal(g.to(w.dtype), w))
                     for g, w in zip(got, want))
    return report.describe(got)


def new_cache(api, ex, i):
    return api.RollbackKVCache()


def cache_step(api, ex, cache, i, n):
    """Step n of cache i: an update of both layers (3 tokens, then 2, ...), with a crop before every other one."""
    if n % 2:
        cache.crop(1 + i)
    got = []
    for layer in range(2):
        k, v = (randn(ex["seed"] + 100 * n + 10 * i + 2 * layer + s, 1, 2, 3 - n % 2, 4, device=ex["device"])
                for s in (0, 1))
        got.append(cache.update(layer, k, v))
    return {"update(0, k, v)": got[0], "update(1, k, v)": got[1], "seq_len()": cache.seq_len()}


def bad_calls(cache, k: torch.Tensor, wide: torch.Tensor) -> list:
    """(what, call, names it may raise with) for each bad call on ``cache``, whose layers 0 and 1 hold ``k``
    (1, 2, 3, 4); ``wide`` (2, 3, 3, 8) has more of everything than the layers hold."""
    return [("update(-1, k, v)", lambda: cache.update(-1, k, k), ("layer",)),
            ("update('0', k, v): a layer that is not an int", lambda: cache.update("0", k, k), ("layer",)),
            ("update with k of 3 dimensions", lambda: cache.update(0, k[0], k), ("k",)),
            ("update with v of 3 dimensions", lambda: cache.update(0, k, k[0]), ("v",)),
            ("update of the new layer 2 with k and v both of 3 dimensions",
             lambda: cache.update(2, k[0], k[0]), ("k", "v")),
            ("update of the new layer 2 with k and v both of 5 dimensions",
             lambda: cache.update(2, k[None], k[None]), ("k", "v")),
            ("update with k a list, not a tensor", lambda: cache.update(2, k.tolist(), k), ("k",)),
            ("update with v None", lambda: cache.update(2, k, None), ("v",)),
            ("update with v shorter than k", lambda: cache.update(0, k, k[:, :, :2]), ("v", "k")),
            ("update with v longer than k", lambda: cache.update(0, k[:, :, :2], k), ("v", "k")),
            ("update with 1 KV head where the layer holds 2", lambda: cache.update(1, k[:, :1], k[:, :1]), ("k",)),
            ("update with 3 KV heads where the layer holds 2",
             lambda: cache.update(1, wide[:1, :, :, :4], wide[:1, :, :, :4]), ("k",)),
            ("update with head width 2 where the layer holds 4", lambda: cache.update(0, k[..., :2], k[..., :2]),
             ("k",)),
            ("update with head width 8 where the layer holds 4", lambda: cache.update(0, wide[:1, :2], wide[:1, :2]),
             ("k",)),
            ("update with batch 2 where the layer holds 1",
             lambda: cache.update(0, wide[:, :2, :, :4], wide[:, :2, :, :4]), ("k",)),
            ("seq_len(-1)", lambda: cache.seq_len(-1), ("layer",)),
            ("seq_len('0')", lambda: cache.seq_len("0"), ("layer",)),
            ("crop(-1)", lambda: cache.crop(-1), ("n",)),
            ("crop(4) on a cache of 3 tokens", lambda: cache.crop(4), ("n",)),
            ("crop(1.5)", lambda: cache.crop(1.5), ("n",))]
