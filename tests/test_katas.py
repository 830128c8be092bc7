"""The repo proves its own invariants: every solution passes, every stub fails as "not
implemented", every known mistake is caught and named, and the manifest matches the folders."""
from __future__ import annotations

import re

import pytest
import torch

from conftest import IDS, KATAS, MISTAKES, ROOT, built, first_of_each_kata_fast
from grader import checks, grade, manifest, mistakes
from grader.checks import conformance
from grader.engine import Result, targets

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_manifest_and_folders_agree_both_ways():
    on_disk = sorted(p.name for p in (ROOT / "katas").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert on_disk == IDS
    for kata in KATAS:
        assert (ROOT / kata.stub).is_file(), kata.stub
        assert (ROOT / kata.solution).is_file(), kata.solution
        assert (ROOT / kata.readme).is_file(), kata.readme
        assert sorted(p.name for p in (ROOT / "katas" / kata.id).iterdir() if p.suffix in (".py", ".md")) == sorted(
            ["README.md", kata.file]
        )
        assert 2 <= len(kata.hints) <= 3 and all("TODO" not in h for h in kata.hints), kata.id
        assert kata.followups, f"kata {kata.id} has no follow-up questions"
        assert checks.for_kata(kata.id).all, f"kata {kata.id} has no checks"
        assert len(mistakes.catalogue(kata.id)) >= 4, f"kata {kata.id} has fewer than 4 known mistakes"


def test_every_level_is_named_in_the_manifest_and_a_handouts_manifest_keeps_the_names(tmp_path):
    from grader.classroom import handouts
    assert list(manifest.levels()) == list(range(1, max(manifest.levels()) + 1))
    assert {k.level for k in KATAS} == set(manifest.levels()), "a level with no kata, or a kata with no level"
    (tmp_path / "m.toml").write_text(handouts.manifest_text({"01", "03"}), encoding="utf-8")
    assert list(manifest.load(tmp_path / "m.toml")) == ["01", "03"] and manifest.levels(tmp_path / "m.toml") == manifest.levels()
    (tmp_path / "bad.toml").write_text(handouts.manifest_text({"01"}).replace('1 = "foundations"\n', ""), encoding="utf-8")
    with pytest.raises(ValueError, match="level 1 is not in \\[levels\\]"):
        manifest.load(tmp_path / "bad.toml")


@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_stub_and_solution_expose_the_same_api(kata):
    stub, solution = conformance.public_api(ROOT / kata.stub), conformance.public_api(ROOT / kata.solution)
    assert stub == solution
    source = (ROOT / kata.stub).read_text()
    for name in kata.api_names:  # a private helper a task asks for is defined in the stub too
        found = name in stub or (name.startswith("_") and re.search(rf"(?m)^(class|def) {name}\b", source))
        assert found, f"task {name} of kata {kata.id} is not in the stub"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_solution_passes_every_check(kata, device):
    results = grade.grade(kata.id, "solution", device=device, diagnose=False)
    failed = [f"{r.check.id}: {r.status}: {r.message}" for r in results if not r.passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_untouched_stub_fails_every_check_as_not_implemented(kata):
    results = grade.grade(kata.id, "stub", diagnose=False)
    assert results and all(r.status == "not-implemented" for r in results), [
        (r.check.id, r.status, r.message[:200]) for r in results if r.status != "not-implemented"
    ]
    assert all(len(r.message.splitlines()) == 1 for r in results)


@pytest.mark.parametrize("kata_id,mistake",
                         first_of_each_kata_fast(MISTAKES, [f"{k}-{m.name}" for k, m in MISTAKES]))
def test_known_mistake_is_caught_and_named_alone(kata_id, mistake, grade_in_turn):
    """Graded once: some check fails it (a failure: not a timeout, a stub or a grader error), a failing check
    names it, and none names another mistake (a diagnosis is never wrong, tests/test_diagnosis.py)."""
    failed = [r for r in grade_in_turn(kata_id, built(kata_id)[mistake.name]) if not r.passed]
    assert failed, f"no check catches {mistake.name!r}"
    assert all(r.status == "fail" for r in failed), [(r.check.id, r.status) for r in failed]
    assert any(mistake.name in r.diagnoses for r in failed), [(r.check.id, r.status, r.message, r.diagnoses)
                                                              for r in failed]
    wrong = [(r.check.id, name) for r in failed for name in r.diagnoses if name != mistake.name]
    assert not wrong, f"grading {mistake.name!r} also named: {wrong}"


@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_mistake_names_are_unique(kata):
    names = [m.name for m in mistakes.catalogue(kata.id)]
    assert len(names) == len(set(names))


# -- "start with task N": the README's own numbering --------------------------------------------
def _readme_tasks(kata) -> list[str]:
    """The numbered items of the README's Tasks section, as text."""
    text = (ROOT / kata.readme).read_text()
    section = re.search(r"(?ms)^## Tasks\s*$(.*?)(?=^## |\Z)", text).group(1)
    return [m.group(1) for m in re.finditer(r"(?ms)^\d+\. (.*?)(?=^\d+\. |\Z)", section)]


def _defined(item: str) -> set[str]:
    """The names a task asks for: a backticked call signature anywhere (`name(...`), or the
    backticked name the item starts with; ``A.b`` gives ``A.b``, ``b`` and ``A``."""
    spans = re.findall(r"`([A-Za-z_][\w.]*)\(", item)
    lead = re.match(r"`([A-Za-z_][\w.]*)`?", item)
    names = set()
    for span in spans + ([lead.group(1)] if lead else []):
        names |= {span, span.split(".")[-1], span.split(".")[0]}
    return names


def _readme_number(kata, uses: str) -> int:
    items = [_defined(item) for item in _readme_tasks(kata)]
    for wanted in ((uses, uses.split(".")[-1]) if "." in uses else (uses,), (uses.split(".")[0],)):
        for number, names in enumerate(items, start=1):
            if names & set(wanted):
                return number
    raise AssertionError(f"kata {kata.id}: no task of the README asks for {uses}")


@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_start_with_task_names_the_readmes_own_task(kata):
    assert len(kata.tasks) == len(_readme_tasks(kata)), "one manifest task per numbered README task"
    kata_checks = checks.for_kata(kata.id).all
    for check in kata_checks:
        wanted = _readme_number(kata, check.uses)
        results = [Result(c, "fail" if c is check else "pass") for c in kata_checks]
        line = grade.summary(kata, results)
        assert f"start with task {wanted}, {check.uses}" in line, (check.id, line)


@pytest.mark.parametrize("kata", [k for k in KATAS if len({_readme_number(k, c.uses) for c in checks.for_kata(k.id).all}) > 1],
                         ids=lambda k: k.id)
def test_start_with_task_never_points_past_an_earlier_failing_task(kata):
    kata_checks = checks.for_kata(kata.id).all
    latest = max(kata_checks, key=lambda c: _readme_number(kata, c.uses))
    earliest = min(kata_checks, key=lambda c: _readme_number(kata, c.uses))
    results = [Result(c, "fail") for c in [latest, earliest]]  # the later task's check fails first
    line = grade.summary(kata, results)
    assert f"start with task {_readme_number(kata, earliest.uses)}, {earliest.uses}" in line, line


def test_start_with_task_points_at_the_function_whose_result_differed():
    """A check of several functions (kata 04's exact_past_2_53 calls all seven) points at the one that
    differed: a max_batch_size that rounds up fails three checks, all about that function."""
    kata = manifest.get("04")
    source = (ROOT / kata.solution).read_text()
    assert source.count("    return free // per_sequence") == 1
    target = targets.from_source(source.replace("    return free // per_sequence", "    return -(-free // per_sequence)"),
                                 "<max_batch_size rounds up>", "max_batch_size rounds up")
    results = grade.grade(kata.id, target, diagnose=False)
    failing = {r.check.id for r in results if not r.passed}
    assert "exact_past_2_53" in failing, failing
    line = grade.summary(kata, results)
    assert f"start with task {_readme_number(kata, 'max_batch_size')}, max_batch_size" in line, line


def _learner_strings(path):
    """Every string a check or a known mistake can show the learner: its literals, f-strings
    included, but not its docstrings and comments."""
    import ast

    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_checks_speak_of_what_the_learner_reads():
    """A learner reads the kata README, never the project's SPEC: no title or message cites it."""
    for kata in KATAS:
        assert not [c.title for c in checks.for_kata(kata.id).all if "SPEC" in c.title], kata.id
    learner_facing = ["checks/k*.py", "checks/support/*.py", "mistakes/k*.py"]  # not conformance.py: the promise tables' reader
    for path in sorted(p for pattern in learner_facing for p in (ROOT / "grader").glob(pattern)):
        cited = [s for s in _learner_strings(path) if "SPEC" in s]
        assert not cited, f"{path.name}: {cited}"


def test_a_growth_failure_names_the_chunk_and_its_length_plainly():
    built = dict((m.name, t) for m, t in mistakes.load("01"))
    results = grade.grade("01", built["concatenating on the head axis"])
    message = next(r.message for r in results if r.check.id == "append_kv_grows")
    assert re.search(r"after appending chunk \d+ \(\d+ tokens?\)", message), message
    assert "token(s)" not in message and not re.search(r"chunk \d+ of \d+", message), message


@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_the_stubs_task_numbers_are_the_readmes(kata):
    said = re.findall(r'"kata \d+: ([\w.]+) — see README, task (\d+)"', (ROOT / kata.stub).read_text())
    assert said, "the stub names no task"
    for name, number in said:
        assert int(number) == _readme_number(kata, name), (name, number)
