"""``kvkata autograder``: build the Gradescope zip, then run its real ``run_autograder`` under
``KVKATA_AUTOGRADER_ROOT`` on a correct, a wrong, an empty, a hanging and a broken submission."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import K01, copy_repo, kvkata, slow, usage_error
from grader import checks, manifest, mistakes

pytestmark = slow  # each test runs the built autograder in a subprocess

REFERENCE = (manifest.REPO_ROOT / K01.solution).read_text()
MISTAKE = mistakes.catalogue("01")[0]
LEVEL1 = [k for k in manifest.load().values() if k.level == 1]


@pytest.fixture(scope="module")
def autograder(tmp_path_factory) -> Path:
    """The zip, built by the CLI from a copy of the repository, unpacked as Gradescope would."""
    tmp = tmp_path_factory.mktemp("autograder")
    repo = copy_repo(tmp / "repo")
    zip_path = tmp / "autograder.zip"
    made = kvkata(repo, "autograder", "--level", "1", "--only", "--out", str(zip_path), "--timeout", "10",
                  "--visibility", "after_published")
    assert made.returncode == 0, made.stderr
    with zipfile.ZipFile(zip_path) as archive:
        names = archive.namelist()
        assert {"setup.sh", "run_autograder", "kvkata-autograder.json", "pyproject.toml"} <= set(names)
        assert archive.getinfo("run_autograder").external_attr >> 16 & 0o111  # executable
        assert f"solutions/01/{K01.file}" in names and "grader/checks/k05.py" not in names
        archive.extractall(tmp / "source")
    os.chmod(tmp / "source" / "run_autograder", 0o755)
    return tmp / "source"


def _run(source: Path, tmp_path: Path, files: dict[str, bytes]) -> dict:
    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True)
    for name, data in files.items():
        (root / "submission" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "submission" / name).write_bytes(data)
    os.symlink(source, root / "source")
    env = {**os.environ, "KVKATA_AUTOGRADER_ROOT": str(root),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    ran = subprocess.run(["bash", str(root / "source" / "run_autograder")], cwd=root, env=env, capture_output=True,
                         text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return json.loads((root / "results" / "results.json").read_text())


def _tests_of(results: dict, kata: str) -> list[dict]:
    return [t for t in results["tests"] if t["number"].startswith(f"{kata}.")]


def test_a_correct_file_alone_scores_every_check_of_its_kata(autograder, tmp_path):
    results = _run(autograder, tmp_path, {K01.file: REFERENCE.encode()})
    total = len(checks.for_kata("01").all)
    ours = _tests_of(results, "01")
    assert len(ours) == total and all(t["status"] == "passed" and t["score"] == t["max_score"] == 1.0 for t in ours)
    assert results["score"] == total  # the other level-1 katas were not submitted: 0 points each
    assert len(results["tests"]) == sum(len(checks.for_kata(k.id).all) for k in LEVEL1)
    assert all(t["visibility"] == "after_published" for t in results["tests"])
    assert {"score", "execution_time", "output", "tests", "stdout_visibility"} <= results.keys()
    assert all({"name", "number", "score", "max_score", "status", "output"} <= t.keys() for t in results["tests"])


def test_a_wrong_file_in_a_zipped_tree_fails_with_the_diagnosis(autograder, tmp_path):
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        archive.writestr(f"my-work/katas/01/{K01.file}", MISTAKE.apply(REFERENCE))
    results = _run(autograder, tmp_path, {"work.zip": packed.getvalue()})
    ours = _tests_of(results, "01")
    assert any(t["status"] == "failed" for t in ours)
    assert any(MISTAKE.name in t["output"] for t in ours)  # the hint reaches the student
    assert 0 < results["score"] < len(ours)


def test_an_empty_submission_scores_zero_and_says_what_to_upload(autograder, tmp_path):
    results = _run(autograder, tmp_path, {})
    assert results["score"] == 0 and all(t["status"] == "failed" for t in results["tests"])
    assert f"katas/01/{K01.file}" in results["output"]


def test_a_hanging_file_is_stopped_and_scored(autograder, tmp_path):
    hang = REFERENCE.replace('    _expect_kv("k_new", k_new)\n', '    _expect_kv("k_new", k_new)\n    while True:\n        pass\n', 1)
    results = _run(autograder, tmp_path, {f"katas/01/{K01.file}": hang.encode()})
    assert "timeout" in results["output"] and results["score"] < len(_tests_of(results, "01"))


def test_a_broken_autograder_still_writes_results(autograder, tmp_path):
    broken = tmp_path / "broken-source"
    broken.mkdir()
    (broken / "run_autograder").write_text((autograder / "run_autograder").read_text())  # no grader beside it
    results = _run(broken, tmp_path, {K01.file: b"x = 1\n"})
    assert results["score"] == 0 and results["tests"] == []
    assert "could not run" in results["output"] or "failed while grading" in results["output"], results["output"]


def test_bad_options_are_usage_errors(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    usage_error(kvkata(repo, "autograder", "--level", "1", "--visibility", "sometimes"), "--visibility")
    usage_error(kvkata(repo, "autograder", "--level", "9", "--only"), "--level 9")


# -- setup.sh finds a Python 3.10 or newer ---------------------------------------------------------
def _fake_bin(folder: Path, old: list[str], apt_gives: dict[str, str]) -> Path:
    """A PATH of its own: ``old`` interpreters that are too old, and an ``apt-get`` that logs its
    calls and, for a package in ``apt_gives``, installs that interpreter (this test's Python)."""
    folder.mkdir()
    for name in old:
        (folder / name).write_text("#!/bin/sh\nexit 1\n")  # a Python 3.8: the version test fails
    installs = "\n".join(f'  *" {package} "*) /bin/ln -sf {sys.executable} {folder / name} ;;'
                         for package, name in apt_gives.items())
    (folder / "apt-get").write_text(f'#!/bin/bash\necho "$*" >> {folder / "apt.log"}\ncase " $* " in\n{installs}\n'
                                    '  *" install "*) exit 100 ;;\nesac\nexit 0\n')
    for path in folder.iterdir():
        path.chmod(0o755)
    return folder


def _pick(folder: Path) -> subprocess.CompletedProcess:
    from grader.classroom import autograder

    script = "set -euo pipefail\n" + autograder.PICK_PYTHON + 'echo "picked $python"\n'
    return subprocess.run(["/bin/bash", "-c", script], env={"PATH": str(folder)}, capture_output=True, text=True,
                          timeout=60)


def test_setup_takes_a_versioned_python_from_apt_when_python3_is_too_old(tmp_path):
    folder = _fake_bin(tmp_path / "bin", old=["python3"], apt_gives={"python3.11": "python3.11"})
    picked = _pick(folder)
    assert picked.returncode == 0 and picked.stdout.strip() == "picked python3.11", picked.stdout + picked.stderr
    log = (folder / "apt.log").read_text()
    assert "install -y python3 python3-venv" in log and "python3.11-venv" in log


def test_setup_stops_with_a_clear_error_when_no_python_is_new_enough(tmp_path):
    picked = _pick(_fake_bin(tmp_path / "bin", old=["python3"], apt_gives={}))
    assert picked.returncode == 1 and "no Python 3.10 or newer" in picked.stderr, picked.stdout + picked.stderr


def test_setup_uses_the_images_python_when_it_is_new_enough(tmp_path):
    folder = _fake_bin(tmp_path / "bin", old=[], apt_gives={})
    (folder / "python3").symlink_to(sys.executable)
    picked = _pick(folder)
    assert picked.stdout.strip() == "picked python3" and not (folder / "apt.log").exists()


# -- one kata, its points and its seed -----------------------------------------------------------------
@pytest.fixture(scope="module")
def kata01_worth_10(tmp_path_factory) -> tuple[Path, str]:
    """``--kata 01 --points 01=10 --seed 7``: the zip of one kata, worth 10 points."""
    tmp = tmp_path_factory.mktemp("kata01")
    zip_path = tmp / "kata01.zip"
    made = kvkata(manifest.REPO_ROOT, "autograder", "--kata", "01", "--points", "01=10", "--seed", "7",
                  "--out", str(zip_path), "--timeout", "20")
    assert made.returncode == 0, made.stderr
    with zipfile.ZipFile(zip_path) as archive:
        archive.extractall(tmp / "source")
    os.chmod(tmp / "source" / "run_autograder", 0o755)
    return tmp / "source", made.stdout


def test_the_zip_builder_prints_the_total_to_enter_in_gradescope(kata01_worth_10):
    source, said = kata01_worth_10
    assert "enter 10 as the assignment's total points in Gradescope" in said and "01: 10 (total 10)" in said
    settings = json.loads((source / "kvkata-autograder.json").read_text())
    assert settings["katas"] == ["01"] and settings["points"] == {"01": 10.0} and settings["seed"] == 7
    assert not (source / "grader" / "checks" / "k02.py").exists()


def test_each_check_is_worth_the_katas_points_over_its_checks(kata01_worth_10, tmp_path):
    source, _ = kata01_worth_10
    total = len(checks.for_kata("01").all)
    right = _run(source, tmp_path / "right", {K01.file: REFERENCE.encode()})
    assert len(right["tests"]) == total and right["score"] == pytest.approx(10)
    assert all(t["max_score"] == pytest.approx(10 / total) for t in right["tests"])
    wrong = _run(source, tmp_path / "wrong", {K01.file: MISTAKE.apply(REFERENCE).encode()})
    passed = sum(t["status"] == "passed" for t in wrong["tests"])
    assert 0 < passed < total and wrong["score"] == pytest.approx(10 * passed / total)


def test_kata_and_level_together_are_a_usage_error(tmp_path):
    usage_error(kvkata(manifest.REPO_ROOT, "autograder", "--level", "1", "--kata", "01", "--out", str(tmp_path / "a.zip")),
                "not both")
    usage_error(kvkata(manifest.REPO_ROOT, "autograder", "--kata", "99", "--out", str(tmp_path / "a.zip")), "--kata 99")
    usage_error(kvkata(manifest.REPO_ROOT, "autograder", "--kata", "01", "--points", "02=5",
                       "--out", str(tmp_path / "a.zip")), "--points 02=5")


def test_the_autograder_grades_with_the_seed_it_was_built_with(kata01_worth_10, tmp_path, monkeypatch):
    """The seed chosen at build time (7 here) draws the inputs of every grading on Gradescope, not the public
    default."""
    from grader.classroom import autograder

    source, _ = kata01_worth_10
    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True)
    (root / "submission" / K01.file).write_text(REFERENCE)
    os.symlink(source, root / "source")
    seen = []
    monkeypatch.setattr(autograder.cohort, "grade_all", lambda jobs, settings, *a: seen.append(settings.seed) or [])
    autograder.grade_submission(root)
    assert seen == [7]
