"""What the recorder of a public record (grader.public_record.tape) and its replay in a handout
(grader.public_record.public) agree on: the public seed, the record's version, how one body run is
keyed and what of a value must match for a recorded answer to hold.

The file's format is here too: the record saved with ``torch.save`` (read back with
``weights_only=True``), every tensor that holds the same entries as one already written kept once
(a cache's trace repeats its tensors step after step, and a known mistake's trace is mostly the
reference's), then compressed with xz. Nothing is rounded: the handout compares with the very
values the reference gave.

Both sides import this module; the replay never imports the recorder, which needs the references
and the known-mistake catalogue that a handout does not have.
"""
from __future__ import annotations

import hashlib
import io
import lzma

import torch

from grader.public_record.records import SUFFIX  # noqa: F401  (grader/public/NN.pt.xz: its one home is records)

PUBLIC_SEED = 8191  # never the grading seed: tuning to the public inputs does not pass grading
VERSION = 2
XZ_PRESET = 6


def encode(record: dict) -> bytes:
    """The record as the bytes of its file: equal tensors shared, saved, compressed."""
    buffer = io.BytesIO()
    torch.save(_shared(record, {}), buffer)
    return lzma.compress(buffer.getvalue(), preset=XZ_PRESET)


def decode(data: bytes) -> dict:
    """A record from the bytes ``encode`` wrote; anything but data is refused (``weights_only``).
    Equal tensors come back as one object: a reader copies a value before handing it out."""
    return torch.load(io.BytesIO(lzma.decompress(data)), map_location="cpu", weights_only=True)


def _shared(value, seen: dict):
    """``value`` with each tensor replaced by the first one met with the same dtype, shape, strides
    and entries (bit for bit), so that ``torch.save`` writes their storage once."""
    if isinstance(value, torch.Tensor):
        return seen.setdefault(_content(value), value)
    if isinstance(value, list):
        return [_shared(v, seen) for v in value]
    if isinstance(value, tuple):
        return tuple(_shared(v, seen) for v in value)
    if isinstance(value, dict):
        return {k: _shared(v, seen) for k, v in value.items()}
    return value


def _content(tensor: torch.Tensor) -> tuple:
    dense = tensor.detach().cpu().contiguous()
    raw = dense.view(torch.uint8).numpy().tobytes() if dense.numel() and dense.dim() else \
        repr(dense.tolist()).encode()
    return (str(tensor.dtype), tuple(tensor.shape), tuple(tensor.stride()), tensor.device.type,
            hashlib.blake2b(raw, digest_size=20).digest())


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
