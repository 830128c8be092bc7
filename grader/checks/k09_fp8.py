"""Kata 09, task 6: what an FP8 cache must return, judged from the inputs alone.

``fp8_problem`` says whether a dequantized tensor is the README's FP8 quantization of its input for a
given scale: every element, divided by the scale, must lie on the format's grid (within the rounding
of the dtype it is returned in) and be a nearest grid value to ``clamp(x / scale, -max, max)``; either
neighbour passes only within float32 rounding of a tie. The scale is the README's ``amax / max``,
computed here in float64: a file's float32 scale may differ from it by a float32 rounding.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks.k09_programs import EPS
from grader.checks.support.common import SEEDS, randn

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
HALVES = (torch.bfloat16, torch.float16)
TIE = 8 * 2.0 ** -23  # float32 units: another order of the same float32 operations, a scale off by a rounding
GAINS = (0.0, 1.0, 3.0, 40.0)  # a chunk's size against the first one's: 0 (a zero chunk), equal, past a frozen scale


def want_scale(x: torch.Tensor, fmt: str, per_head: bool) -> torch.Tensor:
    """The README's scale in float64: amax(|x|) / max, per tensor () or per head (1, Hkv, 1, 1); 1 where amax is 0."""
    a = x.detach().double().cpu().abs()
    amax = a.amax(dim=(0, 2, 3), keepdim=True) if per_head else a.amax()
    return torch.where(amax > 0, amax / FP8_MAX[fmt], torch.ones_like(amax))


def fp8_problem(x: torch.Tensor, got: torch.Tensor, scale: torch.Tensor, fmt: str) -> tuple | None:
    """None when ``got`` is the FP8 quantization of ``x`` with ``scale`` (float64), returned in got's dtype;
    else (index, got / scale, the nearest value, why)."""
    top, f8 = FP8_MAX[fmt], FP8[fmt]
    x64, g64, s = x.detach().double().cpu(), got.detach().double().cpu(), scale.double()
    t = (x64 / s).clamp(-top, top)  # the value to round: saturated at the format's largest
    nearest = t.float().to(f8).double()
    g = g64 / s
    finite = torch.isfinite(g)
    snapped = torch.where(finite, g, torch.zeros_like(g)).float().clamp(-top, top).to(f8).double()
    e, tiny = EPS[got.dtype], torch.finfo(got.dtype).tiny
    rounding = (2 * e * g64.abs() + e * tiny) / s + TIE * g.abs()  # the returned dtype's rounding of code * scale
    checks = ((~finite, "not finite (an overflow past the format's largest value, or a division by a zero scale?)"),
              ((g - snapped).abs() > rounding, "not on the format's grid times the scale (is it quantized, with "
                                               "this format and this scale?)"),
              ((snapped - t).abs() > (nearest - t).abs() + TIE * t.abs(), "not the nearest value of the grid"))
    for bad, why in checks:
        bad = bad & torch.ones_like(x64, dtype=torch.bool)
        if bad.any():
            i = tuple(int(j) for j in bad.nonzero()[0])
            return i, g[i].item(), nearest[i].item(), why
    return None


def chunk(ex: dict, i: int, n: int, gain: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Update ``i``'s keys and values (B, Hkv, n, D): heads 2**h and batch rows 3**b apart in size, times ``gain``."""
    B, H, D = ex["batch"], ex["heads"], ex["head_dim"]
    spread = (2.0 ** torch.arange(H, dtype=torch.float64)).view(1, H, 1, 1)
    spread = spread * (3.0 ** torch.arange(B, dtype=torch.float64)).view(B, 1, 1, 1)
    k = randn(ex["seed"] + 31 * i, B, H, n, D) * spread * gain
    v = randn(ex["seed"] + 31 * i + 7, B, H, n, D) * spread.flip(1) * gain
    return k.to(device=device, dtype=ex["dtype"]), v.to(device=device, dtype=ex["dtype"])


@st.composite
def fp8_programs(draw, max_ops: int = 5):
    """A cache's settings and ``ops``, a list of (layer, new tokens, gain)."""
    layers = draw(st.integers(1, 2))
    ops = draw(st.lists(st.tuples(st.integers(0, layers - 1), st.integers(1, 5), st.sampled_from(GAINS)),
                        min_size=1, max_size=max_ops))
    return {"fmt": draw(st.sampled_from(sorted(FP8))), "per_head": draw(st.booleans()),
            "frozen": draw(st.booleans()), "layers": layers, "batch": draw(st.integers(1, 2)),
            "heads": draw(st.integers(1, 3)), "head_dim": draw(st.sampled_from([1, 4, 8])),
            "dtype": draw(st.sampled_from([torch.float64, torch.float32, *HALVES])), "ops": ops,
            "seed": draw(SEEDS)}


def formula_nbytes(ex: dict, tokens: int, updates: int) -> int:
    """The README's bytes of one layer: a byte per code, 4 per float32 scale (held once when frozen)."""
    if updates == 0:
        return 0
    per_set = 2 * (ex["heads"] if ex["per_head"] else 1)  # key and value scales of one update
    sets = 1 if ex["frozen"] else updates
    return 2 * ex["batch"] * ex["heads"] * tokens * ex["head_dim"] + 4 * per_set * sets
