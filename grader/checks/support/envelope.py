"""One input envelope for the differential checks: the inputs learners' code meets beyond the drawn ones.

The drawn examples stay small (they are many, and they shrink well). On top of them a check runs a
few pinned cases, one per axis it declares, each once:

- ``large``: a few hundred tokens and 16 heads (the check says which fields make it large);
- ``half``: bfloat16 and float16 inputs, compared with the reference run in float64 on the same
  values (the inputs rounded to the half type first) at a tolerance for the half type, and the
  result must keep the half dtype (SPEC: every function keeps its inputs' dtype);
- ``strided``: inputs that are non-contiguous views, as ``.transpose(1, 2)`` after a projection makes;
- ``magnitude``: activations a hundred times larger, so attention scores reach thousands (a softmax
  that exponentiates without subtracting the maximum overflows).

A body draws its tensors with :func:`tensor`, which honours the case's dtype, layout and scale.
"""
from __future__ import annotations

import torch

from grader.checks.support.common import randn
from grader.engine import report
from grader.engine import Failure

AXES = ("large", "half", "strided", "magnitude")
HALF = (torch.bfloat16, torch.float16)
MAGNITUDE = 100.0
# (rtol, atol) of a half-precision result against the float64 reference rounded to the same half type:
# a few units in the last place of the half type after a chain of matrix products.
HALF_TOLERANCE = {torch.bfloat16: (6e-2, 6e-2), torch.float16: (1e-2, 1e-2)}


def cases(base: dict, axes: tuple[str, ...], large: dict | None = None) -> list[tuple[str, dict]]:
    """(what, example) for each axis in ``axes``, derived from ``base``; ``large`` overrides for the large case."""
    unknown = [a for a in axes if a not in AXES]
    if unknown:
        raise ValueError(f"axes: expected some of {', '.join(AXES)}, got {', '.join(unknown)}")
    found = []
    if "large" in axes:
        if not large:
            raise ValueError("large: expected the fields that make the example large, got none")
        found.append(("a large input", {**base, **large}))
    if "half" in axes:
        found += [(f"{str(d).removeprefix('torch.')} inputs", {**base, "dtype": d}) for d in HALF]
    if "strided" in axes:
        found.append(("non-contiguous inputs (transposed views)", {**base, "strided": True}))
    if "magnitude" in axes:
        found.append((f"activations {MAGNITUDE:g} times larger", {**base, "scale": MAGNITUDE}))
    return found


def tensor(ex: dict, seed: int, *shape: int, device="cpu") -> torch.Tensor:
    """Seeded noise for ``ex``: its dtype (rounded through ``ex["rounded"]`` first when set), its scale,
    and for a strided case a view with axes 1 and 2 (0 and 1 for 2-D shapes) swapped in memory."""
    scale = ex.get("scale", 1.0)
    if ex.get("strided") and len(shape) >= 2:
        a, b = (1, 2) if len(shape) >= 3 else (0, 1)
        stored = list(shape)
        stored[a], stored[b] = stored[b], stored[a]
        x = randn(seed, *stored, scale=scale).transpose(a, b)
    else:
        x = randn(seed, *shape, scale=scale)
    if ex.get("rounded") is not None:
        x = x.to(ex["rounded"]).to(torch.float64)
    return x.to(device=device, dtype=ex["dtype"])


def run(ctx, base: dict, axes: tuple[str, ...], body, large: dict | None = None) -> None:
    """Run ``body(ctx, example)`` once on each envelope case of ``base``."""
    for _, example in cases(base, axes, large):
        ctx.case(example, body)


def differential(ctx, ex: dict, run_api, what: str = "") -> None:
    """``ctx.differential``, but a half-precision case is compared with the reference run in float64 on the
    same (rounded) inputs, at the half type's tolerance; the result must keep the half dtype."""
    dtype = ex.get("dtype")
    if dtype not in HALF:
        ctx.differential(ex, run_api, what)
        return
    expected = ctx.expected({**ex, "dtype": torch.float64, "rounded": dtype}, run_api, what)
    got = run_api(ctx.t, ex)
    problem = _close(expected, got, dtype, "result")
    if problem:
        head = f"{what}\n  " if what else ""
        raise Failure(f"{head}on input {report.describe_input(ex)}\n  {problem}", observed=got)


def _close(expected, got, dtype: torch.dtype, where: str) -> str | None:
    """None when ``got`` matches the float64 ``expected`` in ``dtype`` at the half tolerance, else why not."""
    if isinstance(expected, torch.Tensor) and expected.is_floating_point():
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.shape):
            return report.compare(expected.to(dtype), got, where)
        if got.dtype != dtype:
            return f"{where}: dtype {got.dtype}, expected {dtype} (keep the dtype of the inputs)"
        rtol, atol = HALF_TOLERANCE[dtype]
        e, g = expected.detach().cpu(), got.detach().cpu().double()
        bad = ~torch.isclose(g, e, rtol=rtol, atol=atol)
        if bad.any():
            worst = (g - e).abs().nan_to_num(float("inf")).max().item()
            return (f"{where}: {int(bad.sum())} of {bad.numel()} values differ from the float64 result by more than "
                    f"{dtype}'s rounding (largest difference {worst:.3g}, tolerance {rtol:g} relative + {atol:g})")
        return None
    if isinstance(expected, dict) and isinstance(got, dict) and expected.keys() == got.keys():
        for key in expected:
            problem = _close(expected[key], got[key], dtype, key if where == "result" else f"{where} · {key}")
            if problem:
                return problem
        return None
    if isinstance(expected, (tuple, list)) and isinstance(got, (tuple, list)) and len(expected) == len(got):
        for i, (e, g) in enumerate(zip(expected, got)):
            problem = _close(e, g, dtype, f"{where}[{i}]")
            if problem:
                return problem
        return None
    return report.compare(expected, got, where)
