"""``kvkata grade``: a cohort's submissions found, graded each in isolation (grader.classroom.cohort.sandbox),
stamped with when they were submitted (late rows marked against ``--due``, never dropped), worth
points per kata (grader.classroom.choice), merged into an earlier report on ``--merge``, and written
out (grader.classroom.cohort.reports), with the cohort summary."""
from __future__ import annotations

import collections
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from grader import checks, manifest
from grader.classroom import choice
from grader.classroom.cohort import reports
from grader.classroom.cohort import sandbox as cohort
from grader.errors import UsageError

CSV_COLUMNS = reports.CSV_COLUMNS


@dataclass
class Choice:
    """Which katas (``level``/``only`` or ``katas`` by id; default: those submitted), their points, the due date."""

    level: int | None = None
    only: bool = False
    katas: list[str] | None = None
    points: str | None = None
    due: str | None = None


@dataclass
class Reports:
    """Where to write each report (None: not written); ``merge``: into the rows of the existing ``json``."""

    csv: str | None = None
    json: str | None = None
    junit: str | None = None
    gradebook: str | None = None
    feedback: str | None = None
    merge: bool = field(default=False)


def _names(roots: list[Path]) -> list[str]:
    names = [r.name or str(r) for r in roots]
    return [str(r) if names.count(n) > 1 else n for r, n in zip(roots, names)]


def jobs_for(paths: list[str], level: int | None, only: bool, ids: list[str] | None = None) -> list[cohort.Job]:
    """Every submission × kata to grade; a clear error for a path that is no folder or a kata
    that cannot be graded here."""
    roots = list(dict.fromkeys(Path(p) for p in paths))
    for r in roots:
        if not r.is_dir():
            raise UsageError(f"{r}: not a folder; a submission is a folder holding katas/NN/<file>")
    if level is not None or ids:
        katas = choice.katas(level, only, ids)
    else:
        katas = [k for k in manifest.load().values() if any(cohort.find_file(r, k) for r in roots)]
        if not katas:
            raise UsageError("no kata file in any submission (expected katas/NN/<file>, e.g. katas/01/append.py)")
    for k in katas:
        try:
            checks.for_kata(k.id)
        except ModuleNotFoundError:
            raise UsageError(f"kata {k.id} has no checks yet, so it cannot be graded") from None
    missing = [k.id for k in katas if not (manifest.REPO_ROOT / k.solution).is_file()]
    if missing:
        raise UsageError(f"kata(s) {', '.join(missing)}: no reference solution in {manifest.REPO_ROOT / 'solutions'}, "
                         "so they cannot be graded here")
    return [cohort.Job(name, root, k, cohort.find_file(root, k)) for root, name in zip(roots, _names(roots)) for k in katas]


# -- when it was submitted -------------------------------------------------------------------------
def due_date(text: str | None) -> datetime | None:
    """``--due`` as an aware time (a time without a zone is this machine's local time)."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--due {text}: not a date and time in ISO 8601, e.g. 2026-03-01T23:59 or "
                         "2026-03-01T23:59+01:00") from None
    return when.astimezone() if when.tzinfo is None else when


def submitted_at(job: cohort.Job) -> datetime | None:
    """When the kata's file was submitted: the last commit of the submission's own git repository
    (a GitHub Classroom clone), else the file's modification time; None without a file."""
    if job.file is None:
        return None
    if (job.root / ".git").exists():
        try:
            ran = subprocess.run(["git", "-C", str(job.root), "log", "-1", "--format=%cI", "--", str(job.file)],
                                 capture_output=True, text=True, timeout=30)
            if ran.returncode == 0 and ran.stdout.strip():
                return datetime.fromisoformat(ran.stdout.strip())
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    return datetime.fromtimestamp(job.file.stat().st_mtime, tz=timezone.utc).astimezone()


def stamp(rows: list[dict], jobs: list[cohort.Job], due: datetime | None) -> None:
    """Each row's ``submitted`` (ISO 8601, or empty) and ``late`` (after ``due``)."""
    for row, job in zip(rows, jobs):
        when = submitted_at(job)
        row["submitted"] = when.isoformat(timespec="seconds") if when else ""
        row["late"] = bool(when and due and when > due)


def score(rows: list[dict], spec: str | None) -> dict[str, float]:
    """Each row's ``points`` (its checks passed, each worth its kata's points over its checks) and
    ``max_points``; the points of each kata."""
    katas = [manifest.get(k) for k in dict.fromkeys(r["kata"] for r in rows)]
    points_of = choice.points(spec, katas)
    for row in rows:
        row["max_points"] = points_of[row["kata"]]
        row["points"] = round(row["passed"] * choice.per_check(points_of[row["kata"]], row["total"]), 6)
    return points_of


def previous(path: Path) -> dict:
    """The JSON report ``--merge`` merges into."""
    if not path.is_file():
        raise UsageError(f"--merge: no report at {path} to merge into (write one first with --json)")
    return reports.read_json(path)


def same_grading(old: dict, settings: cohort.Settings) -> None:
    """Refuse to merge rows graded otherwise (another seed draws other inputs; another device, other results)."""
    for key in ("seed", "device"):
        if old.get("settings", {}).get(key) != getattr(settings, key):
            raise UsageError(f"--merge: the report was graded with --{key} {old['settings'].get(key)}, this run "
                             f"with {getattr(settings, key)}; grade with the same to merge")


