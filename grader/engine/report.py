"""Everything the learner reads: message templates, value descriptions, tensor diffs and
small pictures of masks. Checks and tests import the templates from here."""
from __future__ import annotations

import math
import numbers

import torch

from grader.engine import precision

NOT_IMPLEMENTED = "not implemented yet: {name}"
TIMED_OUT = "timed out after {seconds:g} s: look for a loop that never ends or a step that grows without bound"
CRASHED = "your code raised {error}"
GRADER_HIT = "while checking your result the grader hit {error}; your function probably returned something unexpected"
LOAD_FAILED = "{reason}"
IMPORT_TIMED_OUT = ("importing {label} did not finish within {seconds:g} s: look for a loop that never ends at the "
                    "top level of the file, outside any function")
MISSING_NAME = "{label} defines no `{name}`; the kata's API needs it (see the README)"
MUTATED = "{call} changed its argument `{arg}` in place; a function must not modify its inputs"
DIAGNOSIS = "this looks like a known mistake: {name}. {why}\n  hint: {hint}"
SAME_DIAGNOSIS = "this looks like the same known mistake: {name} (explained, with a hint, under \"{check}\")"
NARROWER = ("your largest error, {error:.3g}, is the size of the reference's own error when it computes in {narrow} on "
            "these inputs ({theirs:.3g}): does something inside compute in {narrow} rather than {dtype} (a softmax, a "
            "matmul, a tensor made without dtype=, a .float() or .half())?")
SUMMARY = "kata {kata}: {passed}/{total} checks pass"
NEXT_STEP = " — start with task {task}, {name}"
BUILT_ON = " (the checks test {tasks} through it)"
ALL_PASS = " — well done; next: {next}"

SHOW_WHOLE = 16  # tensors with at most this many entries are printed in full


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary, ending in "…" when cut."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text[:max(limit - 1, 1)]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ;,:") + "…"


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) of a comparison with the same-dtype reference: the dtype's floor (grader.engine.precision)."""
    return precision.floor(dtype)


def describe(value) -> str:
    """A short description of any value: what the learner returned, in words."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}, {str(value.dtype).replace('torch.', '')} on {value.device.type}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, bool):
        return f"the bool {value}"
    if isinstance(value, numbers.Number):
        return f"{type(value).__name__} {value!r}"
    return f"a {type(value).__name__}"


def describe_input(example: dict) -> str:
    """``batch=2, heads=4, lengths=[3, 1, 1]`` — the input of a check, seed last."""
    parts = [f"{k}={_short(v)}" for k, v in example.items() if k != "seed"]
    if "seed" in example:
        parts.append(f"seed={example['seed']}")
    return ", ".join(parts)


def _short(value) -> str:
    if isinstance(value, torch.dtype):
        return str(value).replace("torch.", "")
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}"
    return repr(value)


def compare(expected, got, where: str = "result") -> str | None:
    """None when ``got`` matches ``expected`` (tensors within the dtype's tolerance), else why not."""
    if isinstance(expected, torch.Tensor):
        return _compare_tensor(expected, got, where)
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"{where}: got {describe(got)}, expected a dict"
        extra = [key for key in got if key not in expected]
        if extra:
            return f"{where}: unexpected {extra[0]!r}"
        for key, value in expected.items():
            if key not in got:
                return f"{where}: missing {key!r}"
            problem = compare(value, got[key], f"{key}" if where == "result" else f"{where} · {key}")
            if problem:
                return problem
        return None
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)):
            return f"{where}: your code returned {describe(got)}, expected {describe(expected)}"
        if len(got) != len(expected):
            problem = f"{where}: your code returned {describe(got)}, expected {describe(expected)}"
            if all(_is_scalar(v) for v in (*expected, *got)) and len(expected) + len(got) <= 60:
                problem += f"\n    expected {list(expected)}\n    got      {list(got)}"
            return problem
        for index, (e, g) in enumerate(zip(expected, got)):
            problem = compare(e, g, f"{where}[{index}]")
            if problem:
                return problem
        return None
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return None if got == expected and type(got) is type(expected) else f"{where}: got {got!r}, expected {expected!r}"
    if isinstance(expected, numbers.Integral):
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):
            return f"{where}: got {describe(got)}, expected the int {expected}"
        return None if got == expected else f"{where}: got {got}, expected {expected}"
    if isinstance(expected, numbers.Real):
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            return f"{where}: got {describe(got)}, expected the number {expected}"
        return None if math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12) else f"{where}: got {got}, expected {expected}"
    return None if got == expected else f"{where}: got {got!r}, expected {expected!r}"


