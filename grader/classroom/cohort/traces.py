"""Hypothesis runs remembered while a cohort is judged, and walked again instead of drawing.

Replaying a check (grader.classroom.cohort.replay) runs Hypothesis as the learner's process did: it draws
every input again and, once one fails, shrinks, drawing hundreds of candidates that the record
mostly does not hold. Drawing is most of what replaying costs, and it is the same work for every
submission: with the same seed, what Hypothesis does next depends only on what it was told so
far — whether the replay's filter admitted an input, and whether the test returned or raised (and
from where). Two submissions that answer alike get the very same calls, in the same order.

So a replay that remembers keeps, per ``forall`` call site, the calls Hypothesis made and the
answers, as a tree: a call, then one branch per answer. The next submission walks the tree,
making each call itself on a copy of the remembered input; while its answers follow a branch,
nothing is drawn. Where it answers something new, what the walk did is undone, Hypothesis runs
after all, and its calls join the tree. A walk ends as the run it follows ended: returning, or
raising what one of its calls raised — a Failure or NotImplementedYet, whose traceback nobody
reads; a run that ended otherwise is not remembered. A new run that disagrees with the tree
about which call comes next (Hypothesis not behaving as a function of the answers) stops all
walking at that site. A walk makes its calls outside Hypothesis: they run only the grader's and
the reference's code, which draw with torch generators of their own, never with the global ones
Hypothesis seeds for each test case, nor with its build context.
"""
from __future__ import annotations

import copy
from typing import Callable

from grader.engine import Failure, NotImplementedYet

ENDINGS = (Failure, NotImplementedYet)  # what a walked run may end by raising
CALLS = 200_000  # calls remembered at most, every site together; beyond that all are forgotten
_UNKNOWN = object()


class Runs:
    """The remembered runs of every call site (a judging process' memory, grader.classroom.cohort.memo)."""

    def __init__(self, budget: int = CALLS):
        self.sites: dict = {}  # site key -> the first call of its runs
        self.untrusted: set = set()  # sites where Hypothesis did not follow the tree
        self.calls, self.budget = 0, budget
        self.walked = self.ran = 0  # runs walked, runs of Hypothesis


class _Call:
    __slots__ = ("kind", "example", "text", "after")

    def __init__(self, kind: str, example, text: str):
        self.kind, self.example, self.text = kind, example, text  # "admit" or "test"; the input, as drawn
        self.after: dict = {}  # answer -> the next _Call, or an _End


class _End:
    __slots__ = ("raised",)

    def __init__(self, raised: int | None):
        self.raised = raised  # None: Hypothesis returned; i: it raised what the i-th call raised


class Tracer:
    """One ``forall`` call of a replay. ``admit`` is the filter's predicate: Hypothesis must be given
    ``self.admit`` instead, so that a run can be written down."""

    def __init__(self, runs: Runs, site, admit: Callable):
        self.runs, self.site, self.admitted = runs, site, admit
        self.log: list | None = None  # (kind, input, text, answer, exception) of the run going on

    def admit(self, example) -> bool:
        answer = bool(self.admitted(example))
        if self.log is not None:
            self.log.append(("admit", copy.deepcopy(example), repr(example), answer, None))
        return answer

    def explore(self, test: Callable, hypothesis: Callable, undo: Callable) -> None:
        """As ``hypothesis(test)`` would: walk the remembered runs; where they end before this one
        does, ``undo()`` the walk, run Hypothesis and remember the run."""
        if self.site not in self.runs.untrusted and self.site in self.runs.sites:
            ended = _walk(self.runs.sites[self.site], self.admitted, test)
            if ended is not _UNKNOWN:
                self.runs.walked += 1
                if ended is not None:
                    raise ended
                return
            undo()
        self.runs.ran += 1
        self.log = []
        try:
            hypothesis(self._logged(test))
        except BaseException as exc:
            self._remember(exc)
            raise
        else:
            self._remember(None)
        finally:
            self.log = None

    def _logged(self, test: Callable):
        def logged(example):
            kept, text = copy.deepcopy(example), repr(example)
            answer, exc = _call(test, example)
            self.log.append(("test", kept, text, answer, exc))
            if exc is not None:
                raise exc
        return logged

    def _remember(self, raised: BaseException | None) -> None:
        log, end = self.log, _End(None)
        if raised is not None:
            index = next((i for i, step in enumerate(log) if step[4] is raised), None)
            if index is None or not isinstance(raised, ENDINGS):
                return
            end = _End(index)
        if not log or self.site in self.runs.untrusted:
            return
        if self.runs.calls + len(log) > self.runs.budget:
            self.runs.sites.clear()
            self.runs.calls = 0
        node = self.runs.sites.setdefault(self.site, _Call(*log[0][:3]))
        for i, (kind, _, text, answer, _) in enumerate(log):
            if not isinstance(node, _Call) or node.kind != kind or node.text != text:
                return self._distrust()
            if i + 1 < len(log):
                if answer not in node.after:
                    node.after[answer] = _Call(*log[i + 1][:3])
                    self.runs.calls += 1
                node = node.after[answer]
            elif node.after.setdefault(answer, end) is not end and not (
                    isinstance(node.after[answer], _End) and node.after[answer].raised == end.raised):
                return self._distrust()

    def _distrust(self) -> None:
        """Hypothesis did not follow the tree (the same answers, another call next): walk no more here."""
        self.runs.untrusted.add(self.site)
        self.runs.sites.pop(self.site, None)


def _walk(node, admit: Callable, test: Callable):
    """Make the remembered calls from ``node`` on: None when the run returned, what it raised when it
    raised, _UNKNOWN where an answer leaves the tree."""
    raised = []
    while isinstance(node, _Call):
        example = copy.deepcopy(node.example)
        if node.kind == "admit":
            answer, exc = bool(admit(example)), None
        else:
            answer, exc = _call(test, example)
        raised.append(exc)
        node = node.after.get(answer)
    if node is None:
        return _UNKNOWN
    return None if node.raised is None else raised[node.raised]


def _call(test: Callable, example) -> tuple:
    """Run the test on one input: (None, None) when it returned, else (where it raised from, the exception).
    One function for the walks and the runs, so that tracebacks start alike."""
    try:
        test(example)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return _origin(exc), exc
    return None, None


def _origin(exc: BaseException, depth: int = 0) -> tuple:
    """The exception's type, every frame it came through and, as deep, the exception it was raised while
    handling: finer than what Hypothesis tells failures apart by, so equal origins mean equal behaviour."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    inner = exc.__context__
    return (type(exc), tuple(frames), _origin(inner, depth + 1) if inner is not None and depth < 8 else None)