def merge(old: dict, rows: list[dict]) -> list[dict]:
    """The rows of the earlier report ``old`` with ``rows`` in place of the same submission × kata."""
    fresh = {(r["submission"], r["kata"]): r for r in rows}
    kept = [fresh.pop((r["submission"], r["kata"]), r) for r in old["rows"]]
    return kept + list(fresh.values())


def grade(paths: list[str], settings: cohort.Settings, chosen: Choice | None = None, out: Reports | None = None,
          progress=None) -> str:
    """Grade every submission × kata and write the reports; the cohort summary, to print."""
    chosen, out = chosen or Choice(), out or Reports()
    if out.merge and not out.json:
        raise UsageError("--merge needs --json: the JSON report holds every row the others are written from")
    old = previous(Path(out.json)) if out.merge else {}
    if out.merge:
        same_grading(old, settings)
    given = old.get("settings", {})  # a merge keeps the report's points and due date unless given again
    points_spec = chosen.points if chosen.points is not None else given.get("points")
    due = due_date(chosen.due or given.get("due"))
    jobs = jobs_for(paths, chosen.level, chosen.only, chosen.katas)
    if progress:
        progress(f"grading {len(jobs)} submission × kata pair(s), {settings.jobs} at a time, "
                 f"{settings.timeout:g} s each at most")
    settings.reports = [str(Path(p).resolve()) for p in (out.csv, out.json, out.junit, out.gradebook, out.feedback)
                        if p]  # out of every worker's reach
    rows = cohort.grade_all(jobs, settings, progress)
    stamp(rows, jobs, due)
    recorded = {**vars(settings), "due": due.isoformat() if due else None, "points": points_spec}
    if out.merge:
        rows = merge(old, rows)
    points_of = score(rows, points_spec)
    _write(rows, out, recorded)
    return summary(rows) + f"\n\npoints per kata: {choice.describe(points_of)}" + _late_line(rows, due)


def _write(rows: list[dict], out: Reports, settings: dict) -> None:
    for path, write in ((out.csv, reports.write_csv), (out.junit, reports.write_junit),
                        (out.gradebook, reports.write_gradebook)):
        if path:
            write(rows, Path(path))
    if out.json:
        reports.write_json(rows, Path(out.json), settings)
    if out.feedback:
        reports.write_feedback(rows, Path(out.feedback), settings.get("due"))


def _late_line(rows: list[dict], due: datetime | None) -> str:
    if due is None:
        return ""
    late = sorted({r["submission"] for r in rows if r.get("late")})
    return f"\ndue {due.isoformat(timespec='minutes')}: " + (f"{len(late)} late ({', '.join(late)}), graded and marked"
                                                             if late else "none late")


def _did_not_run(check: dict) -> bool:
    """Whether a check of a row was stopped before it gave an answer (it timed out, or the time
    limit or a dead process kept it from running)."""
    return check["status"] in ("timeout", "not-run") or str(check.get("message", "")).startswith("not run")


def summary(rows: list[dict]) -> str:
    """The cohort at a glance: a table of submissions × katas, then per check how many failed it,
    then the commonest diagnoses."""
    katas = list(dict.fromkeys(r["kata"] for r in rows))
    subs = list(dict.fromkeys(r["submission"] for r in rows))
    cell = {(r["submission"], r["kata"]): r for r in rows}
    width = max([len("submission")] + [len(s) for s in subs])
    lines = [f"{'submission':<{width}}  " + "  ".join(f"{'kata ' + k:>13}" for k in katas)]
    for s in subs:
        marks = []
        for k in katas:
            r = cell.get((s, k))
            marks.append(f"{(r['status'] + ' ' + str(r['passed']) + '/' + str(r['total'])) if r else '-':>13}")
        lines.append(f"{s:<{width}}  " + "  ".join(marks))
    failed, stopped = collections.Counter(), collections.Counter()
    titles, graded = {}, collections.Counter()
    for r in rows:
        if r["status"] == "not-started":  # nothing was submitted for this kata: no check to count
            continue
        for c in r["checks"]:
            key = (r["kata"], c["id"])
            titles[key] = c["title"]
            graded[key] += 1
            if _did_not_run(c):  # a time limit or a dead process stopped it: no answer to count as wrong
                stopped[key] += 1
            else:
                failed[key] += c["status"] != "pass"
    lines += ["", "checks failed (by how many of the submissions that attempted the kata; a check that timed "
              "out or did not run is counted apart):"]
    for key in sorted(titles, key=lambda k: (-failed[k], -stopped[k])):
        if failed[key] or stopped[key]:
            apart = f" (and {stopped[key]} timed out or did not run)" if stopped[key] else ""
            lines.append(f"  kata {key[0]} · {titles[key]}: {failed[key]} of {graded[key]}{apart}")
    if not any(failed.values()) and not any(stopped.values()):
        lines.append("  none")
    diagnoses = collections.Counter(d for r in rows for d in {d for c in r["checks"] for d in c["diagnoses"]})
    lines += ["", "commonest diagnoses (submission × kata pairs showing each):"]
    lines += [f"  {n}× {name}" for name, n in diagnoses.most_common(10)] or ["  none"]
    return "\n".join(lines)

