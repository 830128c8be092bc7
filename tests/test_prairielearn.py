"""``kvkata prairielearn``: build a PrairieLearn question for kata 01, then run its real entry point
(``tests/run.sh``) under ``KVKATA_PRAIRIELEARN_ROOT`` on a correct, a wrong, an empty and a broken
submission, as PrairieLearn's external grader runs it (``/grade/tests``, ``/grade/student``)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import K01, kvkata, slow, usage_error
from grader import checks, manifest, mistakes

pytestmark = slow  # each test runs the grader in a subprocess

REFERENCE = (manifest.REPO_ROOT / K01.solution).read_text()
MISTAKE = mistakes.catalogue("01")[0]


@pytest.fixture(scope="module")
def question(tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("pl") / "kvkata-01"
    made = kvkata(manifest.REPO_ROOT, "prairielearn", "--kata", "01", "--points", "01=10", "--seed", "5",
                  "--out", str(folder), "--timeout", "20", "--image", "example/kvkata-grader")
    assert made.returncode == 0, made.stderr
    return folder, made.stdout


def grade(question: Path, root: Path, files: dict[str, bytes] | None) -> dict:
    """Lay out ``root`` as PrairieLearn's /grade (the question's tests/, the student's files) and run the entry point."""
    shutil.copytree(question / "tests", root / "tests", symlinks=True)
    if files is not None:
        (root / "student").mkdir(parents=True)
        for name, data in files.items():
            (root / "student" / name).write_bytes(data)
    env = {**os.environ, "KVKATA_PRAIRIELEARN_ROOT": str(root), "KVKATA_PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    ran = subprocess.run(["bash", str(root / "tests" / "run.sh")], cwd=root, env=env, capture_output=True, text=True,
                         timeout=600)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return json.loads((root / "results" / "results.json").read_text())


def test_the_question_folder_is_laid_out_as_prairielearn_reads_it(question):
    folder, said = question
    info = json.loads((folder / "info.json").read_text())
    assert {"uuid", "title", "topic", "type"} <= info.keys() and info["gradingMethod"] == "External"
    options = info["externalGradingOptions"]
    assert options["enabled"] is True and options["image"] == "example/kvkata-grader"
    assert options["entrypoint"] == "/grade/tests/run.sh" and 0 < options["timeout"] <= 600
    html = (folder / "question.html").read_text()
    assert f'<pl-file-upload file-names="{K01.file}">' in html and "<pl-external-grader-results>" in html
    assert (folder / "tests" / "run.sh").stat().st_mode & 0o111
    assert "FROM python:" in (folder / "tests" / "Dockerfile").read_text()
    settings = json.loads((folder / "tests" / "source" / "kvkata-autograder.json").read_text())
    assert settings["katas"] == ["01"] and settings["points"] == {"01": 10.0} and settings["seed"] == 5
    assert (folder / "tests" / "source" / K01.solution).is_file()  # in tests/: never shown to students
    assert "01: 10 (total 10)" in said and "docker build -t example/kvkata-grader" in said


def test_a_correct_file_scores_one(question, tmp_path):
    results = grade(question[0], tmp_path, {K01.file: REFERENCE.encode()})
    total = len(checks.for_kata("01").all)
    assert results["gradable"] is True and results["score"] == pytest.approx(1.0)
    assert len(results["tests"]) == total and sum(t["max_points"] for t in results["tests"]) == pytest.approx(10)
    assert all(t["points"] == t["max_points"] and {"name", "message", "output"} <= t.keys() for t in results["tests"])
    assert results["message"] == "10 of 10 points"


def test_a_wrong_file_scores_the_checks_it_passes_and_names_the_mistake(question, tmp_path):
    results = grade(question[0], tmp_path, {K01.file: MISTAKE.apply(REFERENCE).encode()})
    passed = sum(t["points"] > 0 for t in results["tests"])
    assert 0 < results["score"] < 1 and results["score"] == pytest.approx(passed / len(results["tests"]))
    assert any(MISTAKE.name in t["output"] for t in results["tests"])


def test_no_file_scores_zero_and_says_what_to_upload(question, tmp_path):
    results = grade(question[0], tmp_path, {})
    assert results["gradable"] is True and results["score"] == 0 and f"katas/01/{K01.file}" in results["output"]


def test_a_broken_grader_is_not_gradable(question, tmp_path):
    broken = tmp_path / "broken"
    (broken / "tests").mkdir(parents=True)
    shutil.copyfile(question[0] / "tests" / "run.sh", broken / "tests" / "run.sh")  # no source beside it
    results = grade(broken, tmp_path / "root", {K01.file: b"x = 1\n"})
    assert results["gradable"] is False and "not your fault" in results["format_errors"][0]


def test_bad_options_are_usage_errors(tmp_path):
    usage_error(kvkata(manifest.REPO_ROOT, "prairielearn", "--out", str(tmp_path / "q")), "--level")
    usage_error(kvkata(manifest.REPO_ROOT, "prairielearn", "--kata", "01", "--points", "01=0",
                       "--out", str(tmp_path / "q")), "--points")
