"""The pytest plugin, driven as a learner drives it: ``pytest katas/01`` in a subprocess."""
from __future__ import annotations

import re
import textwrap
from xml.etree import ElementTree as ET

import pytest

from conftest import slow
from grader import checks, manifest
from grader.engine import report

ROOT = manifest.REPO_ROOT
pytest_plugins = ["pytester"]
CHECKS = checks.for_kata("01").all
TOTAL = len(CHECKS)
# Each test is a pytest subprocess; the inner loop keeps two: the untouched stub and a wrong file.


@pytest.fixture
def run(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("KVKATA_STATE", str(tmp_path / "state"))
    monkeypatch.chdir(ROOT)

    def run(*args):
        return pytester.runpytest_subprocess(*args)

    return run


def _write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def test_untouched_stub_gives_one_short_line_per_check(run, tmp_path):
    result = run("katas/01")
    assert result.ret == 1
    out = result.stdout.str()
    assert report.NOT_IMPLEMENTED.format(name="append_kv") in out
    assert f"kata 01: 0/{TOTAL} checks pass — start with task 1, append_kv" in out
    assert "Traceback" not in out and "NotImplementedError" not in out
    assert "kata 01 (Appending to the cache) · target katas/01/append.py · device cpu" in out
    assert (tmp_path / "state" / "results.json").is_file()


@slow
def test_reference_passes_and_header_names_everything(run):
    result = run("katas/01", "--kata-target=solution")
    assert result.ret == 0
    out = result.stdout.str()
    assert "target the reference" in out and "torch" in out and "seed 0" in out
    assert f"kata 01: {TOTAL}/{TOTAL} checks pass" in out


def test_a_wrong_file_fails_with_a_diagnosis(run, tmp_path):
    source = (ROOT / "solutions/01/append.py").read_text().replace("dim=2)  # (B, H, S + T, D)", "dim=1)  # (B, H, S + T, D)")
    target = _write(tmp_path, "mine.py", source)
    result = run("katas/01", f"--kata-target={target}")
    assert result.ret == 1
    out = result.stdout.str()
    assert "this looks like a known mistake: concatenating on the head axis" in out
    assert "on input" in out and "expected" in out


@slow
def test_a_hanging_target_fails_alone_after_the_timeout(run, tmp_path):
    source = (ROOT / "solutions/01/append.py").read_text().replace(
        "    if cache is None:\n        return k_new, v_new\n", "    while True:\n        pass\n")
    target = _write(tmp_path, "hangs.py", source)
    result = run("katas/01", f"--kata-target={target}", "--kata-timeout=1", "-k", "append_kv_grows or attention_rejects_bad_input")
    out = result.stdout.str()
    assert report.TIMED_OUT.format(seconds=1.0) in out
    result.assert_outcomes(failed=1, passed=1)


@slow
def test_a_crash_in_learner_code_fails_that_check_only(run, tmp_path):
    target = _write(tmp_path, "crash.py", (ROOT / "solutions/01/append.py").read_text().replace(
        "        return self._layers[layer]\n\n    def seq_len", "        return 1 / 0\n\n    def seq_len"))
    result = run("katas/01", f"--kata-target={target}")
    out = result.stdout.str()
    assert "your code raised ZeroDivisionError: division by zero" in out
    assert "crash.py" in out and "grader/engine" not in out and "core.py" not in out
    outcomes = result.parseoutcomes()  # only checks that reach DynamicKVCache.update fail
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == TOTAL and outcomes.get("failed", 0) >= 1
    assert outcomes.get("passed", 0) >= sum(not c.uses.startswith("DynamicKVCache") for c in CHECKS) - 1, out


@slow
def test_a_file_that_does_not_import_fails_every_check_with_the_reason(run, tmp_path):
    target = _write(tmp_path, "broken.py", "def append_kv(:\n")
    result = run("katas/01", f"--kata-target={target}")
    assert "has a syntax error at line 1" in result.stdout.str()
    result.assert_outcomes(failed=TOTAL)


@slow
def test_bad_option_values_and_unknown_katas_are_rejected_with_the_valid_ones(run):
    result = run("katas/01", "--kata-device=tpu")
    assert result.ret != 0 and "expected one of auto, cpu, cuda" in result.stderr.str()
    result = run("katas/99")
    assert result.ret != 0 and "unknown kata '99'" in result.stderr.str() and "01" in result.stderr.str()


def test_a_looping_function_costs_one_check_limit(run, tmp_path):
    """The check that hangs fails alone; the others that call the function that hung say so at once."""
    k04 = manifest.get("04")
    source = (ROOT / k04.solution).read_text()
    line = "    # Why 2: each layer"  # inside kv_bytes_per_token, which most of kata 04's functions call
    assert source.count(line) == 1
    looping = tmp_path / "memory.py"
    looping.write_text(source.replace(line, "    while True:\n        pass\n" + line))
    limit = 2
    result = run("katas/04", f"--kata-target={looping}", f"--kata-timeout={limit}", f"--junitxml={tmp_path / 'j.xml'}")
    out = result.stdout.str()
    assert result.ret == 1
    cases = ET.parse(tmp_path / "j.xml").getroot().iter("testcase")
    seconds = {case.get("name"): float(case.get("time")) for case in cases}
    assert sum(seconds.values()) < 2 * limit, seconds  # one limit in all, not one per check
    reported = out.split("short test summary info")[0]  # pytest's own one-line summary repeats it, cut to the width
    assert reported.count(report.TIMED_OUT.format(seconds=limit)) == 1 and "it hung in `kv_bytes_per_token`" in out
    not_run = int(re.search(r"(\d+) not run", out).group(1))
    assert not_run >= 10 and f"{not_run} check(s) not run: each calls `kv_bytes_per_token`" in out, out


def test_a_function_that_hung_is_the_learners_again_after_grading():
    """A notebook's namespace is graded in place: the function stopped after its timeout is put back."""
    from grader import grade
    from grader.engine import targets

    source = (ROOT / manifest.get("04").solution).read_text()
    line = "    # Why 2: each layer"
    namespace = {"__name__": "__main__"}
    exec(compile(source.replace(line, "    while True:\n        pass\n" + line), "<notebook-cell>", "exec"), namespace)
    original = namespace["kv_bytes_per_token"]
    results = grade.grade("04", targets.from_namespace(namespace), timeout=3)
    assert [r.status for r in results].count("timeout") == 1 and any(r.status == "not-run" for r in results), [(r.status, r.message) for r in results[:3]]
    assert namespace["kv_bytes_per_token"] is original


@slow
def test_during_an_interview_session_pytest_says_which_file_it_grades(run, tmp_path):
    """A session's copy of the stub still says "run pytest katas/01": that grades the repository's file,
    and the run says so, with the command that grades the session's."""
    import json

    (tmp_path / "state").mkdir()
    session_file = tmp_path / "state" / "sessions" / "s1" / "append.py"
    (tmp_path / "state" / "session.json").write_text(json.dumps({"id": "s1", "kata": "01", "file": str(session_file),
                                                                "started_epoch": 0, "minutes": 25}))
    out = run("katas/01").stdout.str()
    lines = [line for line in out.splitlines() if "interview session of this kata is open" in line]
    assert len(lines) == 2, out  # in the header and again under the summary
    assert all("katas/01/append.py" in line and str(session_file) in line and "kvkata check" in line
               for line in lines), lines


def test_the_kata_summary_names_each_mistake_once():
    """Five checks naming one mistake give one summary line: the check it is explained under, and how many more."""
    from grader.engine import Result
    from grader.plugin import looks_like

    results = [Result(c, "fail", "m", ["tiled"]) for c in CHECKS[:3]] + [Result(CHECKS[3], "pass")]
    lines = looks_like(results)
    assert lines == [f"  {CHECKS[0].title}: looks like tiled (and 2 more check(s))"], lines