def compare_derived(expected, exact, got, where: str = "result") -> str | None:
    """None when ``got`` matches by the derived rule (grader.engine.precision): float tensors against
    ``exact`` (the float64 run on the rounded inputs) within the dtype's floor plus a multiple of the
    reference's own error ``expected - exact``; everything else as ``compare`` judges it against ``expected``."""
    if isinstance(expected, torch.Tensor) and expected.is_floating_point() and expected.dtype in precision.NARROW:
        problem = compare(expected, got, where)
        if problem is None or not _derivable(expected, exact, got):
            return problem
        error = precision.reference_error(expected, exact)
        if not math.isfinite(error):  # the reference overflowed here: nothing to derive a tolerance from
            return problem
        x, g = exact.detach().cpu().double(), got.detach().cpu().double()
        bad = ~((g - x).abs() <= precision.allowed(x, expected.dtype, error))
        bad &= ~(torch.isnan(g) & torch.isnan(x))
        if not bad.any():
            return None
        rtol, atol = precision.floor(expected.dtype)
        name = str(expected.dtype).removeprefix("torch.")
        return (f"{where} differs from the exact result (the reference run in float64 on the same inputs) by more "
                f"than a careful {name} computation errs on this input (tolerance {atol:g} + {rtol:g}·|expected| + "
                f"{precision.REFERENCE_ERROR_FACTOR:g} × {error:.3g}, the reference's own {name} error here):\n"
                f"{tensor_diff(x, g, bad)}")
    if isinstance(expected, dict) and isinstance(exact, dict) and isinstance(got, dict) \
            and expected.keys() == exact.keys() == got.keys():
        for key in expected:
            problem = compare_derived(expected[key], exact[key], got[key], key if where == "result" else f"{where} · {key}")
            if problem:
                return problem
        return None
    if isinstance(expected, (tuple, list)) and isinstance(exact, (tuple, list)) and isinstance(got, (tuple, list)) \
            and len(expected) == len(exact) == len(got):
        for index, (e, x, g) in enumerate(zip(expected, exact, got)):
            problem = compare_derived(e, x, g, f"{where}[{index}]")
            if problem:
                return problem
        return None
    return compare(expected, got, where)


def _derivable(expected: torch.Tensor, exact, got) -> bool:
    """Whether only the values differ: ``got`` and ``exact`` tensors of ``expected``'s shape, ``got`` of its dtype and device."""
    return (isinstance(exact, torch.Tensor) and isinstance(got, torch.Tensor) and exact.is_floating_point()
            and tuple(exact.shape) == tuple(expected.shape) == tuple(got.shape) and got.dtype == expected.dtype
            and got.device.type == expected.device.type)


def _is_scalar(value) -> bool:
    return value is None or isinstance(value, (numbers.Number, str))


def _compare_tensor(expected: torch.Tensor, got, where: str) -> str | None:
    if not isinstance(got, torch.Tensor):
        return f"{where}: your code returned {describe(got)}, expected {describe(expected)}"
    if tuple(got.shape) != tuple(expected.shape):
        return f"{where}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    if got.dtype != expected.dtype:
        why = "a boolean mask, True = may attend" if expected.dtype == torch.bool else "keep the dtype of the inputs"
        return f"{where}: dtype {got.dtype}, expected {expected.dtype} ({why})"
    if got.device.type != expected.device.type:
        return f"{where}: on {got.device.type}, expected on {expected.device.type} (keep the device of the inputs)"
    e, g = expected.detach().cpu(), got.detach().cpu()
    if e.dtype == torch.bool or not (e.is_floating_point() or e.is_complex()):
        bad = e != g
        if not bad.any():
            return None
        if e.dtype == torch.bool and e.dim() == 2 and e.shape[0] <= 12 and e.shape[1] <= 40:
            return f"{where} differs (■ may attend, · hidden):\n{mask_pictures(e, g)}"
        return f"{where} differs:\n{tensor_diff(e, g, bad)}"
    rtol, atol = tolerance(e.dtype)
    bad = ~torch.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    if not bad.any():
        return None
    return f"{where} differs (tolerance {atol:g} + {rtol:g}·|expected|):\n{tensor_diff(e, g, bad)}"


