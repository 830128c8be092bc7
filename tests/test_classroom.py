"""The instructor's side: handouts (``kvkata assign``) and isolated grading of a cohort
(``kvkata grade``), including submissions that hang, crash, exit, exhaust memory, flood their
output or tamper with the grader; and the record/replay design that keeps a learner's code from
turning a failing check into a passing one."""
from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
from xml.etree import ElementTree as ET

import pytest
import torch

from conftest import K01, KATAS, copy_repo, kvkata, slow, usage_error
from grader import checks, grade, manifest, mistakes
from grader.errors import UsageError
from grader.engine import plain, run_check, targets
from grader.classroom.cohort import sandbox
from grader.classroom.cohort.record import RecordingCtx
from grader.classroom.cohort.replay import NO_RECORD, ReplayCtx

pytestmark = slow  # cohort grading in worker processes, and kvkata in subprocesses

REFERENCE = (manifest.REPO_ROOT / K01.solution).read_text()
STUB = (manifest.REPO_ROOT / K01.stub).read_text()
MISTAKE = mistakes.catalogue("01")[0]
SCALE = next(m for m in mistakes.catalogue("01") if "scale" in m.name)
FIRST_LINE = '    _expect_kv("k_new", k_new)\n'  # the first line append_kv runs, where misbehaviour goes
LIAR = '''

class _Liar(torch.Tensor):
    """Says it is close to anything."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.isclose:
            with torch._C.DisableTorchFunctionSubclass():
                return torch.ones(args[0].shape, dtype=torch.bool)
        return super().__torch_function__(func, types, args, kwargs or {})
'''
TAMPERER = '''
import pathlib
import torch
import grader
from grader import engine
from grader.engine import report
torch.allclose = lambda *a, **k: True
torch.isclose = lambda a, b, **k: torch.ones_like(a, dtype=torch.bool)
torch.equal = lambda *a, **k: True
report.compare = lambda expected, got, where="result": None
engine.run_check = lambda check, ctx, mistakes=(), timeout=None: engine.Result(check, "pass")
try:
    (pathlib.Path(grader.__file__).parent / "checks" / "k01.py").write_text("CHECKS = None")
except OSError as exc:
    print("refused:", exc)
'''
COPIER = '''
import pathlib, grader
exec((pathlib.Path(grader.__file__).parent.parent / "solutions" / "01" / "append.py").read_text())
'''


def at_start(line: str) -> str:
    return REFERENCE.replace(FIRST_LINE, line + FIRST_LINE, 1)


def liar() -> str:
    """The missing-scale mistake whose output claims to be close to anything: in-process grading
    passes it, replay does not."""
    return SCALE.apply(REFERENCE).replace("return self.wo(out), (K, V)", "return self.wo(out).as_subclass(_Liar), (K, V)") + LIAR


SUBMISSIONS = {  # one worker each, so as few as cover every way a submission can go wrong
    "untouched": lambda: STUB, "mistake": lambda: MISTAKE.apply(REFERENCE),
    "hang": lambda: at_start("    while True:\n        pass\n"),
    "exits": lambda: at_start("    import os\n    os._exit(3)\n"),
    "sysexit": lambda: REFERENCE + "\nimport sys\nsys.exit(0)\n",
    "memory": lambda: at_start("    hog = torch.empty(3 * 2**30, dtype=torch.uint8)\n"),
    "flood": lambda: at_start('    print("x" * 100_000)\n'),  # otherwise correct: it passes, its output capped
    "tamperer": lambda: MISTAKE.apply(REFERENCE) + TAMPERER,
    "copier": lambda: STUB + COPIER,
    "liar": liar,
}


DUE = "2030-01-01T00:00+00:00"
BEFORE_DUE = 1893369600.0  # 2029-12-31T00:00Z
AFTER_DUE = 1893459600.0  # 2030-01-01T01:00Z


