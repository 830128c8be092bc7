"""Replay: judge a learner's run from its record, in a process that never runs the learner's code.
The design is described in grader.classroom.cohort.record; this is the grader's half.

The same checks with the same seed draw the same examples (grader.engine.same_draws);
``differential`` compares the recorded value with the reference computed here (tier 1); a name
that is a function in the reference is replayed from the recorded calls, so the check's own logic
runs here on the learner's recorded results (tier 2); a name that is a class or an object in the
reference can only be used in the learner's process, whose recorded verdict then stands (tier 3).
Every input Hypothesis draws before a failure must be in the record, or the check fails.
"""
from __future__ import annotations

import copy
import inspect

import torch

from grader.engine import Ctx, Failure, LearnerCrash, NotImplementedYet, report, Unrecorded, UNSET
from grader.classroom.cohort import memo as memory
from grader.classroom.cohort import traces
from grader.engine.plain import Replayed, is_data, opaque, rebuild_exception
from grader.engine import same_draws
from grader.classroom.cohort.record import example_key, is_function
from grader.engine.targets import Target

NO_RECORD = ("the process that ran your code kept no record of this input, so the result cannot be trusted "
             "(did your code stop the grader, or change it?)")
UNVERIFIED = "the record of your code's run does not match what the grader asked ({why}); the result cannot be trusted"
UNREADABLE = "your code returned {what}; results must be plain tensors, numbers, strings, lists, tuples or dicts"


