"""Run one check: whatever the learner's code does becomes a ``Result``, and a failure names the
known mistakes that behave like it (grader.engine.diagnosis). Once a grading is over, ``reconcile``
keeps a name only where that mistake agrees with the learner's file on every check both were graded
on: it passes where the file passes and fails where the file fails (SPEC, "The grader")."""
from __future__ import annotations

import time
import traceback

from grader.engine import diagnosis, hangs, report
from grader.engine.core import (NOT_RECORDED, Check, CheckTimeout, Ctx, Failure, GraderBug, NotImplementedYet, Result,
                                time_limit)

STATUS_SECONDS = 30.0  # one check run on a known mistake, to compare its verdict with the learner's


def run_check(check: Check, ctx: Ctx, mistakes=(), timeout: float | None = 60.0) -> Result:
    """Run one check; never raises for anything the learner's code does."""
    started = time.perf_counter()
    ctx.calls, ctx.running, ctx.seen = 0, check.id, {}
    alarm = None
    try:
        with time_limit(timeout) as alarm:
            check.func(ctx)
    except NotImplementedYet as exc:
        return Result(check, "not-implemented", report.NOT_IMPLEMENTED.format(name=exc.name),
                      seconds=time.perf_counter() - started)
    except CheckTimeout as exc:
        return _timed_out(check, ctx, exc, timeout, started)
    except hangs.NotRun as exc:
        return Result(check, "not-run", exc.message, seconds=time.perf_counter() - started)
    except Failure as failure:
        if failure.addendum is not None:
            failure.message, failure.addendum = failure.message + failure.addendum(), None
        failed = Result(check, "fail", failure.message, seconds=time.perf_counter() - started, failure=failure)
        return explain(failed, ctx, mistakes) if mistakes else failed
    except (GraderBug, Exception) as exc:  # not the learner's doing: say so plainly, with the trace
        if alarm is not None and alarm.fired is not None:  # the time ran out, and a library renamed the timeout
            return _timed_out(check, ctx, alarm.fired, timeout, started)
        trace = "".join(traceback.format_exception(exc)).rstrip()
        return Result(check, "error", f"internal grader error (not your fault; please report it):\n{trace}",
                      seconds=time.perf_counter() - started)
    return Result(check, "pass", seconds=time.perf_counter() - started)


def _timed_out(check: Check, ctx: Ctx, exc: CheckTimeout, timeout: float | None, started: float) -> Result:
    hung = hangs.stop(ctx.target, exc, check.title, check.uses)
    message = report.TIMED_OUT.format(seconds=timeout) + (hangs.HUNG_IN.format(name=hung) if hung else "")
    return Result(check, "timeout", message, seconds=time.perf_counter() - started)


def explain(result: Result, ctx: Ctx, mistakes) -> Result:
    """A failed check's result with the known mistakes that behave like the learner's code named (and
    their hints); call it before ``ctx`` runs another check, whose inputs would replace this one's."""
    if result.failure is None or not mistakes:
        return result
    started = time.perf_counter()
    diagnoses = diagnose(result.failure, ctx, mistakes, result.check)
    message = result.message + "".join(_line(mistake) for mistake in diagnoses)
    return Result(result.check, "fail", message, [m.name for m in diagnoses],
                  result.seconds + time.perf_counter() - started, result.failure)


def _line(mistake) -> str:
    """The lines ``explain`` adds to a failed check's message for one named mistake."""
    first = mistake.why.split(" ", 1)[0]
    why = mistake.why[:1].upper() + mistake.why[1:] if first.isalpha() else mistake.why  # not "X.repeat"
    return "\n  " + report.DIAGNOSIS.format(name=mistake.name, why=why, hint=mistake.hint)


def mistake_status(ctx: Ctx, mistake, target, check: Check) -> str | None:
    """"pass" or "fail": what ``check`` says of a known mistake (a handout answers from its record); None
    when that tells nothing (it timed out, was not started, or cannot be run here)."""
    recorded = ctx.status_of(mistake.name, check.id)
    if recorded is not NOT_RECORDED:
        return recorded
    if target is None:
        return None
    key = (mistake.name, target.filename, check.kata, check.id, str(ctx.device), ctx.seed)
    if key not in diagnosis.STATUSES:  # the same every time it is asked
        theirs = ctx.with_target(target)
        theirs.shrinks = False
        status = run_check(check, theirs, (), STATUS_SECONDS).status
        diagnosis.STATUSES[key] = status if status in ("pass", "fail") else None
    return diagnosis.STATUSES[key]


def reconcile(results: list[Result], ctx: Ctx, mistakes) -> list[Result]:
    """``results`` with each named mistake kept only where it agrees with the learner's file on every check
    both were graded on (passing where the file passes, failing where it fails): a name that contradicts
    another check's verdict names the wrong mistake, and is dropped from every result. A name kept is
    explained, with its hint, under the first check that names it; later ones refer to that check."""
    named = {name for r in results for name in r.diagnoses}
    if not named:
        return results
    known = {m.name: (m, t) for m, t in mistakes}
    verdicts = [(r.check, r.status) for r in results if r.status in ("pass", "fail")]
    wrong = {name for name in named if name not in known
             or any(mistake_status(ctx, *known[name], check) not in (None, status) for check, status in verdicts)}
    kept = []
    for r in results:
        if not wrong & set(r.diagnoses):
            kept.append(r)
            continue
        message = r.message
        for name in wrong & set(r.diagnoses):
            message = message.replace(_line(known[name][0]), "", 1) if name in known else message
        kept.append(Result(r.check, r.status, message, [n for n in r.diagnoses if n not in wrong], r.seconds, r.failure))
    return once(kept, {name: known[name][0] for name in named - wrong})


def once(results: list[Result], mistakes: dict) -> list[Result]:
    """Each named mistake's explanation and hint (``mistakes``: name -> mistake) in full under the first check
    that names it; a later check that names it too says so in one line, naming that first check."""
    first: dict[str, str] = {}
    shown = []
    for r in results:
        message = r.message
        for name in r.diagnoses:
            if name not in mistakes:
                continue
            if name not in first:
                first[name] = r.check.title
            elif _line(mistakes[name]) in message:
                message = message.replace(_line(mistakes[name]), "\n  " + report.SAME_DIAGNOSIS.format(
                    name=name, check=first[name]), 1)
        shown.append(r if message == r.message else
                     Result(r.check, r.status, message, r.diagnoses, r.seconds, r.failure))
    return shown


def diagnose(failure: Failure, ctx: Ctx, mistakes, check: Check | None = None) -> list:
    """The known mistakes that behave exactly like the learner's code (see grader.engine.diagnosis)."""
    return diagnosis.diagnose(failure, ctx, mistakes, check)
