"""The repo proves its own invariants: every solution passes, every stub fails as "not
implemented", every known mistake is caught and named, and the manifest matches the folders."""
from __future__ import annotations

import pytest
import torch

from conftest import IDS, KATAS, MISTAKES, ROOT, built, first_of_each_kata_fast
from grader import checks, conformance, grade, mistakes

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


@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_stub_and_solution_expose_the_same_api(kata):
    stub, solution = conformance.public_api(ROOT / kata.stub), conformance.public_api(ROOT / kata.solution)
    assert stub == solution
    for task in kata.tasks:
        assert task in stub, f"task {task} of kata {kata.id} is not in the stub"


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