class ReplayCtx(Ctx):
    """Runs the checks in a clean process against the record of the learner's run."""

    def __init__(self, executions: dict, label: str, reference: Target, device, seed: int = 0,
                 memo: memory.Memo | None = None):
        super().__init__(Target(label, label, {}), reference, device, seed)
        self.memo = memo  # the reference's outputs remembered across the cohort (grader.classroom.cohort.memo), or None
        self.steered = False  # a learner's function was replayed in this check: its results may steer what follows
        self.tracer: traces.Tracer | None = None  # the forall going on, where runs are remembered
        self.executions = executions
        self.cursor: _Cursor | None = None
        self.failing = False
        self.unrecorded: set[str] = set()  # inputs that failed for want of a record
        self.bodies = 0
        self.t = _Sealed()
        self.others: dict[str, dict] = {}  # the records of the kata's other checks, by check id (for diagnosis)

    def forall(self, strategy, body, max_examples: int = 20) -> None:
        self.failing = False
        number, replayed = self._replayed(body)

        def admitted(ex) -> bool:
            """Once an input fails, Hypothesis shrinks; an input the learner's process never saw is no candidate."""
            if not self.failing:
                return True
            key = example_key(number, ex)
            return key in self.executions or key in self.unrecorded
        self.tracer = None if self.memo is None else traces.Tracer(
            self.memo.runs, (self.reference.filename, str(self.device), self.seed, self.running,
                             number, max_examples), admitted)
        seen = strategy.filter(admitted if self.tracer is None else self.tracer.admit)
        with same_draws():
            super().forall(seen, replayed, max_examples)

    def explore(self, strategy, test, max_examples: int) -> None:
        """Hypothesis' run, or the walk of a remembered one (grader.classroom.cohort.traces)."""
        tracer, self.tracer = self.tracer, None
        if tracer is None:
            return super().explore(strategy, test, max_examples)
        seen = self.seen.get(self.calls, [])
        kept = (self.failing, set(self.unrecorded), self.steered, list(seen))

        def undo() -> None:
            self.failing, self.unrecorded, self.steered = kept[0], set(kept[1]), kept[2]
            seen[:] = kept[3]
        tracer.explore(test, lambda logged: Ctx.explore(self, strategy, logged, max_examples), undo)

    def case(self, example: dict, body) -> None:
        self.failing = False
        super().case(example, self._replayed(body)[1])

    def learner_body(self, number: int, body, check: str):
        """``body`` replayed from the record of ``check``'s ``number``-th call; Unrecorded off the record."""
        executions = self.executions if check == self.running else self.others.get(check)
        if not isinstance(executions, dict):
            executions = {}
        replayed = self._replay(number, body, executions, check)

        def recorded_only(ctx, example):
            if ctx is self and example_key(number, example) not in executions:
                raise Unrecorded()
            return replayed(ctx, example)
        return recorded_only

    def _replayed(self, body):
        self.bodies += 1
        return self.bodies, self._replay(self.bodies, body, None, self.running)

    def _replay(self, number: int, body, executions: dict | None, check: str):
        def replayed(ctx, example):
            if ctx is not self:  # diagnosing: a known mistake runs the real body
                return body(ctx, example)
            execution = (self.executions if executions is None else executions).get(example_key(number, example))
            if execution is None:
                self.unrecorded.add(example_key(number, example))
                self._raise(Failure(NO_RECORD))
            outer, self.cursor = self.cursor, _Cursor(execution, (str(check), number), self._steer)
            self.t = _ReplayApi(self.cursor, self.reference)
            try:
                body(ctx, example)
            except NeedsLearner:
                self._verdict(execution, strict=False)
            except Failure:
                self.failing = True
                raise
            except BaseException as exc:
                if isinstance(exc, Replayed):
                    self._raise(_learner_error(exc, example))
                raise
            finally:
                self.cursor, self.t = outer, _Sealed()
        return replayed

    def _steer(self) -> None:
        self.steered = True

    def with_target(self, target: Target, site: tuple[str, int] | None = None) -> Ctx:
        if self.memo is None:
            return super().with_target(target, site)
        return memory.MistakeCtx(target, self, self.memo, site)

    def _raise(self, exc: BaseException):
        self.failing = self.failing or isinstance(exc, Failure)
        raise exc from None

    def _verdict(self, execution: dict, strict: bool) -> None:
        """The learner's process' verdict, where replay cannot reach; a pass only when not ``strict``."""
        outcome = execution.get("outcome") or {}
        kind = outcome.get("kind")
        if kind == "pass" and not strict:
            return
        if kind == "not-implemented":
            raise NotImplementedYet(str(outcome.get("name")))
        if kind == "fail":
            self._raise(Failure(str(outcome.get("message")), outcome.get("observed") if outcome.get("has_observed") else UNSET))
        self._raise(Failure(UNVERIFIED.format(why="a value to compare is missing")))

    def differential(self, example: dict, run, what: str = "") -> None:
        if self.cursor is None:
            raise NeedsLearner()
        recorded = self.cursor.observation()
        if recorded is _MISSING:
            self._verdict(self.cursor.execution, strict=True)
        unreadable = opaque(recorded)
        if unreadable:
            head = f"{what}\n  " if what else ""
            raise Failure(f"{head}on input {report.describe_input(example)}\n  {UNREADABLE.format(what=unreadable)}",
                          ("opaque", unreadable))
        expected = self.expected(example, run, what)
        self.compare(example, expected, copy.deepcopy(recorded), what, run)

    def expected(self, example: dict, run, what: str = ""):
        """The reference's output, from the memo while no learner's result has reached the check."""
        if self.memo is None:
            return super().expected(example, run, what)
        cursor, remembered = self.cursor, None
        if not self.steered and cursor is not None:
            remembered = memory.key(self, cursor.site, cursor.next_observation - 1, example, run, what)
        return self.memo.output(remembered, lambda: Ctx.expected(self, example, run, what))


def _learner_error(exc: BaseException, example) -> BaseException:
    """What the engine makes of an exception of the learner's code (see engine.run_body)."""
    info = exc.info
    if isinstance(exc, NotImplementedError) and info.get("innermost"):
        return NotImplementedYet(info["innermost"])
    error = f"{info['type']}: {info['text']}"
    where = f"on input {report.describe_input(example)}\n  " if isinstance(example, dict) else ""
    if info.get("trace"):
        return LearnerCrash(f"{where}{report.CRASHED.format(error=error)}\n{info['trace']}",
                            ("raised", info["type"], info["text"]), info["trace"])
    return Failure(f"{where}{report.GRADER_HIT.format(error=error)}", ("grader-hit", info["type"]))


class NeedsLearner(BaseException):
    """Replay reached code that needs the learner's live objects (BaseException: no check's
    ``except Exception`` may swallow it)."""


_MISSING = object()


