"""The check engine: registers a kata's checks, runs one against a target with Hypothesis,
and turns whatever one input did into a failure or not (grader.engine.run runs a whole check).

A check is a function ``check(ctx)``. It draws inputs with ``ctx.forall`` (Hypothesis,
seeded, bounded) or pins one with ``ctx.case``; each input goes to a *body*
``body(ctx, example)`` that calls the learner's API through ``ctx.t`` and raises
``Failure(message, observed=...)`` when the behaviour is wrong. ``observed`` is what the
learner's code produced; when a known mistake of the catalogue produces the same on the
same input, the result names that mistake.
"""
from __future__ import annotations

import inspect
import math
import signal
import threading
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis import strategies as st

from grader.engine import precision, report
from grader.engine.targets import Target

UNSET = object()  # "observed" not given: a failure no known mistake can be matched against
NOT_RECORDED = object()  # Ctx.outcome_of: this context does not know, the mistake must run


class Failure(Exception):
    """The learner's code behaved wrongly on one input. ``observed`` is what it produced."""

    def __init__(self, message: str, observed=UNSET):
        super().__init__(message)
        self.message = message
        self.observed = observed
        self.example: dict | None = None
        self.body: Callable | None = None
        self.site: int | None = None  # which forall/case call of the check failed, counting from 1
        self.culprit: str | None = None  # the API name whose result differed, where known (grade.next_step)
        self.addendum: Callable[[], str] | None = None  # more of the message, worked out once the input is final


class LearnerCrash(Failure):
    """The learner's code raised; ``trace`` holds only the learner's frames."""

    def __init__(self, message: str, observed, trace: str):
        super().__init__(message, observed)
        self.trace = trace


class NotImplementedYet(BaseException):
    """A stub still raises NotImplementedError. BaseException, so Hypothesis stops at once."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


class CheckTimeout(BaseException):
    pass


class GraderBug(BaseException):
    """The reference itself failed: a bug in the kata, never the learner's fault."""


class Unrecorded(BaseException):
    """What the learner's code did on an input is not known (it was never run there)."""


@dataclass
class Check:
    kata: str
    title: str
    func: Callable
    uses: str  # the API name the check exercises first: "repeat_kv", "GQAttention.forward"
    family: list = field(default_factory=list, repr=False, compare=False)  # every check of the kata, this one too

    @property
    def id(self) -> str:
        return self.func.__name__


class Checks:
    """A kata's checks in the order they are shown."""

    def __init__(self, kata: str):
        self.kata = kata
        self.all: list[Check] = []

    def add(self, title: str, *, uses: str):
        def register(func):
            if any(c.id == func.__name__ for c in self.all):
                raise ValueError(f"kata {self.kata}: two checks named {func.__name__}")
            self.all.append(Check(self.kata, title, func, uses, self.all))
            return func

        return register


@dataclass
class Result:
    check: Check
    status: str  # "pass" | "fail" | "not-implemented" | "timeout" | "not-run" (after a timeout) | "error" (a grader bug)
    message: str = ""
    diagnoses: list[str] = field(default_factory=list)
    seconds: float = 0.0
    failure: "Failure | None" = field(default=None, repr=False, compare=False)  # of a failed check, for ``explain``

    @property
    def passed(self) -> bool:
        return self.status == "pass"


class Api:
    """The learner's (or the reference's) names; a missing one is a clear failure."""

    def __init__(self, target: Target, accessed: list[str] | None = None):
        self._target = target
        self._accessed = [] if accessed is None else accessed  # names used, in order (a failure's culprit)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in self._target.namespace:
            raise Failure(report.MISSING_NAME.format(label=self._target.label, name=name), ("missing", name))
        self._accessed.append(name)
        return self._target.namespace[name]


