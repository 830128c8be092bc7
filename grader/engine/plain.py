"""Plain data: what may cross from the learner's process to the grader's. Values are rebuilt
from exact builtin types and plain tensors (read through the builtin methods, so an overridden
``__iter__`` or ``__eq__`` cannot lie), and exceptions become descriptions that can be raised
again on the other side. Files of it are written with ``torch.save`` and read back with
``weights_only=True``, which accepts data and nothing else.
"""
from __future__ import annotations

import builtins
import fractions
import numbers
import traceback
from pathlib import Path

import torch

from grader.engine.core import innermost_learner_function
from grader.engine.targets import Target

OPAQUE = "__kvkata_opaque__"

# An exact ratio is data too (a Fraction holds two ints); weights_only reads it back once allowed.
torch.serialization.add_safe_globals([fractions.Fraction])


class NotPlain(Exception):
    """A value that is not plain data."""


def plain(value, depth: int = 0):
    """``value`` rebuilt from exact builtin types and plain tensors (cloned); NotPlain otherwise.
    Containers are read through the builtin methods, so an overridden ``__iter__`` cannot lie."""
    if depth > 32:
        raise NotPlain("a structure nested too deep")
    kind = type(value)
    if value is None or kind in (bool, int, float, str, fractions.Fraction, torch.dtype, torch.device):
        return value
    if kind in (torch.Tensor, torch.nn.Parameter):
        return torch.Tensor.detach(value).clone()
    if isinstance(value, tuple):
        return tuple(plain(v, depth + 1) for v in tuple.__iter__(value))
    if isinstance(value, list):
        return [plain(v, depth + 1) for v in list.__iter__(value)]
    if isinstance(value, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in dict.items(value)}
    if isinstance(value, numbers.Integral) and not isinstance(value, torch.Tensor):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, torch.Tensor):
        return float(value)
    raise NotPlain(f"a {kind.__name__}")


def is_data(value, depth: int = 0) -> bool:
    """Whether ``value`` is plain data as it stands (nothing with behaviour, such as a model)."""
    if depth > 32:
        return False
    if value is None or type(value) in (bool, int, float, str, fractions.Fraction, torch.dtype, torch.device,
                                        torch.Tensor):
        return True
    if type(value) in (tuple, list, torch.Size):
        return all(is_data(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(is_data(k, depth + 1) and is_data(v, depth + 1) for k, v in value.items())
    return False


def same(a, b) -> bool:
    """Whether two plain values are identical (tensors: same shape, dtype and entries)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a, b)))
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def observation(value):
    """What the replay side compares: plain data, or a marker saying what could not be carried."""
    try:
        return plain(value)
    except NotPlain as exc:
        return {OPAQUE: str(exc)}
    except Exception as exc:  # the value misbehaved while being read
        return {OPAQUE: f"a value that raised {type(exc).__name__} when read"}


def opaque(value) -> str | None:
    if isinstance(value, dict):
        if OPAQUE in value:
            return str(value[OPAQUE])
        return next((o for o in map(opaque, value.values()) if o), None)
    if isinstance(value, (tuple, list)):
        return next((o for o in map(opaque, value) if o), None)
    return None


def describe_exception(exc: BaseException, target: Target) -> dict:
    """An exception as data: enough to raise an equivalent one, and the learner's part of the trace."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if target.owns(f.filename)]
    try:
        args = plain(exc.args)
    except Exception:
        args = None
    bases = [c.__name__ for c in type(exc).__mro__ if getattr(builtins, c.__name__, None) is c]
    try:
        text = str(exc)
    except Exception:
        text = "<an exception whose message could not be read>"
    return {"type": type(exc).__name__, "bases": bases, "text": text, "args": args,
            "trace": "".join(traceback.format_list(frames)).rstrip(),
            "innermost": innermost_learner_function(exc, target)}


class Replayed:
    """Marks exceptions rebuilt from a record; ``info`` is the description they came from."""

    info: dict = {}

    def __str__(self) -> str:
        return str(self.info.get("text", ""))


_REBUILT: dict[tuple[str, type], type] = {}  # one class per name and base, so a replay raises the same type twice


def exception_class(name: str, bases) -> type:
    """The one class that stands for the exception class ``name`` whose builtin bases are ``bases``."""
    base = next((getattr(builtins, n) for n in bases if isinstance(getattr(builtins, n, None), type)
                 and issubclass(getattr(builtins, n), BaseException)), Exception)
    key = (str(name), base)
    if key not in _REBUILT:
        _REBUILT[key] = type(key[0], (Replayed, base), {})
    return _REBUILT[key]


def rebuild_exception(info: dict) -> BaseException:
    """An exception equivalent to the described one: same name, same builtin base, same message."""
    cls = exception_class(info["type"], info["bases"])
    exc = cls.__new__(cls)
    exc.args = tuple(info["args"]) if isinstance(info.get("args"), tuple) else (info["text"],)
    exc.info = info
    return exc


def save(path: Path, data) -> None:
    """Write ``data`` (plain) to ``path`` atomically."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(data, tmp)
    tmp.replace(path)


def load(path: Path):
    """Data written by ``save``; anything but data is refused by ``weights_only``."""
    return torch.load(path, map_location=None, weights_only=True)