def test_assign_writes_a_handout_without_solutions(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    out = tmp_path / "handout"
    made = kvkata(repo, "assign", "--level", "1", "--out", str(out), "--no-ci")
    assert made.returncode == 0, made.stderr
    assert "recording known mistake" in made.stderr  # progress, while the public records are made
    level1 = [k for k in KATAS if k.level <= 1]
    assert sorted(p.name for p in (out / "katas").iterdir()) == [k.id for k in level1]
    for k in level1:
        assert (out / k.stub).read_text() == (repo / k.stub).read_text() and (out / k.readme).is_file()
        assert (out / k.notebook).is_file() == (repo / k.notebook).is_file()
        assert (out / "grader" / "public" / f"{k.id}.pt.xz").is_file()
    assert not (out / "solutions").exists() and (out / "grader" / "cli.py").is_file()
    assert not (out / "grader" / "mistakes").exists() and not (out / ".github").exists()
    assert "public inputs" in (out / "README.md").read_text()
    usage_error(kvkata(repo, "assign", "--level", "1", "--out", str(out)), "--force")

    only = kvkata(repo, "assign", "--level", "2", "--only", "--out", str(out), "--force")
    assert only.returncode == 0 and sorted(p.name for p in (out / "katas").iterdir()) == [k.id for k in KATAS if k.level == 2]
    assert (out / ".github" / "workflows" / "classroom.yml").is_file()
    ran = subprocess.run([sys.executable, "-m", "pytest", "katas"], cwd=out, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(out)}, timeout=300)
    assert ran.returncode == 1 and "public checks:" in ran.stdout and "not implemented yet" in ran.stdout, ran.stdout[-2000:]
    assert "Traceback" not in ran.stdout + ran.stderr
    first = next(k for k in KATAS if k.level == 2)
    checked = kvkata(out, "check", first.id)
    assert checked.returncode == 1 and "0/" in checked.stdout, checked.stdout + checked.stderr


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One grading run over every kind of submission (the expensive part, shared)."""
    tmp = tmp_path_factory.mktemp("grade")
    repo = copy_repo(tmp / "repo")
    for name, source in SUBMISSIONS.items():
        (tmp / name / "katas" / "01").mkdir(parents=True)
        (tmp / name / K01.stub).write_text(source())
        os.utime(tmp / name / K01.stub, (BEFORE_DUE, BEFORE_DUE if name != "mistake" else AFTER_DUE))
    (tmp / "empty").mkdir()
    checks_file = (repo / "grader" / "checks" / "k01.py").read_bytes()
    subs = [str(tmp / name) for name in [*SUBMISSIONS, "empty"]]
    ran = kvkata(repo, "grade", *subs, "-j", "2", "--timeout", "10", "--memory", "2048", "--report",
                 str(tmp / "grades.csv"), "--json", str(tmp / "grades.json"), "--junit", str(tmp / "grades.xml"),
                 "--gradebook", str(tmp / "gradebook.csv"), "--feedback", str(tmp / "feedback"), "--due", DUE,
                 "--points", "01=10")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (repo / "grader" / "checks" / "k01.py").read_bytes() == checks_file  # the tamperer changed nothing
    rows = {r["submission"]: r for r in csv.DictReader(io.StringIO((tmp / "grades.csv").read_text()))}
    return ran, rows, json.loads((tmp / "grades.json").read_text()), tmp


def test_grade_gives_every_submission_an_honest_row(graded):
    ran, rows, _, _ = graded
    total = str(len(checks.for_kata("01").all))
    expect = {"flood": "pass", "untouched": "not-started", "empty": "not-started", "mistake": "fail",
              "sysexit": "crash", "exits": "crash", "hang": "timeout", "memory": "fail", "tamperer": "tampered",
              "copier": "tampered", "liar": "fail"}  # a refused read is tampering, even when the import then crashed
    assert {name: row["status"] for name, row in rows.items()} == expect
    assert all(row["kata"] == "01" and row["total"] == total for row in rows.values())
    assert rows["flood"]["passed"] == total and "printed" in rows["flood"]["note"]
    assert rows["mistake"]["diagnosis"] == MISTAKE.name
    assert rows["tamperer"]["passed"] == rows["copier"]["passed"] == "0"
    assert all(w in rows["tamperer"]["note"] for w in ("tampered", "torch.isclose", "report.compare", "k01.py"))
    assert "solutions" in rows["copier"]["note"] and "SystemExit" in rows["sysexit"]["note"]
    assert "code 3" in rows["exits"]["note"]
    assert int(rows["liar"]["passed"]) < int(total)
    assert list(rows["flood"]) == ["submission", "kata", "passed", "total", "status", "diagnosis", "note", "seconds",
                                   "points", "max_points", "submitted", "late", "isolation"]
    assert {row["isolation"] for row in rows.values()} == {sandbox.walls()["isolation"]}
    progress = [line for line in ran.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == len(rows)
    assert "checks failed" in ran.stdout and MISTAKE.name in ran.stdout


def test_grade_reports_in_json_and_junit(graded):
    _, rows, data, tmp = graded
    by_name = {r["submission"]: r for r in data["rows"]}
    assert by_name.keys() == rows.keys()
    memory = by_name["memory"]["checks"]
    assert any("allocate" in c["message"] for c in memory)  # the address-space limit, not the machine, said no
    assert len(by_name["flood"]["output"]) <= 64 * 1024
    suites = ET.parse(tmp / "grades.xml").getroot()
    assert {s.get("name") for s in suites} == rows.keys()
    flood = next(s for s in suites if s.get("name") == "flood")
    assert flood.get("failures") == "0" and len(flood) == int(rows["flood"]["total"])


def test_the_liar_fools_in_process_grading_but_not_replay(tmp_path):
    path = tmp_path / "append.py"
    path.write_text(liar())
    assert all(r.passed for r in grade.grade("01", str(path)))  # why classroom grading replays instead


def _record(target) -> list[dict]:
    reference, out = targets.reference(K01), []
    for check in checks.for_kata("01").all:
        ctx = RecordingCtx(target, reference, "cpu")
        run_check(check, ctx, (), 60)
        out.append({"check": check.id, "executions": ctx.executions})
    return out


def _replay(records, memo=None) -> list:
    reference, known = targets.reference(K01), mistakes.load("01")
    return [run_check(c, ReplayCtx(r["executions"], K01.stub, reference, "cpu", memo=memo), known, 60)
            for c, r in zip(checks.for_kata("01").all, records)]


def _through_a_file(records, tmp_path):
    plain.save(tmp_path / "r.pt", records)
    return plain.load(tmp_path / "r.pt")


@pytest.mark.parametrize("name", ["reference", "stub"] + [m.name for m in mistakes.catalogue("01")])
def test_replay_agrees_with_in_process_grading(name, tmp_path):
    target = {"reference": targets.reference(K01), "stub": targets.stub(K01)}.get(name) or \
        dict((m.name, t) for m, t in mistakes.load("01"))[name]
    replayed = _replay(_through_a_file(_record(target), tmp_path))
    direct = grade.grade("01", target, diagnose=False)
    assert [r.status for r in replayed] == [r.status for r in direct]
    if name not in ("reference", "stub"):
        assert any(name in r.diagnoses for r in replayed)


def test_replay_that_remembers_judges_alike():
    """One memory (the reference's outputs and Hypothesis' runs, grader.classroom.cohort.memo) shared by the
    replays of several submissions, each replayed twice, changes no result; what it hands out is a copy."""
    from grader.classroom.cohort.memo import Memo

    memo, named = Memo(), dict((m.name, t) for m, t in mistakes.load("01"))
    for target in [targets.reference(K01), targets.stub(K01), named[MISTAKE.name], named[SCALE.name]]:
        records = _record(target)
        plain = [(r.status, r.message, r.diagnoses) for r in _replay(records)]
        for _ in range(2):
            assert [(r.status, r.message, r.diagnoses) for r in _replay(records, memo)] == plain
    assert memo.hits and memo.runs.walked and not memo.runs.untrusted
    given = memo.output("key", lambda: {"K": torch.zeros(2)})
    given["K"] += 1
    assert memo.output("key", lambda: None)["K"].sum() == 0


def test_a_forged_record_never_passes(tmp_path):
    """A record claiming "all went fine" without the values to compare fails every check that
    compares values; a record with nothing in it fails every check."""
    records = _record(dict((m.name, t) for m, t in mistakes.load("01"))[MISTAKE.name])
    compared = [any(e["observations"] for e in r["executions"].values()) for r in records]
    for record in records:
        for execution in record["executions"].values():
            execution["observations"], execution["outcome"] = [], {"kind": "pass"}
    forged = _replay(records)
    assert any(compared) and all(not r.passed for r, c in zip(forged, compared) if c)
    empty = _replay([{"executions": {}} for _ in records])
    assert all(r.status == "fail" and NO_RECORD in r.message for r in empty)


def _grade_one(tmp_path, source: str, **settings) -> dict:
    """Grade one kata-01 submission in process (the workers are still separate processes)."""
    from grader.classroom.cohort import sandbox as cohort
    from grader.classroom.cohort import grading

    (tmp_path / "sub" / "katas" / "01").mkdir(parents=True)
    (tmp_path / "sub" / K01.stub).write_text(source)
    jobs = grading.jobs_for([str(tmp_path / "sub")], None, False)
    return cohort.grade_all(jobs, cohort.Settings(**settings))[0]


def test_a_grader_that_cannot_start_is_never_charged_to_the_student(tmp_path, monkeypatch):
    from grader.classroom.cohort import launch

    monkeypatch.setattr(launch, "WORKER", "grader.no_such_worker")  # as a broken install would fail
    row = _grade_one(tmp_path, REFERENCE)
    assert row["status"] == "grader-error" and row["passed"] == 0, row
    assert "could not start" in row["note"] and "no_such_worker" in row["note"], row["note"]
    assert all(c["status"] == "error" and "not the student's fault" in c["message"] for c in row["checks"])


def test_the_default_memory_budget_is_the_students_not_torchs(tmp_path):
    """With the default budget, a correct submission passes whichever torch build is installed, and
    an allocation beyond the budget fails with the allocator's own message."""
    hog = at_start("    hog = torch.empty(5 * 2**30, dtype=torch.uint8)\n")
    row = _grade_one(tmp_path, hog, timeout=30)
    assert row["status"] == "fail", row["note"]
    assert any("allocate" in c["message"] for c in row["checks"]), [c["message"][:200] for c in row["checks"]]
    fine = _grade_one(tmp_path / "fine", REFERENCE, timeout=30)
    assert fine["status"] == "pass", fine["note"]


