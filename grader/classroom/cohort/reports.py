"""The reports ``kvkata grade`` writes from its rows: CSV (a row per submission × kata), JSON (every
check's result, what ``--merge`` reads back), JUnit XML, a wide gradebook (a row per submission,
a column per kata, for an LMS import) and a Markdown feedback file per submission.

Every file goes through grader.state's atomic writer, so it has the mode the umask gives a new file.
"""
from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from xml.etree import ElementTree as ET

from grader import manifest, state
from grader.classroom.choice import number

CSV_COLUMNS = ["submission", "kata", "passed", "total", "status", "diagnosis", "note", "seconds", "points",
               "max_points", "submitted", "late", "isolation"]
SKIPPED = ("not-implemented", "not-run")  # JUnit <skipped>: the check gave no verdict on the student's code
ERRORS = ("error",)  # JUnit <error>: the grader failed, not the student
MARK = {"pass": "✅", "fail": "❌", "timeout": "⏱", "not-implemented": "⬜", "not-run": "⬜", "error": "⚠"}


def write_csv(rows: list[dict], path: Path) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    state.write_atomic(path, buffer.getvalue().encode("utf-8"))


def write_json(rows: list[dict], path: Path, settings: dict) -> None:
    state.write_atomic(path, json.dumps({"settings": settings, "rows": rows}, indent=2).encode("utf-8"))


def read_json(path: Path) -> dict:
    """A JSON report written by ``write_json``."""
    return json.loads(path.read_text(encoding="utf-8"))


def write_junit(rows: list[dict], path: Path) -> None:
    """JUnit XML: a test suite per submission, a test case per kata × check; each suite's ``tests``,
    ``failures``, ``errors`` and ``skipped`` count its ``<testcase>``, ``<failure>``, ``<error>`` and
    ``<skipped>`` elements."""
    suites = ET.Element("testsuites", name="kvkata",
                        isolation=", ".join(dict.fromkeys(r.get("isolation", "") for r in rows)))
    for submission in dict.fromkeys(r["submission"] for r in rows):
        mine = [r for r in rows if r["submission"] == submission]
        cases = [(r, c) for r in mine for c in r["checks"]]
        kinds = [_junit_kind(c["status"]) for _, c in cases]
        suite = ET.SubElement(suites, "testsuite", name=submission, tests=str(len(cases)),
                              failures=str(kinds.count("failure")), errors=str(kinds.count("error")),
                              skipped=str(kinds.count("skipped")), time=f"{sum(r['seconds'] for r in mine):.2f}")
        for (r, c), kind in zip(cases, kinds):
            case = ET.SubElement(suite, "testcase", classname=f"{submission}.kata{r['kata']}", name=c["title"])
            if kind:
                first = c["message"].splitlines()[0] if c["message"] else ""
                node = ET.SubElement(case, kind, message=f"{c['status']}: {first}")
                node.text = c["message"]
    state.write_atomic(path, ET.tostring(suites, encoding="utf-8", xml_declaration=True))


def _junit_kind(status: str) -> str | None:
    if status == "pass":
        return None
    return "skipped" if status in SKIPPED else "error" if status in ERRORS else "failure"


# -- the gradebook ----------------------------------------------------------------------------------
def gradebook(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The header and one line per submission: its points per kata, the total and the most it could
    get, when it was submitted and whether it was late."""
    katas = list(dict.fromkeys(r["kata"] for r in rows))
    header = ["submission"] + [f"kata {k}" for k in katas] + ["total", "max", "submitted", "late"]
    lines = []
    for submission in dict.fromkeys(r["submission"] for r in rows):
        mine = {r["kata"]: r for r in rows if r["submission"] == submission}
        cells = [_points(mine[k]["points"]) if k in mine else "" for k in katas]
        total = sum(r["points"] for r in mine.values())
        most = sum(r["max_points"] for r in mine.values())
        stamps = sorted(r["submitted"] for r in mine.values() if r.get("submitted"))
        late = any(r.get("late") for r in mine.values())
        lines.append([submission] + cells + [_points(total), _points(most), stamps[-1] if stamps else "",
                                             "late" if late else ""])
    return header, lines


def write_gradebook(rows: list[dict], path: Path) -> None:
    header, lines = gradebook(rows)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(lines)
    state.write_atomic(path, buffer.getvalue().encode("utf-8"))


def _points(value: float) -> str:
    return number(round(value, 2))


# -- feedback ----------------------------------------------------------------------------------------
def feedback(submission: str, rows: list[dict], due: str | None) -> str:
    """One submission's feedback in Markdown: per kata, each check, and for each that did not pass
    its message (the input, what was expected and what the code gave) and the mistakes it looks like."""
    total, most = sum(r["points"] for r in rows), sum(r["max_points"] for r in rows)
    stamps = sorted(r["submitted"] for r in rows if r.get("submitted"))
    lines = [f"# Feedback: {submission}", "", f"Score: {_points(total)} of {_points(most)} points."]
    if stamps:
        late = any(r.get("late") for r in rows)
        lines.append(f"Submitted {stamps[-1]}" + (f", after the due date ({due}): marked late." if late else "."))
    for r in rows:
        kata = manifest.get(r["kata"])
        lines += ["", f"## Kata {r['kata']} · {kata.title}: {r['passed']}/{r['total']} checks, "
                      f"{_points(r['points'])} of {_points(r['max_points'])} points ({r['status']})"]
        if r.get("note"):
            lines += ["", r["note"]]
        lines += [""] + [f"- {MARK.get(c['status'], '❌')} {c['title']} ({c['status']})" for c in r["checks"]]
        for c in (c for c in r["checks"] if c["status"] != "pass"):
            lines += ["", f"### {c['title']}", ""]
            if c["diagnoses"]:
                lines += [f"Looks like a known mistake: {', '.join(c['diagnoses'])}.", ""]
            lines += ["```text", c["message"].strip() or c["status"], "```"]
    return "\n".join(lines) + "\n"


def feedback_name(submission: str) -> str:
    """A file name for a submission's feedback (its name, with anything but letters, digits, ``.-_`` as ``_``)."""
    return re.sub(r"[^\w.-]", "_", submission.strip("/")).strip(".") or "submission"


def write_feedback(rows: list[dict], folder: Path, due: str | None) -> list[Path]:
    written = []
    for submission in dict.fromkeys(r["submission"] for r in rows):
        path = folder / f"{feedback_name(submission)}.md"
        text = feedback(submission, [r for r in rows if r["submission"] == submission], due)
        state.write_atomic(path, text.encode("utf-8"))
        written.append(path)
    return written
