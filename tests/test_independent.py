"""Correct implementations written from a kata's README alone, in choices the README leaves open,
pass every check: the grader demands only what the README and the SPEC say.

Each file of tests/independent/ is named ``kNN_<choice>.py`` and graded as
``pytest katas/NN --kata-target=FILE`` grades it (``grade.grade``, the engine behind the plugin).
"""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

from grader import checks, grade, manifest
from grader.engine import targets

HERE = Path(__file__).parent / "independent"
FILES = sorted(HERE.glob("k[0-9][0-9]_*.py"))
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_there_are_independent_implementations_of_every_kata_the_issue_names():
    katas = {f.name[1:3] for f in FILES}
    assert {"06", "13"} <= katas, sorted(katas)
    assert katas <= set(manifest.load()), sorted(katas - set(manifest.load()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_independent_implementation_passes_every_check(path, device):
    results = grade.grade(path.name[1:3], str(path), device=device, diagnose=False)
    assert results
    failed = [f"{r.check.id}: {r.status}: {r.message}" for r in results if not r.passed]
    assert not failed, "\n".join(failed)


# The relaxed checks still fail what the README forbids. Each kata's ``kNN_forbidden.toml`` lists
# ``[[edit]]`` entries (an edit of an independent file above: file, what, check, and its
# ``[[edit.replace]]`` old/new pairs) and ``[[wrong]]`` entries (a whole wrong file of
# tests/independent/wrong/: file, what, check); each must fail the check it names.
def _forbidden():
    found = []
    for table in sorted(HERE.glob("k[0-9][0-9]_forbidden.toml")):
        kata = table.name[1:3]
        data = tomllib.loads(table.read_text(encoding="utf-8"))
        for entry in data.get("edit", []):
            source = (HERE / entry["file"]).read_text(encoding="utf-8")
            for pair in entry["replace"]:
                old, new = pair["old"], pair["new"]
                assert source.count(old) == 1, f"{table.name}: {old!r} occurs {source.count(old)} times in {entry['file']}"
                source = source.replace(old, new)
            found.append((kata, entry["what"], source, entry["check"]))
        for entry in data.get("wrong", []):
            source = (HERE / "wrong" / entry["file"]).read_text(encoding="utf-8")
            found.append((kata, entry["what"], source, entry["check"]))
    return found


WRONG = _forbidden()


def test_every_forbidden_edit_names_a_check_of_its_kata():
    for kata_id, what, _, check in WRONG:
        assert check in {c.id for c in checks.for_kata(kata_id).all}, (kata_id, what, check)


@pytest.mark.parametrize("kata_id,what,source,check", WRONG, ids=[f"{k}-{w}" for k, w, _, _ in WRONG])
def test_an_edit_the_readme_forbids_fails(kata_id, what, source, check):
    target = targets.from_source(source, f"<{what}>", what)
    (result,) = grade.grade(kata_id, target, diagnose=False, only=[check])  # the check the README's rule names
    assert result.check.id == check and result.status == "fail", (result.status, result.message)


def test_grading_only_some_checks_runs_those_in_order_and_names_an_unknown_one():
    ids = [c.id for c in checks.for_kata("01").all]
    results = grade.grade("01", "solution", diagnose=False, only=[ids[2], ids[0]])
    assert [r.check.id for r in results] == [ids[0], ids[2]] and all(r.passed for r in results)
    with pytest.raises(ValueError, match="only: kata 01 has no check 'nope'"):
        grade.grade("01", "solution", only=["nope"])
