"""Run one check: whatever the learner's code does becomes a ``Result``, and a failure names the
known mistakes that behave like it (grader.engine.diagnosis)."""
from __future__ import annotations

import time
import traceback

from grader.engine import diagnosis, report
from grader.engine.core import Check, CheckTimeout, Ctx, Failure, GraderBug, NotImplementedYet, Result, time_limit


def run_check(check: Check, ctx: Ctx, mistakes=(), timeout: float | None = 60.0) -> Result:
    """Run one check; never raises for anything the learner's code does."""
    started = time.perf_counter()
    ctx.calls, ctx.running, ctx.seen = 0, check.id, {}
    try:
        with time_limit(timeout):
            check.func(ctx)
    except NotImplementedYet as exc:
        return Result(check, "not-implemented", report.NOT_IMPLEMENTED.format(name=exc.name),
                      seconds=time.perf_counter() - started)
    except CheckTimeout:
        return Result(check, "timeout", report.TIMED_OUT.format(seconds=timeout), seconds=time.perf_counter() - started)
    except Failure as failure:
        return _failed(check, failure, ctx, mistakes, started)
    except (GraderBug, Exception) as exc:  # not the learner's doing: say so plainly, with the trace
        trace = "".join(traceback.format_exception(exc)).rstrip()
        return Result(check, "error", f"internal grader error (not your fault; please report it):\n{trace}",
                      seconds=time.perf_counter() - started)
    return Result(check, "pass", seconds=time.perf_counter() - started)


def _failed(check: Check, failure: Failure, ctx: Ctx, mistakes, started: float) -> Result:
    diagnoses = diagnose(failure, ctx, mistakes, check)
    message = failure.message
    for mistake in diagnoses:
        first = mistake.why.split(" ", 1)[0]
        why = mistake.why[:1].upper() + mistake.why[1:] if first.isalpha() else mistake.why  # not "X.repeat"
        message += "\n  " + report.DIAGNOSIS.format(name=mistake.name, why=why, hint=mistake.hint)
    return Result(check, "fail", message, [m.name for m in diagnoses], time.perf_counter() - started)


def diagnose(failure: Failure, ctx: Ctx, mistakes, check: Check | None = None) -> list:
    """The known mistakes that behave exactly like the learner's code (see grader.engine.diagnosis)."""
    return diagnosis.diagnose(failure, ctx, mistakes, check)
