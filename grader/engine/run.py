"""Run one check: whatever the learner's code does becomes a ``Result``, and a failure names the
known mistakes that behave like it (grader.engine.diagnosis)."""
from __future__ import annotations

import time
import traceback

from grader.engine import diagnosis, hangs, report
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
    except CheckTimeout as exc:
        hung = hangs.stop(ctx.target, exc, check.title, check.uses)
        message = report.TIMED_OUT.format(seconds=timeout) + (hangs.HUNG_IN.format(name=hung) if hung else "")
        return Result(check, "timeout", message, seconds=time.perf_counter() - started)
    except hangs.NotRun as exc:
        return Result(check, "not-run", exc.message, seconds=time.perf_counter() - started)
    except Failure as failure:
        failed = Result(check, "fail", failure.message, seconds=time.perf_counter() - started, failure=failure)
        return explain(failed, ctx, mistakes) if mistakes else failed
    except (GraderBug, Exception) as exc:  # not the learner's doing: say so plainly, with the trace
        trace = "".join(traceback.format_exception(exc)).rstrip()
        return Result(check, "error", f"internal grader error (not your fault; please report it):\n{trace}",
                      seconds=time.perf_counter() - started)
    return Result(check, "pass", seconds=time.perf_counter() - started)


def explain(result: Result, ctx: Ctx, mistakes) -> Result:
    """A failed check's result with the known mistakes that behave like the learner's code named (and
    their hints); call it before ``ctx`` runs another check, whose inputs would replace this one's."""
    if result.failure is None or not mistakes:
        return result
    started = time.perf_counter()
    diagnoses = diagnose(result.failure, ctx, mistakes, result.check)
    message = result.message
    for mistake in diagnoses:
        first = mistake.why.split(" ", 1)[0]
        why = mistake.why[:1].upper() + mistake.why[1:] if first.isalpha() else mistake.why  # not "X.repeat"
        message += "\n  " + report.DIAGNOSIS.format(name=mistake.name, why=why, hint=mistake.hint)
    return Result(result.check, "fail", message, [m.name for m in diagnoses],
                  result.seconds + time.perf_counter() - started, result.failure)


def diagnose(failure: Failure, ctx: Ctx, mistakes, check: Check | None = None) -> list:
    """The known mistakes that behave exactly like the learner's code (see grader.engine.diagnosis)."""
    return diagnosis.diagnose(failure, ctx, mistakes, check)