def test_judge_processes_that_remember_give_the_same_rows_as_judging_here(graded):
    """``kvkata grade`` judges in processes forked from the warm server, remembering the reference's
    outputs and Hypothesis' runs; judging one row after the other here, remembering nothing, gives
    the same rows, hostile code included (all but the seconds the workers took)."""
    from grader.classroom.cohort import sandbox as cohort
    from grader.classroom.cohort import grading

    _, _, data, tmp = graded
    assert data["settings"]["judges"] is None and data["settings"]["remember"] and data["settings"]["warm"]
    names = ["mistake", "liar", "tamperer", "copier", "exits", "memory", "flood", "untouched"]
    jobs = grading.jobs_for([str(tmp / name) for name in names], None, False)
    jobs.append(jobs[0])  # the same submission again: judged from what was remembered
    fast = cohort.grade_all(jobs, cohort.Settings(jobs=2, timeout=10, memory_mb=2048))
    plain = cohort.grade_all(jobs, cohort.Settings(jobs=2, timeout=10, memory_mb=2048, judges=0, remember=False))
    assert [{**r, "seconds": 0} for r in fast] == [{**r, "seconds": 0} for r in plain]


def test_fresh_workers_give_the_same_rows_as_warm_ones(graded):
    """Workers forked from the warm server and fresh interpreters grade alike, hostile code included."""
    from grader.classroom.cohort import sandbox as cohort
    from grader.classroom.cohort import grading

    _, rows, _, tmp = graded
    names = ["mistake", "exits", "memory", "tamperer", "hang"]
    jobs = grading.jobs_for([str(tmp / name) for name in names], None, False)
    fresh = cohort.grade_all(jobs, cohort.Settings(jobs=2, timeout=10, memory_mb=2048, warm=False))
    assert [(r["status"], str(r["passed"]), r["diagnosis"]) for r in fresh] == \
        [(rows[n]["status"], rows[n]["passed"], rows[n]["diagnosis"]) for n in names]


