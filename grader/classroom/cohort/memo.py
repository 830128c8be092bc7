"""The reference's outputs, remembered across a cohort: judging replays every check against the
reference (grader.classroom.cohort.replay) and runs the known mistakes on failing inputs (grader.engine.diagnosis),
and each of those computes the reference's output on the same inputs again, submission after
submission and mistake after mistake. The same checks with the same seed draw the same inputs,
so the reference's answer to a ``ctx.differential`` depends only on where it was asked:

    (reference, device, seed, check, forall/case call number, the differential's input, its index
     within the body, the ``run`` function's code and its ``what``)

provided no result of the learner's code had reached the check before it asked (a result could
steer what it asks next): in a replay, no learner's function replayed in the check so far; for a
known mistake, which runs one body, none of its names used outside a differential. Contexts ask
``Memo.output`` with such a key, or with None where that does not hold; what is handed out is
always a copy, so nothing a check does to it changes the memory.
A Memo also keeps Hypothesis' runs of the replays (``runs``, grader.classroom.cohort.traces). It lives in
a trusted judging process only, never in a worker.
"""
from __future__ import annotations

import collections
import copy
from typing import Callable

import torch

from grader.classroom.cohort import traces
from grader.engine import Ctx
from grader.engine.targets import Target

BUDGET = 256 * 2**20  # bytes of tensors remembered at most, per judging process; the least recently used go first


class Memo:
    """A judging process' memory: the reference's outputs by key (see the module's docstring), least
    recently used forgotten first, and Hypothesis' runs by forall call site."""

    def __init__(self, budget: int = BUDGET):
        self.budget = budget
        self.entries: collections.OrderedDict = collections.OrderedDict()  # key -> (value, bytes)
        self.bytes = 0
        self.hits = self.misses = 0
        self.runs = traces.Runs()  # Hypothesis' runs, by forall call site (grader.classroom.cohort.traces)

    def output(self, key, compute: Callable):
        """A copy of what ``compute()`` returned for ``key``, computed now if not remembered (always
        when ``key`` is None). An exception of ``compute`` is raised, and nothing is remembered."""
        if key is None:
            return compute()
        if key in self.entries:
            self.entries.move_to_end(key)
            self.hits += 1
            return copied(self.entries[key][0])
        self.misses += 1
        value = compute()
        size = nbytes(value)
        try:
            kept = copied(value)
        except Exception:  # a value that cannot be copied is not remembered
            return value
        if size <= self.budget:
            self.entries[key] = (kept, size)
            self.bytes += size
            while self.bytes > self.budget:
                self.bytes -= self.entries.popitem(last=False)[1][1]
        return value


def copied(value):
    """A deep copy; a tensor that came out of autograd (which ``copy.deepcopy`` refuses) is copied
    detached, keeping ``requires_grad``: the checks compare values, never gradients."""
    if type(value) is torch.Tensor:
        out = value.detach().clone()
        return out.requires_grad_() if value.requires_grad else out
    if type(value) in (list, tuple):
        return type(value)(copied(v) for v in value)
    if type(value) is dict:
        return {k: copied(v) for k, v in value.items()}
    return copy.deepcopy(value)


def nbytes(value, depth: int = 0) -> int:
    """The bytes of the tensors in ``value`` (containers walked a few levels deep), plus a little per item."""
    if isinstance(value, torch.Tensor):
        return value.element_size() * value.nelement() + 64
    if depth < 8 and isinstance(value, (list, tuple)):
        return 64 + sum(nbytes(v, depth + 1) for v in value)
    if depth < 8 and isinstance(value, dict):
        return 64 + sum(nbytes(v, depth + 1) for v in value.values())
    return 64


def key(ctx: Ctx, site: tuple[str, int], index: int, example, run: Callable, what: str):
    """Where a differential asks the reference (see the module's docstring); None when ``run`` has no code."""
    code = getattr(run, "__code__", None)
    if code is None:
        return None
    return (ctx.reference.filename, str(ctx.device), ctx.seed, site, index, code, what,
            repr(example))


class MistakeCtx(Ctx):
    """The context a known mistake runs one body in while it is diagnosed (``ReplayCtx.with_target``):
    a plain context whose reference outputs come from the memo, until the body has touched the
    mistake's code outside a differential."""

    def __init__(self, target: Target, like: Ctx, memo: Memo, site: tuple[str, int] | None):
        super().__init__(target, like.reference, like.device, like.seed)
        self.memo, self.site = memo, site
        self.asked = 0  # differentials so far
        self.touched = False  # the body used the mistake's code outside a differential
        self.inside = False
        self.t = _Watched(self.t, self)

    def differential(self, example: dict, run: Callable, what: str = "") -> None:
        self.inside = True
        try:
            super().differential(example, run, what)
        finally:
            self.inside = False

    def expected(self, example: dict, run: Callable, what: str = ""):
        index, self.asked = self.asked, self.asked + 1
        remembered = None if self.touched or self.site is None else key(self, self.site, index, example, run, what)
        return self.memo.output(remembered, lambda: Ctx.expected(self, example, run, what))


class _Watched:
    """The mistake's names; using one outside a differential ends remembering for the body."""

    def __init__(self, api, ctx: MistakeCtx):
        self._api, self._ctx = api, ctx

    def __getattr__(self, name: str):
        if not self._ctx.inside:
            self._ctx.touched = True
        return getattr(self._api, name)