class Ctx:
    """What a check body sees: the target under test (``t``), the reference (``ref``), the device."""

    def __init__(self, target: Target, reference: Target, device: torch.device, seed: int = 0):
        self.target = target
        self.reference = reference
        self.accessed: list[str] = []  # the target's names the running body used, in order (``Failure.culprit``)
        self.t = Api(target, self.accessed)
        self.ref = Api(reference)
        self.device = torch.device(device)
        self.seed = seed
        self.calls = 0  # forall/case calls of the running check so far
        self.shrinks = True  # a failing forall shrinks its input (a verdict alone needs none: run.mistake_status)
        self.running: str | None = None  # the id of the running check
        # call number -> (input, None or its Failure) in the order the running check ran them, until the
        # call's first failure (what shrinking tries next is not recorded: it differs between processes)
        self.seen: dict[int, list[tuple[object, Failure | None]]] = {}

    def with_target(self, target: Target, site: tuple[str, int] | None = None) -> "Ctx":
        """A context for ``target``; ``site`` (check id, forall/case call number): the one body it will run,
        for contexts that remember the reference's outputs per body."""
        return Ctx(target, self.reference, self.device, self.seed)

    # -- drawing inputs -------------------------------------------------------------------
    def forall(self, strategy: st.SearchStrategy, body: Callable, max_examples: int = 20) -> None:
        """Run ``body(ctx, example)`` on inputs drawn by ``strategy``; the first failure shrinks."""
        ctx = self
        self.calls += 1
        number = self.calls
        seen = self.seen.setdefault(number, [])

        def run(example):
            if seen and seen[-1][1] is not None:  # shrinking
                return run_body(ctx, body, example)
            try:
                run_body(ctx, body, example)
            except Failure as failure:
                seen.append((example, failure))
                raise
            seen.append((example, None))

        with same_draws(), _site(number):
            self.explore(strategy, run, max_examples)

    def explore(self, strategy: st.SearchStrategy, test: Callable, max_examples: int) -> None:
        """Hypothesis runs ``test(example)`` on inputs drawn from ``strategy``, shrinks the first failure and
        raises it (a context that replays a remembered run walks it instead)."""
        phases = (Phase.explicit, Phase.generate) + ((Phase.shrink,) if self.shrinks else ())
        self.hypothesis_settings(max_examples, phases)(seed(self.seed)(given(strategy)(test)))()

    def hypothesis_settings(self, max_examples: int, phases) -> settings:
        """How ``forall`` runs Hypothesis (grader.engine.diagnosis draws the same examples again with it)."""
        return settings(max_examples=max(1, max_examples), deadline=None, database=None,
                        derandomize=False, phases=phases, suppress_health_check=list(HealthCheck),
                        report_multiple_bugs=False, verbosity=Verbosity.quiet, print_blob=False)

    def case(self, example: dict, body: Callable) -> None:
        """One pinned input."""
        self.calls += 1
        with _site(self.calls):
            try:
                run_body(self, body, example)
            except Failure as failure:
                self.seen[self.calls] = [(example, failure)]
                raise
        self.seen[self.calls] = [(example, None)]

    # -- what a context may know without running anything (defaults: nothing) ---------------------
    def examples_of(self, check: str, number: int) -> list | None:
        """The inputs the ``number``-th ``forall`` of ``check`` runs when they are fixed in advance (a
        record of them); None: Hypothesis draws them with this context's seed."""
        return None

    def outcome_of(self, mistake: str, check: str, number: int, example):
        """What a known mistake did in that body on that input, when this context knows it without
        running the mistake (a record of it); ``NOT_RECORDED``: run the mistake to know."""
        return NOT_RECORDED

    def status_of(self, mistake: str, check: str):
        """A known mistake's verdict on a whole check ("pass", "fail" or None), when this context knows it
        without running the mistake (a record of it); ``NOT_RECORDED``: run the mistake to know."""
        return NOT_RECORDED

    def learner_body(self, number: int, body: Callable, check: str) -> Callable:
        """``body`` of the ``number``-th forall/case call of ``check``, as it runs the learner's code here."""
        return body

    # -- comparing --------------------------------------------------------------------------
    def differential(self, example: dict, run: Callable, what: str = "") -> None:
        """Run ``run(api, example)`` on the reference and on the target; compare what they return."""
        expected = self.expected(example, run, what)
        self.compare(example, expected, run(self.t, example), what, run)

    def expected(self, example: dict, run: Callable, what: str = ""):
        """``run(api, example)`` on the reference (a context may remember it, or answer from a record)."""
        try:
            return run(self.ref, example)
        except BaseException as exc:
            raise GraderBug(f"the reference failed on {report.describe_input(example)}: {exc!r}") from exc

    def exact(self, example: dict, run: Callable, what: str = ""):
        """``run`` on the reference in float64, every drawn input rounded to the example's dtype first: the
        exact result of the inputs the target got (grader.engine.precision); None where there is none."""
        wide = precision.exact_example(example)
        if wide is None:
            return None
        try:
            with precision.rounded_inputs(example["dtype"]):
                return run(self.ref, wide)
        except BaseException:  # the body cannot run in float64: the floor comparison stands
            return None

    def compare(self, example: dict, expected, got, what: str = "", run: Callable | None = None) -> None:
        """Fail, with ``got`` as what was observed, unless it matches ``expected``; where a float result misses
        the floor and ``run`` is given, by the tolerance derived from the float64 run (grader.engine.precision)."""
        problem = report.compare(expected, got)
        if problem and run is not None:
            exact = self.exact(example, run, what)
            if exact is not None:
                problem = report.compare_derived(expected, exact, got)
        if problem:
            head = f"{what}\n  " if what else ""
            failure = Failure(f"{head}on input {report.describe_input(example)}\n  {problem}", observed=got)
            failure.culprit = named_first(problem, self.accessed)  # a result keyed by its call: that call
            if run is not None:  # worked out for the failure shown only, not for each input shrinking tries
                failure.addendum = lambda: self.narrower(example, run, expected, got)
            raise failure

    def narrower(self, example: dict, run: Callable, expected, got) -> str:
        """A line naming a narrower dtype than the example's when the learner's error is the size the reference
        itself errs in that dtype on these inputs (a softmax in float32 on float64 inputs); else nothing. A
        file that narrows one step errs less than the reference narrowed throughout, so sizes down to a
        hundredth of the reference's error count; of several such dtypes, the one whose error is closest."""
        mine = report.largest_error(expected, got)
        if not isinstance(example, dict) or not mine:
            return ""
        sizes = {}
        for narrow in precision.NARROWER.get(example.get("dtype"), ()):
            try:
                theirs = report.largest_error(expected, run(self.ref, {**example, "dtype": narrow}))
            except (Exception, GraderBug, Unrecorded):  # the reference does not run in that dtype here
                continue
            if theirs and theirs / 100 <= mine <= theirs * precision.REFERENCE_ERROR_FACTOR:
                sizes[narrow] = theirs
        if not sizes:
            return ""
        narrow = min(sizes, key=lambda n: abs(math.log(sizes[n] / mine)))
        return "\n  " + report.NARROWER.format(error=mine, dtype=str(example["dtype"]).removeprefix("torch."),
                                                narrow=str(narrow).removeprefix("torch."), theirs=sizes[narrow])

    def fail(self, message: str, example: dict | None = None, observed=UNSET, culprit: str | None = None) -> None:
        """Fail with ``message``; ``culprit``: the API name whose result differed, where the message does not
        begin with it (the pointer's "start with task N" follows it)."""
        where = f"on input {report.describe_input(example)}\n  " if example is not None else ""
        failure = Failure(f"{where}{message}", observed)
        failure.culprit = culprit
        raise failure

    def call(self, fn: Callable, *args, **kwargs):
        """Call learner code and fail if it modified any tensor argument in place."""
        before = [(name, value, _snapshot(value)) for name, value in _named_args(fn, args, kwargs)]
        result = fn(*args, **kwargs)
        for name, value, snap in before:
            if not _same_snapshot(value, snap):
                call = getattr(fn, "__qualname__", getattr(fn, "__name__", "your function"))
                raise Failure(report.MUTATED.format(call=call, arg=name), ("mutated", name))
        return result

    def raises(self, error: type[BaseException], fn: Callable, *args, what: str, example: dict | None = None, **kwargs):
        """The learner's ``fn(*args)`` must raise ``error`` (bad input); returns the exception."""
        try:
            fn(*args, **kwargs)
        except error as exc:
            return exc
        except NotImplementedError:
            raise
        except Exception as exc:
            self.fail(f"{what}: expected {error.__name__}, your code raised {type(exc).__name__}: {exc}",
                      example, ("raised", type(exc).__name__, what))
        self.fail(f"{what}: expected {error.__name__}, your code raised nothing", example,
                  ("no error", error.__name__, what))


