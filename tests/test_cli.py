"""The ``kvkata`` command, driven for real: ``python -m grader.cli`` in subprocesses, on a temporary
copy of the repository (a git checkout of its own), so nothing here touches the working tree.
Kata 01 is the worked example; everything else is read from the manifest."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import K01, KATAS, copy_repo, git, kvkata, slow, usage_error
from grader import manifest

pytestmark = slow  # kvkata in subprocesses, on a copy of the repository


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return copy_repo(tmp_path / "repo")


def test_board_lists_every_kata_by_level_and_the_next_command(repo):
    out = kvkata(repo)
    assert out.returncode == 0, out.stderr
    for kata in KATAS:
        line = next(l for l in out.stdout.splitlines() if l.strip().startswith(f"{kata.id} "))
        assert kata.title in line and f"{kata.minutes} min" in line and "not started" in line
    for level in {k.level for k in KATAS}:
        assert f"level {level} · {manifest.levels()[level]}" in out.stdout
    assert out.stdout.rstrip().endswith(f"pytest katas/{KATAS[0].id}")


def test_clear_errors_exit_2_without_a_traceback(repo):
    usage_error(kvkata(repo, "hint", "99"), "unknown kata '99'", "valid ids: " + ", ".join(k.id for k in KATAS))
    usage_error(kvkata(repo, "check", "nine"), "unknown kata")
    usage_error(kvkata(repo, "reset"), "--all")
    usage_error(kvkata(repo, "submit"), "no interview session is open")
    usage_error(kvkata(repo, "interview", "--kata", "01", "--minutes", "0"), "--minutes")
    usage_error(kvkata(repo, "interview", "--level", "9"), "no kata has level 9")
    usage_error(kvkata(repo, "solution", "01"), "does not pass yet", "--force")
    usage_error(kvkata(repo, "grade", str(repo / "nowhere")), "not a folder")
    assert kvkata(repo, "no-such-command").returncode == 2  # argparse's own usage error


def test_check_grades_like_pytest_and_feeds_the_board(repo):
    pytest_run = subprocess.run([sys.executable, "-m", "pytest", "-q", "katas/01"], cwd=repo, capture_output=True,
                                text=True, env={**os.environ, "PYTHONPATH": str(repo)}, timeout=300)
    assert pytest_run.returncode == 1, pytest_run.stdout[-2000:]
    saved_by_pytest = json.loads((repo / ".kvkata" / "results.json").read_text())["01"]
    assert f"0/{saved_by_pytest['total']} checks" in kvkata(repo).stdout

    stub = (repo / K01.stub).read_text()
    shutil.copyfile(repo / K01.solution, repo / K01.stub)
    checked = kvkata(repo, "check", "01", "--device", "cpu")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    saved = json.loads((repo / ".kvkata" / "results.json").read_text())["01"]
    assert saved["checks"].keys() == saved_by_pytest["checks"].keys()  # the same checks as pytest katas/01
    assert saved["passed"] == saved["total"] == saved_by_pytest["total"]
    assert f"{saved['total']}/{saved['total']} checks ✓" in kvkata(repo).stdout
    assert kvkata(repo).stdout.rstrip().endswith(f"pytest katas/{KATAS[1].id}")

    diff = kvkata(repo, "solution", "01")  # unlocked now that the kata passes
    assert diff.returncode == 0 and f"+++ {K01.solution}" in diff.stdout and f"--- {K01.stub}" in diff.stdout
    assert "-    raise NotImplementedError" in diff.stdout
    (repo / K01.stub).write_text(stub)


def test_hints_come_one_at_a_time_and_are_remembered(repo):
    total = len(K01.hints)
    for n in range(1, total + 1):
        out = kvkata(repo, "hint", "01").stdout
        assert f"hint {n} of {total}" in out and K01.hints[n - 1].split()[0] in out
    assert "shown already" in kvkata(repo, "hint", "01").stdout
    everything = kvkata(repo, "hint", "1", "--all").stdout
    assert all(f"hint {n} of {total}" in everything for n in range(1, total + 1))


def test_reset_backs_the_learner_file_up_then_restores_the_stub(repo):
    stub_path = repo / K01.stub
    pristine = stub_path.read_text()
    mine = pristine.replace('raise NotImplementedError("kata 01: append_kv — see README, task 1")', "return cache  # my try")
    assert mine != pristine
    stub_path.write_text(mine)
    if shutil.which("git"):  # a learner who commits their progress still gets the untouched stub back
        git(repo, "commit", "-qam", "my progress")
    out = kvkata(repo, "reset", "01")
    assert out.returncode == 0, out.stderr
    backup = Path(next(l for l in out.stdout.splitlines() if l.startswith("saved your")).split(" to ", 1)[1])
    assert backup.read_text() == mine and backup.is_relative_to(repo / ".kvkata")
    assert stub_path.read_text() == pristine
    assert "already the untouched stub" in kvkata(repo, "reset", "01").stdout
    everything = kvkata(repo, "reset", "--all")
    assert everything.returncode in (0, 1) and "Traceback" not in everything.stderr


def test_an_interview_session_from_start_to_history_and_quiz(repo):
    katas_before = {p: p.read_bytes() for p in (repo / "katas").rglob("*") if p.is_file()}
    started = kvkata(repo, "interview", "--kata", "01", "--minutes", "5")
    assert started.returncode == 0, started.stderr
    file = Path(next(l for l in started.stdout.splitlines() if l.startswith("edit this file:")).split(":", 1)[1].strip())
    assert file.name == K01.file and file.is_relative_to(repo / ".kvkata") and "deadline" in started.stdout
    assert (file.parent / "README.md").is_file()
    usage_error(kvkata(repo, "interview", "--kata", "01"), "--abandon")

    assert "1 hint(s) used" in kvkata(repo, "hint").stdout
    shutil.copyfile(repo / K01.solution, file)
    session = repo / ".kvkata" / "session.json"
    state = json.loads(session.read_text())
    state["started_epoch"] -= 3600  # an hour ago: overtime
    session.write_text(json.dumps(state))
    submitted = kvkata(repo, "submit", "--device", "cpu")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert all(f.question in submitted.stdout for f in K01.followups) and "over" in submitted.stdout
    assert {p: p.read_bytes() for p in (repo / "katas").rglob("*") if p.is_file()} == katas_before

    kvkata(repo, "interview", "--kata", "01")
    assert kvkata(repo, "interview", "--kata", "01", "--abandon").returncode == 0
    history = json.loads(kvkata(repo, "history", "--json").stdout)
    first = history[0]
    assert {"kata", "started", "elapsed_s", "passed", "total", "hints_used", "overtime"} <= first.keys()
    assert (first["kata"], first["passed"], first["hints_used"], first["overtime"]) == ("01", first["total"], 1, True)
    assert first["elapsed_s"] >= 3600 and [h["status"] for h in history] == ["submitted", "abandoned"]
    assert "abandoned" in kvkata(repo, "history").stdout

    numeric = [f for f in K01.followups if f.value is not None]
    right = kvkata(repo, "quiz", "01", stdin="".join(f"{f.value:g}\n" for f in numeric))
    assert right.returncode == 0 and f"{len(numeric)} of {len(numeric)} right" in right.stdout
    wrong = kvkata(repo, "quiz", "01", stdin="-1\n")
    assert wrong.returncode == 1 and f"0 of {len(numeric)} right" in wrong.stdout


def test_corrupt_state_is_moved_aside_with_a_warning(repo):
    state = repo / ".kvkata"
    state.mkdir()
    (state / "results.json").write_text("{not json")
    (state / "session.json").write_text("[1, 2]")
    out = kvkata(repo)
    assert out.returncode == 0 and "not started" in out.stdout and "Traceback" not in out.stderr
    assert "moved it to" in out.stderr
    assert any(p.name.startswith("results.json.corrupt") for p in state.iterdir())
    assert not (state / "session.json").exists()
