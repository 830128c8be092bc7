"""The grader's side of ``kvkata grade``: turn what a worker recorded into one honest row.

Runs in the parent process, which never executes learner code. Every check is replayed against
the reference (grader.classroom.cohort.replay); the record is read with ``weights_only=True`` (grader.engine.plain), so a
forged or corrupt record can fail a check, never crash this process or pass a check by itself.
"""
from __future__ import annotations

import collections
import signal
from functools import lru_cache

from grader import checks, manifest, mistakes
from grader.engine import Ctx, GraderBug, plain, reconcile, report, Result, run_check, targets
from grader.classroom.cohort.replay import UNVERIFIED, NeedsLearner, ReplayCtx

TAMPERED = "your code tampered with the grader ({what}); every check of this kata fails"
NOT_RUN_TIME = "not run: the time limit of {seconds:g} s for this kata was reached"
NOT_RUN_DIED = "not run: the process running your code died before this check ({how})"
NOT_STARTED = "the grader could not start, so the submission was not run (not the student's fault): {why}"
MISSING_FILE = "no {file} in this submission"
KNOWN = ("pass", "fail", "not-implemented", "timeout", "not-run", "error")
NOTE_LIMIT = 300  # characters of a row's note (the CSV's last column); longer notes are cut at a word


@lru_cache(maxsize=None)
def _reference(kata_id: str) -> targets.Target:
    return targets.reference(manifest.get(kata_id))


def _strings(value) -> set[str]:
    return {str(v) for v in value} if isinstance(value, (list, tuple)) else set()


def _read(path):
    """A record, None when absent or empty (the worker never wrote it), or {"unreadable": why} when it is
    not plain data."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        data = plain.load(path)
    except Exception as exc:
        return {"unreadable": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    return data if isinstance(data, dict) else {"unreadable": "not a record"}


def _caught(path) -> set[str]:
    """What the worker's guard caught as it happened (its first lines; a submission can only accuse itself)."""
    try:
        with open(path, "rb") as log:
            text = log.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return set()
    return {line.strip() for line in text.splitlines()[:20] if line.strip()}


def judge_check(check, record: dict, settings, kata: manifest.Kata, others: dict | None = None,
                memo=None) -> Result:
    """Replay one check; where replay needs the learner's objects, the worker's verdict stands.
    ``others``: the records of the kata's other checks by check id, which naming a mistake may consult;
    ``memo``: the reference's outputs remembered across the cohort (grader.classroom.cohort.memo), or None."""
    status, message = record.get("status"), str(record.get("message", ""))
    if status in ("timeout", "not-run"):  # nothing to replay: the check, or the function it calls, hung
        return Result(check, status, message)
    executions = record.get("executions")
    ctx = ReplayCtx(executions if isinstance(executions, dict) else {}, kata.stub, _reference(kata.id),
                    settings.device, settings.seed, memo)
    ctx.others = {k: v["executions"] for k, v in (others or {}).items() if isinstance(v.get("executions"), dict)}
    try:
        return run_check(check, ctx, mistakes.load(kata.id), None)
    except NeedsLearner:
        return Result(check, status if status in KNOWN else "fail", message)
    except GraderBug as exc:
        return Result(check, "fail", f"the grader itself failed on this check (not your fault): {exc}")
    except Exception as exc:  # a record that does not add up
        return Result(check, "fail", UNVERIFIED.format(why=f"{type(exc).__name__}: {exc}"))


def _how(run) -> str:
    code = run.returncode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}" + (" — out of memory?" if name in ("SIGKILL", "SIGSEGV", "SIGABRT") else "")
    return f"exited with code {code}"


def results(run, settings, memo=None) -> tuple[list[Result], list[str], dict | None, bool]:
    """Every check's result, what tampering was seen, the load error and whether the run finished."""
    kata = run.job.kata
    out = run.sandbox / "out"
    load, done = _read(out / "load.pt"), _read(out / "done.pt")
    found = _strings((load or {}).get("tamper")) | _strings((done or {}).get("tamper")) | _caught(out / "tamper.txt")
    made, kata_checks = [], checks.for_kata(kata.id).all
    records = [_read(out / f"check-{index:03d}.pt") for index in range(len(kata_checks))]
    others = {c.id: r for c, r in zip(kata_checks, records)
              if isinstance(r, dict) and "unreadable" not in r and r.get("check") == c.id}
    for check, record in zip(kata_checks, records):
        if load and "error" in load:
            made.append(Result(check, "fail", report.LOAD_FAILED.format(reason=load["error"])))
        elif record is None:
            reason = NOT_RUN_TIME.format(seconds=settings.timeout) if run.timed_out else NOT_RUN_DIED.format(how=_how(run))
            made.append(Result(check, "not-run" if run.timed_out else "fail", reason))
        elif "unreadable" in record or record.get("check") != check.id:
            made.append(Result(check, "fail", UNVERIFIED.format(why=record.get("unreadable", "another check's record"))))
        else:
            found |= _strings(record.get("tamper"))
            made.append(judge_check(check, record, settings, kata, others, memo))
    if found:
        what = report.clip("; ".join(sorted(map(str, found))), 500)
        made = [Result(r.check, "fail", TAMPERED.format(what=what)) for r in made]
    elif any(r.diagnoses for r in made):  # a name must agree with every check's verdict (grader.engine.run)
        ctx = Ctx(targets.Target("the submission", "<submission>", {}), _reference(kata.id), settings.device,
                  settings.seed)
        made = reconcile(made, ctx, mistakes.load(kata.id))
    finished = done is not None or bool(load and "error" in load)
    return made, sorted(map(str, found)), load, finished