@contextmanager
def _site(number: int):
    """Tag a failure with the forall/case call it came from."""
    try:
        yield
    except Failure as failure:
        if failure.site is None:
            failure.site = number
        raise


@contextmanager
def same_draws():
    """Draw without the constants that recent Hypothesis versions mine from local modules.

    Those constants come from whatever is in sys.modules — the learner's file, the mistake
    catalogue — so the inputs drawn would depend on what happens to be imported, and a learner's
    own literals could steer them. Grading must draw the same inputs everywhere.
    """
    try:
        from hypothesis.internal.conjecture import providers

        original, empty = providers._get_local_constants, providers.Constants()
    except (ImportError, AttributeError):  # a Hypothesis without the feature
        yield
        return
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = original
        providers.CONSTANTS_CACHE.cache.clear()


def named_first(text: str, names: list[str]) -> str | None:
    """The name of ``names`` that ``text`` begins with as a call or attribute (``kv_cache_bytes(…``), else None."""
    for name in sorted(set(names), key=len, reverse=True):
        if text.startswith(name) and not (text[len(name):len(name) + 1].isalnum() or text[len(name):len(name) + 1] == "_"):
            return name
    return None


def run_body(ctx: Ctx, body: Callable, example) -> None:
    """Run one body on one input, classifying what the target's code did. A failure's ``culprit`` is the
    API name whose result differed where the comparison knows it (else grade.culprit reads the message)."""
    ctx.accessed.clear()
    try:
        body(ctx, example)
    except Failure as failure:
        failure.example, failure.body = example, body
        if isinstance(example, dict) and "on input" not in failure.message:
            failure.message = f"on input {report.describe_input(example)}\n  {failure.message}"
        raise
    except NotImplementedError as exc:
        name = innermost_learner_function(exc, ctx.target)
        if name is None:
            raise _crash(exc, ctx, example, body) from None
        raise NotImplementedYet(name) from None
    except (Exception, SystemExit, GeneratorExit) as exc:
        raise _crash(exc, ctx, example, body) from exc


