"""A red team of our own: hostile kata-01 submissions (``tests/redteam/``, one technique each), graded in
one ``kvkata grade`` cohort beside an honest classmate, and the most dangerous through the Gradescope
autograder run in a temporary root. Each must score no more than its honest content (every one is the
untouched stub plus an attack: nothing), change nothing outside its sandbox, read nothing it must not
(nothing planted outside it shows up in any report), reach no network and leave no process behind.

The kernel is what refuses (grader.classroom.cohort.confine); on a machine whose kernel offers no walls
the suite is skipped, as the report itself then says "audit hook only" on every row.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from conftest import K01, copy_repo, kvkata, slow
from grader import checks, manifest
from grader.classroom.cohort import confine, sandbox

pytestmark = [slow, pytest.mark.skipif(sandbox.walls()["isolation"] != confine.KERNEL,
                                       reason="this kernel offers no isolation: the report says so, and attacks win")]

REDTEAM = Path(__file__).parent / "redteam"
ATTACKS = sorted(p.stem for p in REDTEAM.glob("*.py"))
SECRET = "kvkata-redteam-" + hashlib.sha256(os.urandom(16)).hexdigest()[:16]  # planted outside every sandbox
STUB = (manifest.REPO_ROOT / K01.stub).read_text()
REFERENCE = (manifest.REPO_ROOT / K01.solution).read_text()
# what only the reference, the hidden checks or the environment hold; none may reach a report
LEAKS = [line.strip() for line in REFERENCE.splitlines() if len(line.strip()) > 40 and line not in STUB][:3]
LEAKS += ['CHECKS = Checks("01")', SECRET]
# what the kernel cannot wall off: the submission shares its process with the grader's recording half
OPEN = {"frames_reference": "the worker holds the reference to shrink a failing input; its frames reach it",
        "gc_thread_reference": "the worker holds the reference to shrink a failing input; the heap reaches it",
        "forged_records": "the worker writes its own records; where replay cannot call a learner's object, the "
                          "verdict recorded there stands, so a rewritten record can pass such a check"}


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and ".git" not in p.parts}


def _attack(name: str, values: dict[str, str]) -> str:
    text = (REDTEAM / f"{name}.py").read_text()
    for token, value in values.items():
        text = text.replace(f"@{token}@", value)
    return STUB + "\n\n" + text


def _ours(marker: str) -> list[int]:
    """Processes still alive whose environment holds ``marker`` (a path only this grading used)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if marker.encode() in Path(f"/proc/{entry}/environ").read_bytes():
                    state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        found.append(int(entry))
            except OSError:
                pass
    return found


class Listeners:
    """A UDP and a TCP listener on the machine's loopback, which no submission may reach."""

    def __init__(self):
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", self.udp.getsockname()[1]))
        self.tcp.listen(8)
        self.port = self.udp.getsockname()[1]

    def heard(self) -> list[str]:
        heard = []
        for s in (self.udp, self.tcp):
            s.setblocking(False)
        try:
            heard.append(self.udp.recv(100).decode(errors="replace"))
        except BlockingIOError:
            pass
        try:
            heard.append(f"a TCP connection from {self.tcp.accept()[1]}")
        except BlockingIOError:
            pass
        return heard


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("redteam")
    repo = copy_repo(tmp / "repo")
    torch.save({"secret": SECRET}, tmp / "canary.pt")
    classmate = tmp / "subs" / "classmate" / K01.stub
    classmate.parent.mkdir(parents=True)
    classmate.write_text(REFERENCE)
    (tmp / "subs" / "untouched" / "katas" / "01").mkdir(parents=True)
    (tmp / "subs" / "untouched" / K01.stub).write_text(STUB)
    (tmp / "gradescope" / "results").mkdir(parents=True)
    (tmp / "gradescope" / "results" / "results.json").write_text(SECRET)
    listeners = Listeners()
    values = {"REPO": str(repo), "CANARY": str(tmp / "canary"), "CLASSMATE": str(classmate),
              "REPORT": str(tmp / "grades.csv"), "PORT": str(listeners.port), "GRADER_PIDS": str(os.getpid()),
              "ROOT": str(tmp / "gradescope")}
    for name in ATTACKS:
        (tmp / "subs" / name / "katas" / "01").mkdir(parents=True)
        (tmp / "subs" / name / K01.stub).write_text(_attack(name, values))
    before, outside = _digest(repo), _digest(tmp / "gradescope") | {"canary.pt": _digest(tmp)["canary.pt"]}
    os.environ["KVKATA_REDTEAM_SECRET"] = SECRET  # the instructor's environment, which no row may show
    try:
        started = time.monotonic()
        ran = kvkata(repo, "grade", *sorted(str(p) for p in (tmp / "subs").iterdir()), "-j", "2", "--timeout", "20",
                     "--memory", "1024", "--report", str(tmp / "grades.csv"), "--json", str(tmp / "grades.json"))
        seconds = time.monotonic() - started
    finally:
        del os.environ["KVKATA_REDTEAM_SECRET"]
    assert ran.returncode == 0, ran.stderr[-3000:]
    time.sleep(2)  # what a detached child would have waited for
    return {"ran": ran, "tmp": tmp, "repo": repo, "before": before, "outside": outside, "values": values,
            "listeners": listeners, "seconds": seconds, "classmate": classmate,
            "rows": {r["submission"]: r for r in json.loads((tmp / "grades.json").read_text())["rows"]}}


