"""Naming known mistakes: which mistakes of the catalogue behave like the learner's code.

A mistake that gives the learner's output on the failing input is only a suspect: a small shrunk
input can make two different bugs look alike. A suspect is named only when it also behaves like
the learner's code (passes where it passes, fails with the same output where it fails) on up to
``CONFIRM`` further inputs of the same check: the inputs the check ran before it failed (what the
learner's code did there is known already), then, when it failed early, further examples that its
``ctx.forall`` calls draw with the check's seed, and its ``ctx.case`` inputs. Inputs on which the
suspects behave differently (from each other, or from a correct program) go first.

A check may not tell two suspects apart (the same wrong forward pass, say, from a wrong helper or
a wrong call of a right one), or may fail every wrong program alike. So the suspects left must
also do what the learner's code does on a few inputs of the kata's other checks on which they
differ, or, for a single suspect, on which it fails; where no input separates two, both are named.

A run on a further input has ``FURTHER_SECONDS``; one that runs out tells nothing. On a busy machine a
run that never hangs can still run out (a check that starts processes, with every core taken), so a suspect
whose run ran out where the learner's code finished is run again with the failing input's limit before it
is judged, and a run that ran out is never taken for what a longer limit would tell.

The checks' inputs are listed by running a check function with a context whose ``forall`` and
``case`` only write down what they were given (``Lister``). The classroom's replay side
(grader.classroom.cohort.replay) answers the same questions from the record of the learner's run.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

from hypothesis import Phase, given, seed

from grader.engine import report
from grader.engine.core import (NOT_RECORDED, UNSET, CheckTimeout, Ctx, Failure, GraderBug, NotImplementedYet,
                                Unrecorded, run_body, same_draws, time_limit)
from grader.engine.targets import Target

CONFIRM = 6  # further inputs the learner's code runs on, at most
POOL = 10  # inputs the suspects run on, to choose those ``CONFIRM`` from
SIBLINGS = 64  # inputs of the kata's other checks looked at, at most, to tell suspects apart
APART = 2  # of those, inputs that tell the suspects apart, enough to settle it
SECONDS = 10.0  # one run of one body on the failing input
FURTHER_SECONDS = 2.0  # one run on a further input (they are small; one that takes longer tells nothing)
PASS = ("pass",)


@dataclass
class Site:
    """One ``forall`` (``strategy`` set) or ``case`` (``example`` set) call of a check; ``number`` counts from 1."""

    number: int
    body: Callable
    strategy: object = None
    example: object = None
    max_examples: int = 0


class Lister(Ctx):
    """Runs a check function only to write down its ``forall`` and ``case`` calls."""

    def __init__(self, like: Ctx):  # no learner code: a check that calls it outside a body lists nothing
        super().__init__(Target("listing", "<listing>", {}), like.reference, like.device, like.seed)
        self.sites: list[Site] = []

    def forall(self, strategy, body: Callable, max_examples: int = 20) -> None:
        self.sites.append(Site(len(self.sites) + 1, body, strategy=strategy, max_examples=max_examples))

    def case(self, example, body: Callable) -> None:
        self.sites.append(Site(len(self.sites) + 1, body, example=example))


_LISTED: dict[tuple, list[Site]] = {}  # the same check lists the same calls, and draws the same examples
_DRAWN: dict[tuple, list] = {}


def sites(check, ctx: Ctx) -> list[Site]:
    """The check's ``forall`` and ``case`` calls, in order; none when the check cannot be listed."""
    key = (check.kata, check.id, str(ctx.device))
    if key not in _LISTED:
        lister = Lister(ctx)
        try:
            check.func(lister)
        except Exception:  # a check that needs more than its context to list its inputs: no further inputs
            lister.sites = []
        _LISTED[key] = lister.sites
    return _LISTED[key]


def drawn(ctx: Ctx, check, site: Site) -> list:
    """The examples ``ctx.forall`` generates for ``site`` (the same seed, the same settings), or its case."""
    if site.strategy is None:
        return [site.example]
    recorded = ctx.examples_of(check.id, site.number)  # a handout's public checks run the recorded inputs
    if recorded is not None:
        return recorded
    key = (check.kata, check.id, str(ctx.device), site.number, ctx.seed)
    if key not in _DRAWN:
        _DRAWN[key] = _draw(ctx, site)
    return _DRAWN[key]


def _draw(ctx: Ctx, site: Site) -> list:
    examples = []

    @ctx.hypothesis_settings(site.max_examples, (Phase.explicit, Phase.generate))
    @seed(ctx.seed)
    @given(site.strategy)
    def collect(example):
        examples.append(example)

    with same_draws():
        collect()
    unique = {repr(e): e for e in examples}
    return list(unique.values())


@dataclass(frozen=True)
class RanOut:
    """What a run did when it was stopped after ``seconds``: nothing known (a longer limit may tell)."""

    seconds: float


