"""Protocol programs for state and aliasing, built from a kata's own calls.

Each function here wraps a kata's calls, written as ``call(api, ex)`` (the form ``ctx.differential``
takes), into one more program of the same form. The program runs on the reference and on the
learner's code alike, so the comparison needs no expected value of its own: the reference keeps its
results apart from its state, and so must the learner's.

- :func:`kept`: a result held by the caller while the next call runs must not change
  (an object the next call refills, a view of a buffer the next call writes);
- :func:`changed_by_caller`: the caller scribbles over a result, then calls again; the next result must
  not change (a memoized result, a returned buffer that is also the state);
- :func:`twice`: the same call twice gives the same result both times;
- :func:`interleaved`: two instances driven in turn behave as each alone (a buffer shared between them,
  a class attribute used as state).

What is held is copied by :func:`snapshot` (tensors cloned, containers rebuilt) and overwritten in place by
:func:`scribble`, which reaches tensors, lists and dicts a few levels deep. Where a kata leaves ids free (block
ids), :func:`relabel` makes a program's result id-free before it is compared.
"""
from __future__ import annotations

from typing import Callable

import torch

Call = Callable  # call(api, ex) -> a result to compare
SCRIBBLED_ID = -7  # what a list of ints holds after the caller scribbled over it: no valid id or count


def snapshot(value, depth: int = 0):
    """A copy of ``value`` that no later call can change: tensors cloned, lists, tuples and dicts rebuilt."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if depth < 4 and isinstance(value, (list, tuple)):
        return type(value)(snapshot(v, depth + 1) for v in value)
    if depth < 4 and isinstance(value, dict):
        return {k: snapshot(v, depth + 1) for k, v in value.items()}
    return value


def scribble(value, depth: int = 0) -> None:
    """Overwrite, in place, what a caller holds: float tensors with NaN, integer ones with -7, boolean
    ones negated; the ints of a list with -7; tensors and containers inside lists and dicts likewise."""
    if isinstance(value, torch.Tensor):
        with torch.no_grad():
            if value.dtype == torch.bool:
                value.logical_not_()
            elif value.is_floating_point() or value.is_complex():
                value.fill_(float("nan"))
            else:
                value.fill_(SCRIBBLED_ID)
        return
    if depth >= 4:
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, int) and not isinstance(item, bool):
                value[i] = SCRIBBLED_ID
            else:
                scribble(item, depth + 1)
    elif isinstance(value, tuple):
        for item in value:
            scribble(item, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            scribble(item, depth + 1)


def kept(first: Call, then: Call, held: str = "the first result", after: str = "the next call") -> Call:
    """``first``'s result, held while ``then`` runs, is the same afterwards; both results are compared."""
    def run(api, ex):
        result = first(api, ex)
        before = snapshot(result)
        later = then(api, ex)
        return {f"{held}, as returned": before, f"{held}, after {after} ran": snapshot(result),
                f"the result of {after}": later}
    return run


def changed_by_caller(first: Call, then: Call, after: str = "the next call") -> Call:
    """The caller overwrites ``first``'s result in place (:func:`scribble`), then ``then`` runs; its result is
    compared: code that kept the returned object as its state, or memoized it, gives a changed one."""
    def run(api, ex):
        scribble(first(api, ex))
        return {f"the result of {after}, after the caller overwrote the one before": then(api, ex)}
    return run


def twice(call: Call, what: str = "the call") -> Call:
    """The same ``call`` twice: both results are compared (the first copied before the second runs)."""
    def run(api, ex):
        first = snapshot(call(api, ex))
        return {f"{what}, the first time": first, f"{what}, again": call(api, ex)}
    return run


def interleaved(make: Callable, step: Callable, steps: int, names=("A", "B")) -> Call:
    """Two instances, ``make(api, ex, i)`` for i = 0, 1, driven in turn by ``step(api, ex, instance, i, n)``
    for n = 0 … steps - 1; every step's result is compared."""
    def run(api, ex):
        instances = [make(api, ex, i) for i in range(len(names))]
        seen = {}
        for n in range(steps):
            for i, (name, instance) in enumerate(zip(names, instances)):
                seen[f"instance {name}, step {n + 1}"] = snapshot(step(api, ex, instance, i, n))
        return seen
    return run


def relabel(value, block_size: int = 1, names: dict | None = None):
    """``value`` with free ids renamed A, B, … in order of first appearance (one ``names`` map throughout): the
    ints of a list of ints are ids; each element of an integer tensor is a slot ``id * block_size + offset`` and
    becomes (name, offset). Dicts, lists and tuples are walked; anything else is kept."""
    names = {} if names is None else names

    def name(block: int) -> str:
        return names.setdefault(block, f"#{len(names)}")

    if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.dtype != torch.bool:
        return [(name(s // block_size), s % block_size) for s in value.reshape(-1).tolist()]
    if isinstance(value, dict):
        return {k: relabel(v, block_size, names) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(b, int) and not isinstance(b, bool) for b in value):
        return [name(b) for b in value]
    if isinstance(value, (list, tuple)):
        return type(value)(relabel(v, block_size, names) for v in value)
    return value
