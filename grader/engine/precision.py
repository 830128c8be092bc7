"""Float tolerances derived from the computation (SPEC, "The grader").

A check first compares the learner's result with the reference run in the same dtype, at that
dtype's floor (``FLOORS``). Where that fails in float32, float16 or bfloat16, the verdict comes
from the computation itself: the reference runs again in float64 on the same inputs, each drawn
input rounded to the example's dtype first (``rounded_inputs``), which gives the exact result of
the learner's inputs; the reference's own error in the narrow dtype on that input, ``E`` (the
largest over the result's entries), measures how ill-conditioned the input is; and an entry
passes when it lies within

    atol + rtol·|exact| + REFERENCE_ERROR_FACTOR · E

of the exact result. A well-conditioned input keeps the floor (a file computing in a narrower
dtype than its README asks still fails there); scores in the thousands widen the tolerance as
much as they widen the reference's own error, so a correct file in any order of operations passes.
Passing at the floor against the same-dtype reference implies passing this rule (the reference is
within ``E`` of the exact result), so the second run is needed only where the first comparison fails.
Integer and boolean results stay exact, against the same-dtype reference.
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager

import torch

# (rtol, atol) below which no tolerance goes: a correct computation of the checks' well-conditioned
# inputs lands well inside these, and a mistake far outside.
FLOORS = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}
NARROW = (torch.float32, torch.float16, torch.bfloat16)
# The dtypes narrower than each, tried in turn when a result misses its dtype's tolerance: an error the size of
# the reference's own error in one of them says that something inside computed in it.
NARROWER = {torch.float64: (torch.float32, torch.bfloat16, torch.float16),
            torch.float32: (torch.bfloat16, torch.float16)}
# How far beyond the reference's own error a careful implementation may err. Measured (python
# tests/precision_study.py): correct files of tests/independent/ err at most 0.93 E beyond the floor, the less
# precise files of tests/independent/wrong/ 4e4 E or more; 8 leaves room for orders of operations not measured.
REFERENCE_ERROR_FACTOR = 8.0

_ROUNDED: contextvars.ContextVar = contextvars.ContextVar("rounded_inputs", default=None)


def floor(dtype: torch.dtype) -> tuple[float, float]:
    return FLOORS.get(dtype, (0.0, 0.0))


@contextmanager
def rounded_inputs(dtype: torch.dtype):
    """While inside, every input the checks draw (grader.checks.support.common.randn) is rounded to
    ``dtype`` before it takes the dtype asked for: the float64 run then sees the learner's inputs."""
    token = _ROUNDED.set(dtype)
    try:
        yield
    finally:
        _ROUNDED.reset(token)


def round_input(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded through the dtype ``rounded_inputs`` set (unchanged outside it)."""
    dtype = _ROUNDED.get()
    if dtype is None or not x.is_floating_point():
        return x
    return x.to(dtype).to(x.dtype)


def exact_example(example) -> dict | None:
    """The example of the float64 run, or None where the example is not computed in a narrow float dtype."""
    if not isinstance(example, dict) or example.get("dtype") not in NARROW:
        return None
    return {**example, "dtype": torch.float64, "rounded": example["dtype"]}


def reference_error(expected: torch.Tensor, exact: torch.Tensor) -> float:
    """The reference's largest error in its own dtype against the exact result (inf where it overflowed)."""
    if expected.numel() == 0:
        return 0.0
    error = (expected.detach().cpu().double() - exact.detach().cpu().double()).abs()
    both_nan = torch.isnan(expected.detach().cpu()) & torch.isnan(exact.detach().cpu())
    error = torch.where(both_nan, torch.zeros_like(error), error)
    return float(error.nan_to_num(float("inf")).max())


def allowed(exact: torch.Tensor, dtype: torch.dtype, error: float) -> torch.Tensor:
    """The error each entry may have: the dtype's floor plus ``REFERENCE_ERROR_FACTOR`` times ``error``."""
    rtol, atol = floor(dtype)
    return atol + rtol * exact.abs() + REFERENCE_ERROR_FACTOR * error