def tensor_diff(expected: torch.Tensor, got: torch.Tensor, bad: torch.Tensor) -> str:
    """Small tensors side by side; large ones as max error, first bad index and count. Floats are printed
    with as many digits as it takes for every wrong entry to differ from its expected value."""
    first = tuple(int(i) for i in bad.nonzero()[0])
    lines = []
    if expected.is_floating_point():
        error = (got.double() - expected.double()).abs()
        error = torch.where(torch.isnan(error), torch.full_like(error, math.inf), error)
        worst = tuple(int(i) for i in (error == error.max()).nonzero()[0])
        lines.append(f"    max |error| {error.max().item():.3g} at {list(worst)}")
    e, g = expected[first].item(), got[first].item()
    digits = significant_digits([(e, g)]) if expected.is_floating_point() else 6
    lines.append(
        f"    first bad index {list(first)}: expected {e:.{digits}g}, got {g:.{digits}g}"
        f" ({int(bad.sum())} of {bad.numel()} entries wrong)"
    )
    if expected.numel() <= SHOW_WHOLE:
        pairs = list(zip(expected[bad].tolist(), got[bad].tolist())) if expected.is_floating_point() else []
        places = decimal_places(pairs)
        lines.append(f"    expected {_fmt(expected, places)}")
        lines.append(f"    got      {_fmt(got, places)}")
    return "\n".join(lines)


def largest_error(expected, got) -> float | None:
    """The largest absolute difference between the float tensors of ``expected`` and ``got`` (a tensor, or
    dicts, lists and tuples of them, matched entry by entry); None where their shapes do not match."""
    if isinstance(expected, torch.Tensor):
        if not (isinstance(got, torch.Tensor) and expected.is_floating_point() and got.is_floating_point()
                and tuple(got.shape) == tuple(expected.shape)):
            return None
        if expected.numel() == 0:
            return 0.0
        error = (got.detach().cpu().double() - expected.detach().cpu().double()).abs().max().item()
        return error if math.isfinite(error) else None
    if isinstance(expected, dict) and isinstance(got, dict) and expected.keys() == got.keys():
        pairs = [(expected[k], got[k]) for k in expected]
    elif isinstance(expected, (tuple, list)) and isinstance(got, (tuple, list)) and len(expected) == len(got):
        pairs = list(zip(expected, got))
    else:
        return None if isinstance(expected, (dict, tuple, list)) else 0.0 if expected == got else None
    errors = [largest_error(e, g) for e, g in pairs]
    return None if any(e is None for e in errors) else max(errors, default=0.0)


def significant_digits(pairs, least: int = 6) -> int:
    """The fewest significant digits (at least ``least``, at most 17) that print each (expected, got) pair
    of floats as two different numbers wherever they are different numbers."""
    for digits in range(least, 18):
        if all(f"{a:.{digits}g}" != f"{b:.{digits}g}" for a, b in pairs if _differ(a, b)):
            return digits
    return 17


def decimal_places(pairs, least: int = 5) -> int:
    """The fewest decimal places (at least ``least``) that round each differing pair to two different numbers."""
    for places in range(least, 25):
        if all(round(a, places) != round(b, places) for a, b in pairs if _differ(a, b) and math.isfinite(a)
               and math.isfinite(b)):
            return places
    return 24


def _differ(a: float, b: float) -> bool:
    return a != b and not (math.isnan(a) and math.isnan(b))


def _fmt(t: torch.Tensor, places: int = 5) -> str:
    if t.is_floating_point():
        return str([round(v, places) for v in t.flatten().tolist()]) + f" (flattened from {tuple(t.shape)})"
    return str(t.tolist())


def mask_picture(mask: torch.Tensor) -> list[str]:
    return ["".join("■" if v else "·" for v in row) for row in mask.tolist()]


def mask_pictures(expected: torch.Tensor, got: torch.Tensor) -> str:
    """Two boolean masks drawn side by side: expected | yours."""
    left, right = mask_picture(expected), mask_picture(got)
    width = max(len(expected[0]) if expected.numel() else 0, 8)
    lines = [f"    {'expected'.ljust(width)}   yours"]
    for a, b in zip(left, right):
        marker = "  " if a == b else " ←"
        lines.append(f"    {a.ljust(width)}   {b}{marker}")
    return "\n".join(lines)


def block_table_picture(tables: dict, block_size: int | None = None) -> str:
    """Block tables drawn one sequence a line: ``seq 1: [3] [7] [2]``."""
    lines = []
    for seq, table in tables.items():
        cells = " ".join(f"[{b}]" for b in table) or "(empty)"
        lines.append(f"    seq {seq}: {cells}")
    if block_size is not None:
        lines.append(f"    (block size {block_size}; slot = block * {block_size} + offset)")
    return "\n".join(lines)