def test_a_looping_function_scores_the_checks_that_ran(tmp_path):
    """A function that hangs costs one check's limit in a worker too: the row scores every check that
    could run, as local grading does, instead of timing the whole kata out."""
    from grader.classroom.cohort import grading
    from grader.classroom.cohort import sandbox as cohort

    k04 = manifest.get("04")
    line = "    # Why 2: each layer"  # inside kv_bytes_per_token, which most of kata 04's functions call
    source = (manifest.REPO_ROOT / k04.solution).read_text().replace(line, "    while True:\n        pass\n" + line)
    (tmp_path / "sub" / "katas" / "04").mkdir(parents=True)
    (tmp_path / "sub" / k04.stub).write_text(source)
    local = grade.grade("04", str(tmp_path / "sub" / k04.stub), timeout=2)
    jobs = grading.jobs_for([str(tmp_path / "sub")], None, False)
    row = cohort.grade_all(jobs, cohort.Settings(timeout=20, check_timeout=2))[0]
    assert row["status"] == "timeout" and "not run" in row["note"], row["note"]
    assert 0 < row["passed"] == sum(r.passed for r in local) < row["total"]
    assert [c["status"] for c in row["checks"]] == [r.status for r in local]
    assert sum(c["status"] == "timeout" for c in row["checks"]) == 1