def test_the_red_team_is_large_enough():
    assert len(ATTACKS) >= 30


@pytest.mark.parametrize("name", ATTACKS)
def test_each_attack_scores_nothing(cohort, name, request):
    if name in OPEN:
        request.applymarker(pytest.mark.xfail(reason=OPEN[name], strict=True))
    row = cohort["rows"][name]
    assert row["isolation"] == confine.KERNEL
    assert row["passed"] == 0, (row["status"], row["note"], [c["message"][:200] for c in row["checks"]])
    assert row["status"] in ("tampered", "crash", "fail", "not-started", "timeout"), row


def test_the_controls_score_what_they_deserve(cohort):
    rows = cohort["rows"]
    total = len(checks.for_kata("01").all)
    assert (rows["classmate"]["passed"], rows["classmate"]["status"]) == (total, "pass")
    assert (rows["untouched"]["passed"], rows["untouched"]["status"]) == (0, "not-started")
    assert cohort["classmate"].read_text() == REFERENCE


def test_what_was_refused_is_shown(cohort):
    """Refused by the audit hook (Python-level): the row is 'tampered' and says what was tried; refused by the
    kernel alone (C-level), the row shows the error the submission got."""
    rows = cohort["rows"]
    for name in ("poison_grader_code", "report_written_now", "mmap_reference", "zipfile_reference",
                 "subprocess_shell", "fork_child", "kill_grader", "monkeypatch_torch", "ctypes_reference"):
        assert rows[name]["status"] == "tampered", (name, rows[name]["note"])
    assert rows["code_swap"]["status"] == "tampered" and "replaced the code" in rows["code_swap"]["note"]
    for name in ("from_file_reference", "from_file_shared_poison", "hidden_checks_shown", "torch_save_poison",
                 "classmate_copy", "torch_load_canary", "proc_mem_parent"):
        assert "Permission denied" in rows[name]["note"] or "tampered" == rows[name]["status"], (name, rows[name]["note"])


def test_nothing_outside_a_sandbox_changed(cohort):
    tmp = cohort["tmp"]
    assert _digest(cohort["repo"]) == cohort["before"]  # the references, the checks, the grader's code
    assert _digest(tmp / "gradescope") | {"canary.pt": _digest(tmp)["canary.pt"]} == cohort["outside"]
    assert not (cohort["repo"] / "grader" / "planted.db").exists()
    assert not (tmp / "grades.csv.json").exists()


def test_the_reports_are_the_graders_alone(cohort):
    rows = list(csv.DictReader(io.StringIO((cohort["tmp"] / "grades.csv").read_text())))
    assert len(rows) == len(ATTACKS) + 2 and len({r["submission"] for r in rows}) == len(rows)
    assert {r["submission"]: r["passed"] for r in rows} == {n: str(r["passed"]) for n, r in cohort["rows"].items()}


def test_nothing_planted_outside_reaches_a_report(cohort):
    reports = (cohort["tmp"] / "grades.json").read_text() + (cohort["tmp"] / "grades.csv").read_text()
    reports += cohort["ran"].stdout + cohort["ran"].stderr
    for leak in LEAKS:
        assert leak not in reports, leak


def test_no_network_was_reached(cohort):
    assert cohort["listeners"].heard() == []


def test_no_process_is_left(cohort):
    assert _ours(str(cohort["repo"])) == []
    assert all("process(es) running" not in row["note"] or "killed" in row["note"] for row in cohort["rows"].values())


def test_the_cohort_takes_well_under_a_minute_of_grading(cohort):
    assert cohort["seconds"] < 120, cohort["seconds"]  # about 40 pairs on two shared cores


# -- the Gradescope path -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gradescope(tmp_path_factory):
    """The autograder zip unpacked into a temporary root, and one hostile upload run through it."""
    tmp = tmp_path_factory.mktemp("gradescope")
    repo = copy_repo(tmp / "repo")
    made = kvkata(repo, "autograder", "--level", "1", "--only", "--out", str(tmp / "autograder.zip"), "--timeout", "20")
    assert made.returncode == 0, made.stderr
    root = tmp / "autograder"
    with zipfile.ZipFile(tmp / "autograder.zip") as archive:
        archive.extractall(root / "source")
    os.chmod(root / "source" / "run_autograder", 0o755)
    (root / "submission").mkdir()
    (root / "submission" / "append.py").write_text(_attack("gradescope_all_at_once", {"ROOT": str(root)}))
    before = _digest(root / "source")
    env = {**os.environ, "KVKATA_AUTOGRADER_ROOT": str(root), "KVKATA_REDTEAM_SECRET": SECRET,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    ran = subprocess.run(["bash", str(root / "source" / "run_autograder")], cwd=root, env=env, capture_output=True,
                         text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-2000:]
    time.sleep(4)  # what the detached child waits for
    return {"ran": ran, "root": root, "before": before,
            "results": json.loads((root / "results" / "results.json").read_text())}


def test_on_gradescope_the_attack_scores_nothing_and_changes_nothing(gradescope):
    results, root = gradescope["results"], gradescope["root"]
    assert results["score"] == 0.0 and len(results["tests"]) >= len(checks.for_kata("01").all)
    assert _digest(root / "source") == gradescope["before"]
    assert "isolation: kernel" in results["output"]
    assert SECRET not in json.dumps(results) + gradescope["ran"].stdout
    assert _ours(str(root)) == []
