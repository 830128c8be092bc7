"""The ``kvkata`` command, driven for real: ``python -m grader.cli`` in subprocesses, on a temporary
copy of the repository (a git checkout of its own), so nothing here touches the working tree.
Kata 01 is the worked example; everything else is read from the manifest."""
from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import K01, KATAS, ROOT, copy_repo, git, kvkata, slow, usage_error
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


# -- the quiz ----------------------------------------------------------------------------------
def _quiz(kata, lines: list[str]) -> tuple[int, str]:
    """Run the quiz of ``kata`` on these input lines; (exit code, everything it printed)."""
    from grader.learner import sessions

    said, fed = [], iter(lines)

    def ask(prompt):
        said.append(prompt)
        return next(fed, None)

    code = sessions.quiz(kata, ask, said.append)
    return code, "\n".join(said)


def test_every_numeric_follow_up_states_its_value_in_its_answer():
    from grader.learner import sessions

    for kata in KATAS:
        for f in (f for f in kata.followups if f.value is not None):
            stated = [sessions.parse_number(m.group(0)) for m in sessions.NUMBER.finditer(f.answer)]
            for value in f.values:
                close = [n for n in stated if n is not None and abs(n - value) <= max(1e-9, f.tolerance * abs(value))]
                assert close, (kata.id, f.question, value, f.answer)


def test_the_crossover_question_gives_the_numbers_its_answer_uses():
    import math
    import re

    kata = manifest.get("04")
    f = next(f for f in kata.followups if "Llama-3-8B" in f.question)
    weights, per_token = (int(n.replace(",", "")) for n in re.findall(r"([\d,]+) bytes", f.question)[:2])
    wanted = math.ceil(weights / per_token)  # "the fewest cached tokens whose cache is at least the weights"
    assert f.value == wanted and f"{wanted:,}" in f.answer
    numeric = [g for g in kata.followups if g.value is not None]
    lines = [" ".join(["0"] * len(g.values)) for g in numeric]
    lines[numeric.index(f)] = f"{wanted:,}"
    code, out = _quiz(kata, lines)
    assert code == 1 and f"1 of {len(numeric)} right" in out and "try again" not in out, out


def test_a_question_asking_for_several_numbers_asks_for_and_checks_each():
    """Kata 04: "how many GiB of cache with 8 KV heads? And with 32 or 1?" wants three numbers, in order:
    the first alone is asked again, and one of them wrong is wrong."""
    kata = manifest.get("04")
    numeric = [f for f in kata.followups if f.value is not None]
    f = next(f for f in numeric if "And with 32 or 1?" in f.question)
    assert len(f.values) == 3, f.values
    fill = lambda chosen: [chosen if g is f else " ".join(f"{v:g}" for v in g.values) for g in numeric]  # noqa: E731
    code, out = _quiz(kata, fill(f"{f.values[0]:g} GiB"))  # one number of three: asked again, then no answer
    assert code == 1 and "3 numbers, in the order asked" in out and "try again" in out, out
    code, out = _quiz(kata, fill(", ".join(f"{v:g}" for v in (f.values[0], f.values[1] * 2, f.values[2]))))
    assert code == 1 and "not quite" in out and "try again" not in out, out
    code, out = _quiz(kata, fill(" GiB, ".join(f"{v:g}" for v in f.values) + " GiB"))
    assert code == 0 and f"{len(numeric)} of {len(numeric)} right" in out, out


def test_the_readmes_quiz_examples_answer_no_question():
    """The README shows how to write an answer; its examples must not give one away."""
    from grader.learner import sessions

    text = (ROOT / "README.md").read_text()
    section = text.split("## Interview practice", 1)[1].split("\n## ", 1)[0]
    examples = re.findall(r"`([^`]*\d[^`]*)`", section.split("A quiz", 1)[1])
    assert examples, section
    answers = {v for k in KATAS for f in k.followups for v in f.values}
    for example in examples:
        for m in sessions.NUMBER.finditer(example):
            number = sessions.parse_number(m.group(0))
            assert number is None or all(abs(number - a) > 1e-9 * max(1.0, abs(a)) for a in answers), example


