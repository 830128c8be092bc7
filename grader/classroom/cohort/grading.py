"""``kvkata grade``: a cohort's submissions found, graded each in isolation (grader.classroom.cohort.sandbox)
and written out as CSV, JSON and JUnit reports, with the cohort summary."""
from __future__ import annotations

import collections
import csv
import io
import json
from pathlib import Path
from xml.etree import ElementTree as ET

from grader import checks, manifest, state
from grader.classroom.cohort import sandbox as cohort
from grader.classroom.handouts import katas_for
from grader.errors import UsageError

CSV_COLUMNS = ["submission", "kata", "passed", "total", "status", "diagnosis", "note", "seconds", "isolation"]


def _names(roots: list[Path]) -> list[str]:
    names = [r.name or str(r) for r in roots]
    return [str(r) if names.count(n) > 1 else n for r, n in zip(roots, names)]


def jobs_for(paths: list[str], level: int | None, only: bool) -> list[cohort.Job]:
    """Every submission × kata to grade; a clear error for a path that is no folder or a kata
    that cannot be graded here."""
    roots = list(dict.fromkeys(Path(p) for p in paths))
    for r in roots:
        if not r.is_dir():
            raise UsageError(f"{r}: not a folder; a submission is a folder holding katas/NN/<file>")
    if level is not None:
        katas = katas_for(level, only)
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


def write_csv(rows: list[dict], path: Path) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    state.write_atomic(path, buffer.getvalue().encode("utf-8"))


def write_json(rows: list[dict], path: Path, settings: cohort.Settings) -> None:
    data = {"settings": vars(settings), "rows": rows}
    state.write_atomic(path, json.dumps(data, indent=2).encode("utf-8"))


def write_junit(rows: list[dict], path: Path) -> None:
    """JUnit XML: a test suite per submission, a test case per kata × check."""
    suites = ET.Element("testsuites", name="kvkata", isolation=", ".join(dict.fromkeys(r.get("isolation", "") for r in rows)))
    for submission in dict.fromkeys(r["submission"] for r in rows):
        mine = [r for r in rows if r["submission"] == submission]
        cases = [(r, c) for r in mine for c in r["checks"]]
        failures = sum(c["status"] != "pass" for _, c in cases)
        suite = ET.SubElement(suites, "testsuite", name=submission, tests=str(len(cases)), failures=str(failures),
                              time=f"{sum(r['seconds'] for r in mine):.2f}")
        for r, c in cases:
            case = ET.SubElement(suite, "testcase", classname=f"{submission}.kata{r['kata']}", name=c["title"])
            if c["status"] != "pass":
                kind = "skipped" if c["status"] in ("not-implemented", "not-run") else "failure"
                node = ET.SubElement(case, kind, message=f"{c['status']}: {c['message'].splitlines()[0] if c['message'] else ''}")
                node.text = c["message"]
    state.write_atomic(path, ET.tostring(suites, encoding="utf-8", xml_declaration=True))


def grade(paths: list[str], settings: cohort.Settings, level: int | None = None, only: bool = False,
          csv_path: str | None = None, json_path: str | None = None, junit_path: str | None = None,
          progress=None) -> str:
    """Grade every submission × kata and write the reports; the cohort summary, to print."""
    jobs = jobs_for(paths, level, only)
    if progress:
        progress(f"grading {len(jobs)} submission × kata pair(s), {settings.jobs} at a time, "
                 f"{settings.timeout:g} s each at most")
    settings.reports = [str(Path(p).resolve()) for p in (csv_path, json_path, junit_path) if p]  # out of reach
    rows = cohort.grade_all(jobs, settings, progress)
    for path, write in ((csv_path, write_csv), (junit_path, write_junit)):
        if path:
            write(rows, Path(path))
    if json_path:
        write_json(rows, Path(json_path), settings)
    return summary(rows)


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