@pytest.mark.parametrize("kata_id, names", [("01", ["new entries put before the old ones", "missing the 1/sqrt(head_dim) scale"]),
                                            ("03", ["tiled repeat instead of interleave", "positions restart at 0 on each call"])])
def test_cohort_feedback_is_the_local_feedback(tmp_path, kata_id, names):
    """``kvkata grade`` shows the student the same shrunk failing input and the same diagnosis as
    ``pytest katas/NN`` with the same seed."""
    from grader.classroom.cohort import grading
    from grader.classroom.cohort import sandbox as cohort

    kata = manifest.get(kata_id)
    reference = (manifest.REPO_ROOT / kata.solution).read_text()
    chosen = [m for m in mistakes.catalogue(kata_id) if m.name in names]
    assert len(chosen) == len(names)
    roots = []
    for i, mistake in enumerate(chosen):
        (tmp_path / f"s{i}" / "katas" / kata_id).mkdir(parents=True)
        (tmp_path / f"s{i}" / kata.stub).write_text(mistake.apply(reference))
        roots.append(str(tmp_path / f"s{i}"))
    rows = cohort.grade_all(grading.jobs_for(roots, None, False), cohort.Settings(timeout=120, jobs=2))
    for root, mistake, row in zip(roots, chosen, rows):
        path = f"{root}/{kata.stub}"
        local = grade.grade(kata_id, path)  # as pytest katas/NN grades it, seed 0
        assert any(mistake.name in r.diagnoses for r in local)
        for r, c in zip(local, row["checks"]):
            assert (c["status"], c["diagnoses"]) == (r.status, r.diagnoses), (mistake.name, r.check.id)
            assert c["message"] == r.message.replace(str(pathlib.Path(path).resolve()), kata.stub), (mistake.name, r.check.id)


# -- row statuses, notes and the cohort summary, from synthetic rows -------------------------------
def test_a_long_note_is_cut_at_a_word_and_says_so():
    from grader.engine import report

    text = "tampered with the grader: " + "; ".join(f"replaced grader.module{i}.function" for i in range(40))
    cut = report.clip(text, 300)
    assert len(cut) <= 300 and cut.endswith("…") and cut[:-1] == text[:len(cut) - 1]
    assert text[len(cut) - 1] in " ;", "cut inside a word"
    assert report.clip("short note", 300) == "short note"


