"""Programs for kata 12's cache checks: drawn sequences of updates (every layer, T new tokens) and
crops, replayed on the learner's ``RollbackKVCache`` next to a plain list of chunks per layer,
comparing every returned (K, V) bit for bit and every ``seq_len`` after every step. The keys and
values are drawn by ``envelope.tensor``: an envelope case makes them half precision or transposed views.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.engine import report
from grader.checks.support import envelope
from grader.checks.support.common import DTYPES, SEEDS


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
