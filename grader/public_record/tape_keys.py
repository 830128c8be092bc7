"""What the recorder of a public record (grader.public_record.tape) and its replay in a handout
(grader.public_record.public) agree on: the public seed, the record's version, how one body run is
keyed and what of a value must match for a recorded answer to hold.

Both sides import this module; the replay never imports the recorder, which needs the references
and the known-mistake catalogue that a handout does not have.
"""
from __future__ import annotations

import torch

PUBLIC_SEED = 8191  # never the grading seed: tuning to the public inputs does not pass grading
VERSION = 1


def entry_key(check: str, number: int, example) -> str:
    """One body run: the check, its ``forall``/``case`` call (counting from 1) and the input."""
    return f"{check}/{number}:{example!r}"


def fingerprint(value, depth: int = 0):
    """What must be the same for a recorded answer to hold: exact integers, strings and shapes.
    Floating-point values are left out (they may differ in the last bits between machines)."""
    if depth > 16:
        return "deep"
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return "float"
    if isinstance(value, torch.Tensor):
        exact = not value.is_floating_point() and not value.is_complex() and value.numel() <= 256
        return ["tensor", list(value.shape), str(value.dtype)] + ([value.tolist()] if exact else [])
    if isinstance(value, (list, tuple)):
        return [fingerprint(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): fingerprint(v, depth + 1) for k, v in value.items()}
    handle = getattr(value, "_tape_handle", None)
    if isinstance(handle, int):
        return ["object", handle]
    if isinstance(value, torch.dtype):
        return str(value)
    return type(value).__name__
