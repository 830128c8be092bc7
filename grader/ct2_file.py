"""Read a CTranslate2 model file (``model.bin``, binary version 6) into torch tensors by name.

The layout, all little-endian: the version (u32); the spec's name (a string: u16 length counting a
closing NUL, the UTF-8 bytes, the NUL); the spec's revision (u32); the number of variables (u32), then
per variable its name (a string), rank (u8), one u32 per dimension, a dtype id (u8), its byte count
(u32) and the bytes, row-major; then the number of aliases (u32) and per alias two strings: the alias
and the variable it names (a tied weight is stored once).
"""
from __future__ import annotations

import math
import struct
from pathlib import Path

import torch

VERSION = 6
DTYPES = {0: torch.float32, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.float16, 5: torch.bfloat16}


class CT2Error(ValueError):
    """The file is not a complete CTranslate2 model file of the version read here; one line for the user."""


class _Cursor:
    """Reads the fields in order; running past the end raises CT2Error naming the field."""

    def __init__(self, data: bytes, path: Path):
        self.data, self.at, self.path = data, 0, path

    def take(self, n: int, what: str) -> bytes:
        if self.at + n > len(self.data):
            raise CT2Error(f"{self.path}: the file ends at byte {len(self.data):,} inside {what}: it is truncated")
        self.at += n
        return self.data[self.at - n:self.at]

    def number(self, fmt: str, what: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def text(self, what: str) -> str:
        raw = self.take(self.number("H", what), what)
        if not raw.endswith(b"\0"):
            raise CT2Error(f"{self.path}: {what} does not end with a NUL byte: not a CTranslate2 string")
        return raw[:-1].decode("utf-8")


def read(path) -> tuple[str, dict[str, torch.Tensor]]:
    """The spec's name (e.g. ``WhisperSpec``) and every variable by name, an alias naming its target's tensor."""
    path = Path(path)
    cursor = _Cursor(path.read_bytes(), path)
    version = cursor.number("I", "the version")
    if version != VERSION:
        raise CT2Error(f"{path}: binary version {version}, expected {VERSION}: not a CTranslate2 file read here")
    spec = cursor.text("the spec's name")
    cursor.number("I", "the spec's revision")
    variables: dict[str, torch.Tensor] = {}
    for _ in range(cursor.number("I", "the variable count")):
        name = cursor.text("a variable's name")
        shape = [cursor.number("I", f"{name}'s shape") for _ in range(cursor.number("B", f"{name}'s rank"))]
        kind = cursor.number("B", f"{name}'s dtype")
        if kind not in DTYPES:
            raise CT2Error(f"{path}: {name} has dtype id {kind}, expected one of {sorted(DTYPES)}")
        size = cursor.number("I", f"{name}'s byte count")
        if size != math.prod(shape) * DTYPES[kind].itemsize:
            raise CT2Error(f"{path}: {name} has {size:,} bytes, but {shape} of {DTYPES[kind]} needs "
                           f"{math.prod(shape) * DTYPES[kind].itemsize:,}")
        raw = bytearray(cursor.take(size, name))  # a copy of its own: aligned and writable
        variables[name] = torch.frombuffer(raw, dtype=DTYPES[kind]).reshape(shape)
    for _ in range(cursor.number("I", "the alias count")):
        alias, target = cursor.text("an alias"), cursor.text("an alias's target")
        if target not in variables:
            raise CT2Error(f"{path}: alias {alias} names {target}, which the file does not hold")
        variables[alias] = variables[target]
    if cursor.at != len(cursor.data):
        raise CT2Error(f"{path}: {len(cursor.data) - cursor.at:,} bytes after the last alias: not a file read here")
    return spec, variables