def test_a_tampering_row_has_a_status_of_its_own():
    from types import SimpleNamespace

    from grader.classroom.cohort import judge

    run = SimpleNamespace(timed_out=False, seconds=1.0, returncode=0)
    tamper = [f"replaced grader.report.compare number {i}" for i in range(30)]
    status, note = judge.status_and_note(run, [], tamper, None, True)
    assert status == "tampered" and note.startswith("tampered with the grader") and note.endswith("…"), note
    assert len(note) <= judge.NOTE_LIMIT and not note[:-1].endswith(("numb", "replac"))


def _row(submission: str, status: str, checks: list[tuple[str, str, str]]) -> dict:
    return {"submission": submission, "kata": "04", "passed": sum(s == "pass" for _, s, _ in checks),
            "total": len(checks), "status": status,
            "checks": [{"id": i, "title": f"check {i}", "status": s, "message": m, "diagnoses": []} for i, s, m in checks]}


def test_the_cohort_summary_counts_a_timeout_apart_from_failures():
    from grader.classroom.cohort import grading

    rows = [_row("ann", "fail", [("a", "fail", "wrong"), ("b", "pass", "")]),
            _row("bob", "timeout", [("a", "timeout", "timed out after 10 s"),
                                    ("b", "timeout", "not run: the time limit of 60 s for this kata was reached")])]
    text = grading.summary(rows)
    assert "kata 04 · check a: 1 of 2 (and 1 timed out or did not run)" in text, text
    assert "kata 04 · check b: 0 of 2 (and 1 timed out or did not run)" in text, text


def test_an_exact_fraction_crosses_as_itself(tmp_path):
    """A Fraction is data: it crosses to the grader's side exact, not rounded to a float."""
    from fractions import Fraction

    value = {"intensity": Fraction(2**60 + 1, 3), "pair": (Fraction(1, 3), 2)}
    assert plain.plain(value) == value and type(plain.plain(value)["intensity"]) is Fraction
    assert plain.is_data(value)
    plain.save(tmp_path / "f.pt", value)
    assert plain.load(tmp_path / "f.pt") == value


# -- points, the gradebook, feedback, due dates and merging -----------------------------------------
def test_a_cohort_run_writes_a_gradebook_feedback_and_marks_the_late_row(graded):
    """``--points 01=10 --due``: each kata-01 check worth 10/total; one gradebook line per submission
    with its points; a feedback file per submission naming the failed checks and the mistake; the
    row submitted after the due date marked late and still graded."""
    ran, rows, data, tmp = graded
    total = len(checks.for_kata("01").all)
    with open(tmp / "gradebook.csv", newline="") as handle:
        book = list(csv.DictReader(handle))
    assert [line["submission"] for line in book] == list(rows)
    assert list(book[0]) == ["submission", "kata 01", "total", "max", "submitted", "late"]
    by_name = {line["submission"]: line for line in book}
    assert by_name["flood"]["kata 01"] == "10" and by_name["untouched"]["kata 01"] == "0"
    mistake = int(rows["mistake"]["passed"])
    assert float(by_name["mistake"]["kata 01"]) == pytest.approx(round(10 * mistake / total, 2))
    assert by_name["mistake"]["late"] == "late" and {line["late"] for n, line in by_name.items() if n != "mistake"} == {""}
    assert rows["mistake"]["late"] == "True" and rows["mistake"]["status"] == "fail"  # late, not dropped
    assert by_name["mistake"]["submitted"].startswith("2030-01-01") and by_name["empty"]["submitted"] == ""
    assert "1 late (mistake), graded and marked" in ran.stdout and "01: 10 (total 10)" in ran.stdout
    assert data["settings"]["due"] == "2030-01-01T00:00:00+00:00" and data["settings"]["points"] == "01=10"
    feedback = (tmp / "feedback" / "mistake.md").read_text(encoding="utf-8")
    assert feedback.startswith("# Feedback: mistake") and MISTAKE.name in feedback and "marked late" in feedback
    failed = [c for c in data["rows"] if c["submission"] == "mistake"][0]["checks"]
    for check in failed:
        assert f"{check['title']} ({check['status']})" in feedback
    assert sorted(p.name for p in (tmp / "feedback").iterdir()) == sorted(f"{n}.md" for n in rows)