def attempt(ctx: Ctx, body: Callable, example, seconds: float):
    """``outcome``, except that a run stopped by its time limit gives ``RanOut(seconds)``."""
    alarm = did = None
    try:
        with time_limit(seconds) as alarm:
            try:
                run_body(ctx, body, example)
                did = PASS
            except Failure as failure:
                did = ("fail", failure.observed, failure.message)
            except (Unrecorded, GraderBug, CheckTimeout, NotImplementedYet):
                did = None
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                did = ("other", type(exc).__name__)
    except CheckTimeout:  # the time ran out as the limit was set or lifted, outside the run
        pass
    return RanOut(seconds) if alarm is None or alarm.fired is not None else did  # the alarm decides, whatever
    # caught its exception


def outcome(ctx: Ctx, body: Callable, example, seconds: float | None = None):
    """What ``body`` did on ``example``: PASS, ("fail", observed, message), ("other", kind), or None
    when it tells nothing (the reference itself failed, the run took too long, the code is a stub
    there, or the learner's run was not recorded); ``seconds`` defaults to ``FURTHER_SECONDS``."""
    did = attempt(ctx, body, example, FURTHER_SECONDS if seconds is None else seconds)
    return None if isinstance(did, RanOut) else did


def agree(learner, theirs) -> bool:
    """Whether a mistake did what the learner's code did (outputs compared as the checks compare)."""
    if learner is None or theirs is None or learner[0] != theirs[0]:
        return False
    if learner[0] != "fail":
        return learner == theirs
    if learner[1] is UNSET or theirs[1] is UNSET:
        return learner[1] is theirs[1] and learner[2] == theirs[2]
    if isinstance(learner[1], tuple) and learner[1][:1] == ("grader-hit",):
        return False  # the grader tripped over an odd result: says nothing about which bug made it
    try:
        return report.compare(learner[1], theirs[1]) is None
    except Exception:
        return False


def pool(check, ctx: Ctx, failure: Failure) -> list[tuple]:
    """Up to ``POOL`` (check, site, input, what the learner's code did there or None) of the failing
    check, the failing input aside: first the inputs the check ran before it failed (the failing
    call's own first, the unshrunk failure among them), then, when the check failed early, further
    inputs of the failing call and the calls after it."""
    listed = sites(check, ctx)
    if not listed or failure.site is None or failure.site > len(listed):
        return []
    have = {(failure.site, repr(failure.example))}
    known = []
    for site in listed[:failure.site]:
        for example, theirs in ctx.seen.get(site.number, []):
            if (site.number, repr(example)) not in have:
                have.add((site.number, repr(example)))
                learner = PASS if theirs is None else ("fail", theirs.observed, theirs.message)
                known.append((check, site, example, learner))
    chosen = sorted(known, key=lambda item: item[1].number != failure.site)[:POOL]  # stable: in the order run
    for site in listed[failure.site - 1:]:
        for example in drawn(ctx, check, site) if len(chosen) < POOL else ():
            if (site.number, repr(example)) not in have and len(chosen) < POOL:
                have.add((site.number, repr(example)))
                chosen.append((check, site, example, None))
    return chosen


def siblings(check, ctx: Ctx, per_call: int = 3):
    """(check, site, input) of the kata's other checks, lazily: every pinned case first (written to
    tell bugs apart, and nothing to draw), then a few drawn inputs of each ``forall``."""
    others = [(other, sites(other, ctx)) for other in check.family if other.id != check.id]
    for other, listed in others:
        for site in listed:
            if site.strategy is None:
                yield other, site, site.example, None
    for other, listed in others:
        for site in listed:
            if site.strategy is not None:
                for example in drawn(ctx, other, site)[:per_call]:
                    yield other, site, example, None


def kinds(runs: list) -> int:
    """How many different behaviours ``runs`` show."""
    seen: list = []
    for run in runs:
        if run is not None and not any(agree(s, run) and agree(run, s) for s in seen):
            seen.append(run)
    return len(seen)


def narrow(ctx: Ctx, inputs: list, theirs: dict, suspects: list, order: list[int]) -> tuple[list, int]:
    """The suspects that do what the learner's code does on the first ``CONFIRM`` inputs of ``order``
    whose outcome for the learner is known; and how many such inputs there were."""
    alive, compared = list(suspects), 0
    for i in order:
        if compared == CONFIRM or not alive:
            break
        check, site, example, learner = inputs[i]
        if learner is None:  # not run while the check ran: run it now
            learner = outcome(ctx, ctx.learner_body(site.number, site.body, check.id), example)
        if learner is None:
            continue
        compared += 1
        alive = [(m, t) for m, t in alive if agree(learner, theirs[m.name][i]) or judged(ctx, m, t, inputs[i], learner)]
    return alive, compared