def startup_failure(run) -> str:
    """Why a worker stopped before the learner's code ran: the last line it printed, and how it ended."""
    if run.startup_timed_out:
        return f"the worker did not start within {run.seconds:.0f} s"
    lines = [line.strip() for line in run.output.decode("utf-8", errors="replace").splitlines() if line.strip()]
    return (f"{report.clip(lines[-1], NOTE_LIMIT)} — " if lines else "") + f"the worker {_how(run)}"


def status_and_note(run, made: list[Result], tamper: list[str], load: dict | None, finished: bool) -> tuple[str, str]:
    if tamper:  # its own status, whatever happened next (a crash, a timeout): every check of the kata fails for it
        return "tampered", report.clip("tampered with the grader: " + "; ".join(tamper), NOTE_LIMIT)
    if run.timed_out:
        return "timeout", f"stopped at the time limit after {run.seconds:.0f} s"
    if load and "error" in load:
        return "crash", report.clip((str(load["error"]).splitlines() or ["could not import the file"])[0], NOTE_LIMIT)
    if not finished:
        return "crash", f"the process {_how(run)} before finishing"
    hung = [r for r in made if r.status == "timeout"]
    if hung:
        not_run = sum(r.status == "not-run" for r in made)
        return "timeout", report.clip(f"a check timed out ({hung[0].check.title})"
                                      + (f"; {not_run} check(s) that call the function that hung were not run"
                                         if not_run else ""), NOTE_LIMIT)
    errors = sum(r.status == "error" for r in made)
    if errors:
        return "fail", f"the grader itself failed on {errors} check(s) (not the student's fault; please report it)"
    if all(r.passed for r in made):
        return "pass", ""
    if all(r.status == "not-implemented" for r in made):
        return "not-started", ""
    return "fail", ""


def _row(job, made: list[Result], status: str, note: str, seconds: float) -> dict:
    diagnoses = collections.Counter(d for r in made for d in r.diagnoses)
    return {"submission": job.submission, "kata": job.kata.id, "passed": sum(r.passed for r in made),
            "total": len(made), "status": status, "diagnosis": diagnoses.most_common(1)[0][0] if diagnoses else "",
            "note": note, "seconds": round(seconds, 2),
            "checks": [{"id": r.check.id, "title": r.check.title, "status": r.status, "message": r.message,
                        "diagnoses": list(r.diagnoses)} for r in made]}


def row(run, settings, memo=None) -> dict:
    if not run.started:  # the learner's code never ran: nothing here is the student's doing
        return broken_row(run.job, why=NOT_STARTED.format(why=startup_failure(run)), output=run.output)
    made, tamper, load, finished = results(run, settings, memo)
    status, note = status_and_note(run, made, tamper, load, finished)
    if run.output_bytes > len(run.output):
        note = (note + "; " if note else "") + f"printed {run.output_bytes} bytes (kept the first {len(run.output)})"
    if run.leftovers:
        note = (note + "; " if note else "") + f"left {run.leftovers} process(es) running, killed"
    if getattr(run, "out_of_memory", False):
        note = (note + "; " if note else "") + (f"its processes together reached the memory limit "
                                                f"({settings.memory_mb} MB beyond the grader's own)")
    entry = _row(run.job, made, status, note, run.seconds)
    entry["output"] = run.output.decode("utf-8", errors="replace")
    return entry


def missing_row(job) -> dict:
    made = [Result(c, "not-implemented", MISSING_FILE.format(file=job.kata.stub)) for c in checks.for_kata(job.kata.id).all]
    entry = _row(job, made, "not-started", MISSING_FILE.format(file=job.kata.stub), 0.0)
    entry["output"] = ""
    return entry


def broken_row(job, exc: BaseException | None = None, why: str = "", output: bytes = b"") -> dict:
    """The row of a submission × kata the grader itself could not run or judge (never the student's fault)."""
    why = why or f"the grader could not grade this (not the student's fault; please report it): {type(exc).__name__}: {exc}"
    made = [Result(c, "error", why) for c in checks.for_kata(job.kata.id).all]
    entry = _row(job, made, "grader-error", report.clip(why, 400), 0.0)
    entry["output"] = output.decode("utf-8", errors="replace")
    return entry