def test_regrading_one_submission_merges_into_the_report(graded, tmp_path):
    """``--merge``: one submission re-graded (its file fixed), its row replaced in every report; the
    others kept as they were; a report graded with another seed is refused."""
    _, rows, data, tmp = graded
    work = tmp_path / "reports"
    work.mkdir()
    for name in ("grades.json", "grades.csv"):
        (work / name).write_bytes((tmp / name).read_bytes())
    fixed = tmp_path / "mistake"
    (fixed / "katas" / "01").mkdir(parents=True)
    (fixed / K01.stub).write_text(REFERENCE)
    ran = kvkata(manifest.REPO_ROOT, "grade", str(fixed), "--json", str(work / "grades.json"), "--merge", "--report",
                 str(work / "grades.csv"), "--gradebook", str(work / "book.csv"), "--timeout", "30", "--quiet")
    assert ran.returncode == 0, ran.stderr[-2000:]
    merged = json.loads((work / "grades.json").read_text())["rows"]
    assert [r["submission"] for r in merged] == [r["submission"] for r in data["rows"]]
    after = {r["submission"]: r for r in merged}
    assert after["mistake"]["status"] == "pass" and after["mistake"]["passed"] == after["mistake"]["total"]
    before = {r["submission"]: r for r in data["rows"]}
    assert all(after[n] == before[n] for n in before if n != "mistake")
    assert len(list(csv.DictReader(io.StringIO((work / "grades.csv").read_text())))) == len(before)
    other_seed = kvkata(manifest.REPO_ROOT, "grade", str(fixed), "--json", str(work / "grades.json"), "--merge",
                        "--seed", "3", "--quiet")
    usage_error(other_seed, "--seed")
    usage_error(kvkata(manifest.REPO_ROOT, "grade", str(fixed), "--merge"), "--merge needs --json")


def _synthetic(kata: str, statuses: list[str], submission: str = "ann") -> dict:
    return {"submission": submission, "kata": kata, "passed": statuses.count("pass"), "total": len(statuses),
            "status": "fail", "diagnosis": "", "note": "", "seconds": 1.0, "submitted": "", "late": False,
            "checks": [{"id": f"c{i}", "title": f"check {i}", "status": s, "message": f"{s} here" if s != "pass" else "",
                        "diagnoses": []} for i, s in enumerate(statuses)]}


def test_kata_picks_single_katas_for_grading(tmp_path):
    from grader.classroom import choice
    from grader.classroom.cohort import grading

    for k in ("01", "03"):
        (tmp_path / "sub" / "katas" / k).mkdir(parents=True)
        shutil.copyfile(manifest.REPO_ROOT / manifest.get(k).solution, tmp_path / "sub" / manifest.get(k).stub)
    assert [j.kata.id for j in grading.jobs_for([str(tmp_path / "sub")], None, False)] == ["01", "03"]
    assert [j.kata.id for j in grading.jobs_for([str(tmp_path / "sub")], None, False, ["3"])] == ["03"]
    assert [k.id for k in choice.katas(None, False, ["05", "01", "5"])] == ["01", "05"]
    for level, only, ids, words in ((1, False, ["01"], "not both"), (None, False, ["42"], "--kata 42"),
                                    (None, False, None, "--level"), (9, True, None, "--level 9")):
        with pytest.raises(UsageError, match=words):
            choice.katas(level, only, ids)