def test_a_typo_is_asked_again_and_a_wrong_number_is_wrong():
    kata = manifest.get("01")
    numeric = [f for f in kata.followups if f.value is not None]
    first = numeric[0]
    code, out = _quiz(kata, ["3,6", "about 3, no 4", f"{first.value:g}"] + [f"{f.value:g}" for f in numeric[1:]])
    assert code == 0 and f"{len(numeric)} of {len(numeric)} right" in out, out
    assert out.count("try again") == 2
    code, out = _quiz(kata, [f"{first.value + 1:g}"] + [f"{f.value:g}" for f in numeric[1:]])
    assert code == 1 and "try again" not in out and f"{len(numeric) - 1} of {len(numeric)} right" in out
    code, out = _quiz(kata, ["x", "y", "z"] + [f"{f.value:g}" for f in numeric[1:]])  # three typos: no answer
    assert code == 1 and out.count("try again") == 2 and "no number in 'z'" in out


# -- the board and the notebooks ---------------------------------------------------------------
def _namespace(path: Path) -> dict:
    namespace = {"__name__": "notebook"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


def _board_line(kata_id: str) -> str:
    from grader import cli

    return next(line for line in cli.board().splitlines() if line.startswith(f"  {kata_id}  "))


def test_the_board_keeps_a_notebooks_results_apart_from_the_files(tmp_path, monkeypatch):
    from grader import grade
    from grader.learner import tools as learner

    monkeypatch.setenv("KVKATA_STATE", str(tmp_path / "state"))
    kata = manifest.get("04")
    grade.report_namespace(kata.id, _namespace(ROOT / kata.stub), device="cpu")  # an untouched notebook
    assert _board_line(kata.id).endswith("not started"), _board_line(kata.id)

    results = grade.grade(kata.id, "solution")
    learner.save_results(kata, results, "cpu")  # the file passes, as `kvkata check 04` records it
    total = len(results)
    wrong = _namespace(ROOT / kata.solution)
    wrong["kv_cache_bytes"] = lambda *args, **kwargs: 0
    notebook = grade.report_namespace(kata.id, wrong, device="cpu")
    passed = sum(r.passed for r in notebook)
    assert 0 < passed < total
    line = _board_line(kata.id)
    assert f"{total}/{total} checks ✓" in line and f"notebook: {passed}/{total}" in line, line
    from grader import cli

    assert "notebooks apart" in cli.board().splitlines()[0]  # the board says which results it shows


def test_a_candidate_checks_the_session_file_before_submitting(repo):
    kata = K01
    shutil.copyfile(repo / kata.solution, repo / kata.stub)  # katas/01 passes: a check of it proves nothing here
    started = kvkata(repo, "interview", "--kata", kata.id, "--minutes", "30")
    assert started.returncode == 0, started.stderr
    file = Path(next(l for l in started.stdout.splitlines() if l.startswith("edit this file:")).split(":", 1)[1].strip())
    brief = (file.parent / "README.md").read_text()
    assert f"pytest katas/{kata.id}" not in brief and "kvkata check" in brief and str(file) in brief, brief
    assert "kvkata check" in started.stdout

    for command in (("check",), ("check", kata.id)):  # the session file is still the untouched stub
        wrong = kvkata(repo, *command, "--device", "cpu")
        assert wrong.returncode == 1 and str(file) in wrong.stdout, wrong.stdout + wrong.stderr
        assert f"kata {kata.id}: 0/" in wrong.stdout and "left of 30:00" in wrong.stdout, wrong.stdout
    shutil.copyfile(repo / kata.solution, file)
    right = kvkata(repo, "check", "--device", "cpu")
    assert right.returncode == 0 and "checks pass — well done" in right.stdout, right.stdout + right.stderr
    assert "left of 30:00" in kvkata(repo).stdout  # the board shows the time left too
    assert (repo / ".kvkata" / "session.json").is_file(), "checking closed the session"

    submitted = kvkata(repo, "submit", "--device", "cpu")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert not (repo / ".kvkata" / "session.json").exists()
    history = json.loads(kvkata(repo, "history", "--json").stdout)
    assert history[-1]["passed"] == history[-1]["total"] and history[-1]["status"] == "submitted"


# -- help texts ----------------------------------------------------------------------------------
def _options_without_help(text: str) -> list[str]:
    """The options of an argparse help text that carry no explanation."""
    lines, missing = text.splitlines(), []
    for i, line in enumerate(lines):
        if re.match(r"  -", line):
            same_line = re.match(r"  \S.*?\s{2,}\S", line)
            next_line = i + 1 < len(lines) and re.match(r" {10,}\S", lines[i + 1])
            if not (same_line or next_line):
                missing.append(line.strip())
    return missing


def test_every_option_of_every_command_says_what_it_does():
    import argparse

    from grader import cli

    subcommands = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, sub in subcommands.items():
        silent = [a.option_strings or a.dest for a in sub._actions if a.help is None]
        assert not silent, f"kvkata {name}: {silent} have no help"
    for name in cli.DELEGATED:
        shown = kvkata(ROOT, name, "--help")
        assert shown.returncode == 0 and "``" not in shown.stdout, shown.stdout
        description = shown.stdout.split("\n\n")[1]  # after the usage lines
        assert description.rstrip().endswith("."), f"kvkata {name} --help: {description!r} is cut"
        assert not _options_without_help(shown.stdout), (name, _options_without_help(shown.stdout))


# -- hints follow the failure ------------------------------------------------------------------
def test_hint_opens_at_the_hint_of_the_task_the_latest_run_fails_first(tmp_path, monkeypatch):
    """Kata 05 failing only in attention_mask (task 3): the first `kvkata hint` is the hint about the
    mask, not the ladder's first (about update); the next one goes on from there."""
    from grader import checks, grade, state
    from grader.engine import Result
    from grader.learner import tools

    monkeypatch.setenv("KVKATA_STATE", str(tmp_path))
    kata = manifest.get("05")
    mask_check = next(c for c in checks.for_kata("05").all if c.uses == "StaticKVCache.attention_mask")
    results = [Result(c, "fail" if c is mask_check else "pass", "on input x=1\n  attention_mask(1) differs")
               for c in checks.for_kata("05").all]
    state.save_results(grade.record(kata, results, "stub", "cpu"))
    about = next(n for n, tasks in enumerate(kata.hint_tasks, start=1) if 3 in tasks)
    assert about > 1, "the mask's hint is not the ladder's first, or this test proves nothing"
    first = tools.hint(kata)
    assert f"hint {about} of {len(kata.hints)}" in first and "about task 3" in first, first
    assert kata.hints[about - 1] in first


def test_every_hint_names_the_tasks_it_speaks_to():
    for kata in KATAS:
        assert len(kata.hint_tasks) == len(kata.hints), kata.id
        assert all(1 <= n <= len(kata.tasks) for tasks in kata.hint_tasks for n in tasks), kata.id


# -- the board starts without torch, its columns aligned ----------------------------------------------
def test_the_board_is_built_without_importing_torch(tmp_path):
    code = ("import sys\nfrom grader import cli\ntext = cli.board()\n"
            "print('torch' in sys.modules, 'grader.grade' in sys.modules, len(text) > 0)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KVKATA_STATE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "False", "True"], out.stdout + out.stderr


def test_every_row_of_the_board_has_its_columns_in_line(tmp_path, monkeypatch):
    from grader import cli

    monkeypatch.setenv("KVKATA_STATE", str(tmp_path))
    rows = [line for line in cli.board().splitlines() if re.match(r"  \d\d  ", line)]
    assert len(rows) == len(KATAS)
    assert len({row.index(" min ") for row in rows}) == 1, "\n".join(rows)