class _Cursor:
    """Where the replay of one recorded execution (of the body of ``site``: check id, call number) stands;
    ``steer`` is told when a learner's result is handed to the body."""

    def __init__(self, execution: dict, site: tuple[str, int], steer):
        self.execution, self.site, self.steer = execution, site, steer
        self.calls = execution.get("calls") or []
        self.observations = execution.get("observations") or []
        self.next_call = self.next_observation = 0

    def observation(self):
        if self.next_observation >= len(self.observations):
            return _MISSING
        self.next_observation += 1
        return self.observations[self.next_observation - 1]

    def take(self, op: str, name: str) -> dict:
        i = self.next_call
        if i >= len(self.calls) or self.calls[i].get("op") != op or self.calls[i].get("name") != name:
            raise Failure(UNVERIFIED.format(why=f"step {i + 1} should be {op} {name}"), ("unverified", op, name))
        self.next_call += 1
        if op == "call":
            self.steer()
        return self.calls[i]


class _Sealed:
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise NeedsLearner()


class _ReplayApi:
    """The learner's names on the replay side. Which of them can be replayed is decided by the
    reference, not by the record: a name that is a function in the reference is replayed from the
    recorded calls (a record that lacks them fails); a class or object is left to the learner's
    process."""

    def __init__(self, cursor: _Cursor, reference: Target):
        self._cursor, self._reference = cursor, reference

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._reference.namespace and not is_function(self._reference.namespace[name]):
            raise NeedsLearner()
        entry = self._cursor.take("get", name)
        if entry.get("missing"):
            raise Failure(report.MISSING_NAME.format(label=entry.get("label"), name=name), ("missing", name))
        if entry.get("kind") != "function":
            raise Failure(f"`{name}` should be a function (see the README's API); yours is a {entry.get('kind')}",
                          ("not a function", name))
        return _ReplayFunction(self._cursor, name, entry.get("signature"))


class _ReplayFunction:
    """Stands for one of the learner's functions: gives back what it returned, raised or changed."""

    def __init__(self, cursor: _Cursor, name: str, signature):
        self._cursor, self.__name__, self.__qualname__ = cursor, name, name
        try:
            params = [inspect.Parameter(n, inspect._ParameterKind(k),
                                        default=None if d else inspect.Parameter.empty) for n, k, d in signature]
            self.__signature__ = inspect.Signature(params)
        except (TypeError, ValueError):
            pass

    def __call__(self, *args, **kwargs):
        given = (*args, *kwargs.values())
        if not all(is_data(a) for a in given) or any(_stand_in(a) for a in given):
            # an object (a model, a generator) the learner's code may have used, or the stand-in device
            # (grader.checks.support.devices), whose tensors only the learner's process has: not replayable
            raise NeedsLearner()
        entry = self._cursor.take("call", self.__name__)
        for where, value in entry.get("mutated") or []:
            _overwrite(args[where] if isinstance(where, int) and where < len(args) else kwargs.get(where), value)
        if "raised" in entry:
            raise rebuild_exception(entry["raised"])
        unreadable = opaque(entry.get("result"))
        if unreadable:
            raise Failure(f"{self.__name__} returned {unreadable}; " + UNREADABLE.split("; ", 1)[1],
                          ("opaque", self.__name__, unreadable))
        return copy.deepcopy(entry.get("result"))


def _stand_in(value) -> bool:
    return isinstance(value, torch.device) and value.type == "meta"


def _overwrite(target, value) -> None:
    """Repeat, on the replay side's own argument, the change the learner's code made in place."""
    if isinstance(target, torch.Tensor) and isinstance(value, torch.Tensor):
        with torch.no_grad():
            if target.shape == value.shape and target.dtype == value.dtype:
                target.copy_(value)
            else:
                target.set_(value.clone())
    elif isinstance(target, list) and isinstance(value, list) and len(target) != len(value):
        target[:] = copy.deepcopy(value)
    elif isinstance(target, (list, tuple)) and isinstance(value, (list, tuple)):
        for i, v in enumerate(value[:len(target)]):
            if isinstance(target[i], (torch.Tensor, list, tuple, dict)):
                _overwrite(target[i], v)
            elif isinstance(target, list):
                target[i] = copy.deepcopy(v)
    elif isinstance(target, dict) and isinstance(value, dict):
        target.clear()
        target.update(copy.deepcopy(value))