def judged(ctx: Ctx, mistake, target, item: tuple, learner) -> bool:
    """Whether ``mistake`` does what the learner's code did (``learner``, known) on ``item``, its further run
    given the failing input's limit when the short one ran out (remembered: a run that finished is not repeated)."""
    check, site, example, _ = item
    return agree(learner, theirs(ctx, mistake, target, check.id, site.number, site.body, example, SECONDS))


_THEIRS: dict[tuple, object] = {}  # what a known mistake did on an input: the same every time it is asked
REMEMBERED = 50_000  # entries of _THEIRS kept at most (a long classroom run meets many failing inputs)


def theirs(ctx: Ctx, mistake, target, check_id: str, site_number: int, body: Callable, example,
           seconds: float | None = None):
    """``outcome`` of a known mistake, remembered (per check, call, input, device and seed); a run that ran
    out is run again when asked with a longer limit. ``seconds`` defaults to ``FURTHER_SECONDS``."""
    seconds = FURTHER_SECONDS if seconds is None else seconds
    recorded = ctx.outcome_of(mistake.name, check_id, site_number, example)  # a handout: what it was recorded doing
    if recorded is not NOT_RECORDED:
        return recorded
    key = (mistake.name, target.filename, check_id, site_number, repr(example), str(ctx.device), ctx.seed)
    known = _THEIRS.get(key)
    if key not in _THEIRS or (isinstance(known, RanOut) and known.seconds < seconds):
        if len(_THEIRS) >= REMEMBERED:
            _THEIRS.clear()
        site = (check_id, site_number) if site_number else None
        _THEIRS[key] = attempt(ctx.with_target(target, site), body, example, seconds)
    did = _THEIRS[key]
    return None if isinstance(did, RanOut) else did


STATUSES: dict[tuple, str | None] = {}  # a known mistake's verdict on a whole check (grader.engine.run.reconcile)


def forget() -> None:
    """Drop what this process remembers (listed calls, drawn inputs, mistakes' outcomes and verdicts): the
    project's tests start each test from nothing, so that no test's time depends on the tests before."""
    for memory in (_LISTED, _DRAWN, _THEIRS, STATUSES):
        memory.clear()


def runs(inputs: list, ctx: Ctx, suspects: list) -> dict:
    return {m.name: [theirs(ctx, m, t, c.id, site.number, site.body, e) for c, site, e, _ in inputs]
            for m, t in suspects}


def confirm(check, ctx: Ctx, failure: Failure, suspects: list) -> list:
    """The suspects (mistake, target) that also behave like the learner's code on further inputs:
    the failing check's, then inputs of the kata's other checks (``settle``)."""
    inputs = pool(check, ctx, failure)
    if inputs:
        theirs = runs(inputs, ctx, suspects)
        order = sorted(range(len(inputs)), key=lambda i: -kinds([PASS] + [r[i] for r in theirs.values()]))
        alive, compared = narrow(ctx, inputs, theirs, suspects, order)
        suspects = alive if compared else suspects
    return settle(check, ctx, suspects) if suspects else []


def settle(check, ctx: Ctx, suspects: list) -> list:
    """The suspects that also do what the learner's code does on up to ``APART`` inputs of the kata's
    other checks that tell them apart from each other or, for a single suspect, on which it fails: a
    check whose failures all look alike (a wrong value, whatever it was) cannot tell bugs apart."""
    alive, compared = list(suspects), 0
    for item in itertools.islice(siblings(check, ctx), SIBLINGS):
        did = runs([item], ctx, alive)
        outs = [r[0] for r in did.values()]
        if not (kinds(outs) > 1 or (len(alive) == 1 and kinds([PASS] + outs) > 1)):
            continue
        other, site, example, _ = item
        learner = outcome(ctx, ctx.learner_body(site.number, site.body, other.id), example)
        if learner is None:  # not known (a task not started yet, say): tells nothing
            continue
        compared += 1
        alive = [(m, t) for m, t in alive if agree(learner, did[m.name][0]) or judged(ctx, m, t, item, learner)]
        if compared == APART or not alive:
            break
    return [m for m, _ in alive]  # where no input tells two apart, each is named


def diagnose(failure: Failure, ctx: Ctx, mistakes, check=None) -> list:
    """The known mistakes that behave exactly like the learner's code on the failing input and on
    further inputs of the same check."""
    if failure.observed is UNSET or failure.body is None:
        return []
    if isinstance(failure.observed, tuple) and failure.observed[:1] == ("grader-hit",):
        return []  # the grader tripped over an odd result: every mistake would "match"
    suspects = []
    for mistake, target in mistakes:
        did = theirs(ctx, mistake, target, str(ctx.running), failure.site or 0, failure.body, failure.example, SECONDS)
        if did is not None and did[0] == "fail" and agree(("fail", failure.observed, failure.message), did):
            suspects.append((mistake, target))
    if not suspects or check is None:
        return [m for m, _ in suspects]
    return confirm(check, ctx, failure, suspects)
