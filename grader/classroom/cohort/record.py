"""Record and replay: grade a file in two processes, so that nothing its code does (patching
torch or the grader, returning objects that lie about themselves) turns a failing comparison into
a passing one. This module is the recording half; grader.classroom.cohort.replay is the other.

*Recording* runs in the learner's process (untrusted, see grader.classroom.cohort.worker). Every check
runs as usual and draws the same examples, but nothing a reference would decide is decided there:
what the learner's code hands to ``ctx.differential``, and what each of the learner's functions
returns (or raises, or changes in its arguments), is written down as plain data (grader.engine.plain).
Each ``forall`` runs as a local run does, Hypothesis told of each failure (``differential`` compares
with the reference here too, for that alone): it stops at the first failing input and shrinks it as
``pytest katas/NN`` does, in the same time, and the record holds every input it tried, so the
replay side, told the same, reaches the same failing input, shrinks to the same one and names the
same mistake. A learner's code that fooled this comparison only gets a less shrunk input shown; one
that failed here where the replay side passes finds the next inputs missing, and fails there.

*Replay* runs in a process that never executes the learner's code and judges from the record.
The record crosses over as a ``torch.save`` file read with ``weights_only=True``: data only.
"""
from __future__ import annotations

import functools
import inspect

from grader.engine import UNSET, CheckTimeout, Ctx, Failure, GraderBug, NotImplementedYet, run_body
from grader.engine.plain import describe_exception, observation, same
from grader.engine.targets import Target


def example_key(body: int, example) -> str:
    """``body`` counts the check's ``forall``/``case`` calls: one input may go to several bodies."""
    return f"{body}:{example!r}"


class RecordingCtx(Ctx):
    """Runs the checks on the learner's code and records what it did; compares nothing."""

    def __init__(self, target: Target, reference: Target, device, seed: int = 0):
        super().__init__(target, reference, device, seed)
        self.executions: dict[str, dict] = {}
        self.now: dict | None = None
        self.bodies = 0
        self.raw = self.t
        self.t = _RecordingApi(self)

    def forall(self, strategy, body, max_examples: int = 20) -> None:
        """Run the inputs as a local run does, Hypothesis told of each failure (the comparison made here
        for that alone), so it stops generating at the first failing input and shrinks it as
        ``pytest katas/NN`` does, in the same time; every input tried is recorded, so the replay side,
        told the same, shrinks to the same smallest failing input with the same diagnosis."""
        try:
            super().forall(strategy, self._recorded(body, shrink=True), max_examples)
        except Failure:
            pass  # the verdict is the replay side's

    def case(self, example: dict, body) -> None:
        super().case(example, self._recorded(body))

    def _recorded(self, body, number: int | None = None, shrink: bool = False):
        """``body``, its executions recorded; failures are kept from Hypothesis unless ``shrink``."""
        if number is None:
            self.bodies += 1
            number = self.bodies

        def recorded(ctx, example):
            now = {"calls": [], "observations": [], "outcome": None}
            outer, self.now = self.now, now
            try:
                run_body(ctx, body, example)
                now["outcome"] = {"kind": "pass"}
            except Failure as failure:  # recorded, not acted on (but when shrinking): the same examples must follow
                has = failure.observed is not UNSET
                now["outcome"] = {"kind": "fail", "message": failure.message, "has_observed": has,
                                  "observed": observation(failure.observed) if has else None}
                if shrink:
                    raise
            except NotImplementedYet as exc:
                now["outcome"] = {"kind": "not-implemented", "name": exc.name}
                raise
            finally:
                self.now = outer
                if now["outcome"] is not None:
                    self.executions.setdefault(example_key(number, example), now)
        return recorded

    def differential(self, example: dict, run, what: str = "") -> None:
        now, self.now = self.now, None  # calls inside are covered by the observation
        try:
            got = run(self.raw, example)
        finally:
            self.now = now
        if now is not None:
            now["observations"].append(observation(got))
        try:  # tells Hypothesis what a local run would, to shrink alike; the verdict stays the replay side's
            expected = self.expected(example, run, what)
        except GraderBug:
            return
        self.compare(example, expected, got, what, run)


class _RecordingApi:
    def __init__(self, ctx: RecordingCtx):
        self._ctx = ctx

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        now = self._ctx.now
        try:
            value = getattr(self._ctx.raw, name)
        except Failure:
            if now is not None:
                now["calls"].append({"op": "get", "name": name, "missing": True, "label": self._ctx.target.label})
            raise
        if now is None:
            return value
        if not is_function(value):  # a class or an object: the replay side leaves it to this process
            now["calls"].append({"op": "get", "name": name, "missing": False, "kind": type(value).__name__})
            return value
        now["calls"].append({"op": "get", "name": name, "missing": False, "kind": "function",
                             "signature": _signature(value)})
        return _recording(self._ctx, name, value)


def is_function(value) -> bool:
    return inspect.isfunction(value) or inspect.isbuiltin(value)


def _signature(fn) -> list | None:
    try:
        return [(p.name, int(p.kind), p.default is not p.empty) for p in inspect.signature(fn).parameters.values()]
    except (TypeError, ValueError):
        return None


def _recording(ctx: RecordingCtx, name: str, fn):
    @functools.wraps(fn)
    def recorded(*args, **kwargs):
        now = ctx.now
        if now is None:
            return fn(*args, **kwargs)
        entry = {"op": "call", "name": name}
        now["calls"].append(entry)
        given = list(enumerate(args)) + list(kwargs.items())
        before = [(where, value, observation(value)) for where, value in given]
        try:
            result = fn(*args, **kwargs)
        except CheckTimeout:
            raise
        except BaseException as exc:
            _finish(ctx, now, entry, before, raised=exc)
            raise
        _finish(ctx, now, entry, before, result=result)
        return result
    return recorded


def _finish(ctx: RecordingCtx, now: dict, entry: dict, before, result=None, raised=None) -> None:
    """What the call returned or raised, and which arguments it changed in place (with their new
    value), so the replay side can repeat the change on its own copy."""
    after = [(where, observation(value), copy) for where, value, copy in before]
    entry["mutated"] = [[where, new] for where, new, old in after if not same(new, old)]
    if raised is None:
        entry["result"] = observation(result)
    else:
        entry["raised"] = describe_exception(raised, ctx.target)