def test_junit_counts_match_the_elements(tmp_path):
    from grader.classroom.cohort import reports

    statuses = ["pass", "fail", "not-run", "not-implemented", "timeout", "error", "pass", "not-run"]
    reports.write_junit([_synthetic("01", statuses), _synthetic("02", ["fail", "pass"])], tmp_path / "r.xml")
    suite = ET.parse(tmp_path / "r.xml").getroot()[0]
    cases = suite.findall("testcase")
    count = {kind: sum(c.find(kind) is not None for c in cases) for kind in ("failure", "error", "skipped")}
    assert count == {"failure": 3, "error": 1, "skipped": 3}
    assert {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")} == \
        {"tests": len(cases), "failures": count["failure"], "errors": count["error"], "skipped": count["skipped"]}
    assert len(cases) == 10


def test_points_weigh_katas_as_the_instructor_sets_them():
    """Kata 04 has twice kata 02's checks; given 10 points each, all passed is 10 in both, and half
    of kata 04's checks is 5."""
    from grader.classroom import choice
    from grader.classroom.cohort import grading

    n02, n04 = len(checks.for_kata("02").all), len(checks.for_kata("04").all)
    assert n04 > n02
    rows = [_synthetic("02", ["pass"] * n02), _synthetic("04", ["pass"] * (n04 // 2) + ["fail"] * (n04 - n04 // 2))]
    points = grading.score(rows, "02=10,04=10")
    assert points == {"02": 10.0, "04": 10.0} and rows[0]["points"] == 10
    assert rows[1]["points"] == pytest.approx(10 * (n04 // 2) / n04)
    assert grading.score(rows, None) == {"02": n02, "04": n04}  # one a check by default
    assert choice.points("5,04=20", [manifest.get("02"), manifest.get("04")]) == {"02": 5.0, "04": 20.0}
    for bad in ("01=x", "0", "04=-1", "03=5"):
        with pytest.raises(UsageError):
            choice.points(bad, [manifest.get("02"), manifest.get("04")])


def test_written_files_take_the_mode_the_umask_gives(tmp_path):
    from grader import state

    for mask, mode in ((0o002, 0o664), (0o022, 0o644), (0o077, 0o600)):
        old = os.umask(mask)
        try:
            assert state.umask() == mask
            state.write_atomic(tmp_path / f"f{mask:o}", b"x")
        finally:
            os.umask(old)
        assert stat.S_IMODE((tmp_path / f"f{mask:o}").stat().st_mode) == mode

@pytest.mark.skipif(os.geteuid() != 0, reason="only root can become another user")
def test_a_worker_run_by_root_becomes_a_user_who_owns_nothing(tmp_path):
    from grader.classroom.cohort import confine

    secret = tmp_path / "root-only"
    secret.write_text("instructor's")
    secret.chmod(0o600)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            confine.drop(confine.UNPRIVILEGED)
            try:
                secret.read_text()
            except PermissionError:
                code = 0 if os.getuid() == confine.UNPRIVILEGED and os.getgroups() == [] else 2
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def test_a_worker_is_dropped_only_where_it_can_still_read_what_it_runs(tmp_path):
    from grader.classroom.cohort import confine

    (tmp_path / "open" / "lib").mkdir(parents=True)
    (tmp_path / "open" / "lib" / "module.py").write_text("")
    (tmp_path / "closed" / "lib").mkdir(parents=True)
    (tmp_path / "closed" / "lib" / "module.py").write_text("")
    for folder in (tmp_path, tmp_path / "open", tmp_path / "open" / "lib", tmp_path / "closed" / "lib"):
        folder.chmod(0o755)
    (tmp_path / "closed").chmod(0o700)
    (tmp_path / "open" / "lib" / "module.py").chmod(0o644)
    reachable = all(os.stat(p).st_mode & 0o001 for p in tmp_path.parents)
    assert confine.reachable_by_others(str(tmp_path / "open" / "lib" / "module.py")) == reachable
    assert not confine.reachable_by_others(str(tmp_path / "closed" / "lib" / "module.py"))
    (tmp_path / "open" / "lib" / "module.py").chmod(0o600)
    assert not confine.reachable_by_others(str(tmp_path / "open" / "lib" / "module.py"))