def _crash(exc: BaseException, ctx: Ctx, example, body) -> Failure:
    error = f"{type(exc).__name__}: {exc}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if ctx.target.owns(f.filename)]
    where = f"on input {report.describe_input(example)}\n  " if isinstance(example, dict) else ""
    if frames:
        trace = "".join(traceback.format_list(frames)).rstrip()
        failure: Failure = LearnerCrash(f"{where}{report.CRASHED.format(error=error)}\n{trace}",
                                        ("raised", type(exc).__name__, str(exc)), trace)
    else:
        failure = Failure(f"{where}{report.GRADER_HIT.format(error=error)}", ("grader-hit", type(exc).__name__))
    failure.example, failure.body = example, body
    return failure


def innermost_learner_function(exc: BaseException, target: Target) -> str | None:
    """The learner function that raised NotImplementedError itself (a stub), else None.

    A NotImplementedError raised inside a library the learner called is a crash, not a stub.
    """
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return getattr(code, "co_qualname", code.co_name) if target.owns(code.co_filename) else None


def _named_args(fn, args, kwargs):
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
        return list(bound.items())
    except (TypeError, ValueError):
        return [(f"#{i + 1}", a) for i, a in enumerate(args)] + list(kwargs.items())


def _snapshot(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_snapshot(v) for v in value)
    return None


def _same_snapshot(value, snap) -> bool:
    if isinstance(value, torch.Tensor):
        return value.shape == snap.shape and torch.equal(value.detach(), snap)
    if isinstance(value, (tuple, list)):
        return len(value) == len(snap) and all(_same_snapshot(v, s) for v, s in zip(value, snap))
    return True


class Alarm:
    """What a ``time_limit`` did: ``fired`` is the CheckTimeout it raised, or None while the time has not run out.
    A library between the limit and its caller may turn that exception into one of its own (Hypothesis, replaying
    an example, calls a CheckTimeout "flaky"): the caller asks ``fired``, not the exception it received."""

    def __init__(self):
        self.fired: CheckTimeout | None = None


@contextmanager
def time_limit(seconds: float | None):
    """Raise CheckTimeout in the main thread after ``seconds`` (no limit elsewhere or when None); yields an Alarm."""
    alarm = Alarm()
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield alarm
        return

    def on_alarm(signum, frame):
        alarm.fired = CheckTimeout()
        raise alarm.fired

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield alarm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
