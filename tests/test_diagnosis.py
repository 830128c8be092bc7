"""A diagnosis is never wrong: a known mistake is named only when it is the learner's.

Grading a mistake of the catalogue names that mistake and no other (tests/test_katas.py grades each
mistake once and holds both: it is caught, and named alone); grading a bug the catalogue does not
know (tests/conftest.py ``UNKNOWN``: the reference with one edit) fails a check and names nothing. A
shrunk input can make two different bugs give the same output; these tests hold the grader to
telling them apart on further inputs before it names one.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import KATAS, UNKNOWN, UNKNOWN_CASES, built, first_of_each_kata_fast, slow, unknown_bug
from grader import checks, grade, manifest, mistakes
from grader.classroom.cohort import judge
from grader.classroom.cohort.record import RecordingCtx
from grader.engine import plain, run_check, targets


def _failing(kata_id: str, target) -> list:
    return [r for r in grade.grade(kata_id, target) if not r.passed]


def test_every_kata_has_unknown_bugs():
    """Katas of levels 1-3 so far; the level-4 catalogues are held by tests/test_katas.py (each mistake named alone)."""
    assert sorted(UNKNOWN) == sorted(k.id for k in KATAS if mistakes.catalogue(k.id) and k.level <= 3)
    assert all(len(bugs) >= 2 for bugs in UNKNOWN.values())
    for kata_id, bugs in UNKNOWN.items():  # not a catalogue mistake under another name
        known = {m.edits for m in mistakes.catalogue(kata_id)}
        assert not known & set(bugs.values()), kata_id


@pytest.mark.parametrize("kata_id,name",
                         first_of_each_kata_fast(UNKNOWN_CASES, [f"{k}-{n}" for k, n in UNKNOWN_CASES]))
def test_an_unknown_bug_is_caught_and_never_given_a_known_name(kata_id, name):
    failed = _failing(kata_id, unknown_bug(kata_id, name))
    assert failed, f"no check catches {name!r}"
    named = [(r.check.id, d) for r in failed for d in r.diagnoses]
    assert not named, f"{name!r} is none of the known mistakes, yet was named: {named}"


def _classroom(kata_id: str, target, tmp_path) -> list:
    """Grade as ``kvkata grade`` does: record the target's run check by check, save and load the
    records as plain data, then judge each check from them (grader.classroom.cohort.judge)."""
    kata, settings = manifest.get(kata_id), SimpleNamespace(device="cpu", seed=0)
    reference, records = targets.reference(kata), {}
    for check in checks.for_kata(kata_id).all:
        ctx = RecordingCtx(target, reference, "cpu")
        result = run_check(check, ctx, (), 60)
        records[check.id] = {"check": check.id, "status": result.status, "message": result.message,
                             "executions": ctx.executions}
    plain.save(tmp_path / "records.pt", records)
    records = plain.load(tmp_path / "records.pt")
    return [judge.judge_check(c, records[c.id], settings, kata, records) for c in checks.for_kata(kata_id).all]


@slow
@pytest.mark.parametrize("kata_id", [k.id for k in KATAS])
def test_classroom_grading_passes_the_reference(kata_id, tmp_path):
    """Record and replay never fail a correct file (kata 02's device check once did)."""
    failed = [(r.check.id, r.message) for r in _classroom(kata_id, targets.reference(manifest.get(kata_id)), tmp_path)
              if not r.passed]
    assert not failed


CLASSROOM = [("03", "tiled repeat instead of interleave"), ("03", "query heads grouped as (n_rep, n_kv)"),
             ("06", "free leaks the blocks"), ("03", "scores divided by head_dim")]


@slow
@pytest.mark.parametrize("kata_id,name", CLASSROOM, ids=[f"{k}-{n}" for k, n in CLASSROOM])
def test_classroom_grading_gives_the_same_diagnoses(kata_id, name, tmp_path):
    target = built(kata_id).get(name) or unknown_bug(kata_id, name)
    direct = grade.grade(kata_id, target)
    judged = _classroom(kata_id, target, tmp_path)
    rows = [[(r.check.id, r.status, r.diagnoses) for r in results] for results in (judged, direct)]
    assert rows[0] == rows[1]


def test_a_mistake_in_the_first_task_is_named_while_later_tasks_are_stubs():
    """Inputs of checks the learner has not reached yet (stubs) tell nothing, and never hide a name."""
    kata = manifest.get("03")
    tiled = next(m for m in mistakes.catalogue("03") if m.name == "tiled repeat instead of interleave")
    body = '    raise NotImplementedError("kata 03: repeat_kv — see README, task 1")\n'
    solved = ("    if not isinstance(x, torch.Tensor) or x.dim() != 4:\n"  # the README's validation: one bug only
              "        raise ValueError(f'x: expected a 4-D tensor, got {x!r}')\n"
              "    if isinstance(n_rep, bool) or not isinstance(n_rep, int) or n_rep < 1:\n"
              "        raise ValueError(f'n_rep: expected an int of at least 1, got {n_rep!r}')\n"
              "    B, H, S, D = x.shape\n"
              "    return x[:, None].expand(B, n_rep, H, S, D).reshape(B, H * n_rep, S, D)\n")
    stub = (manifest.REPO_ROOT / kata.stub).read_text(encoding="utf-8")
    assert stub.count(body) == 1 and tiled.edits[0][1] in solved
    target = targets.from_source(stub.replace(body, solved), "<task 1 tiled>", "task 1 tiled")
    results = {r.check.id: r for r in grade.grade("03", target)}
    assert results["repeat_kv_interleaves"].diagnoses == [tiled.name], results["repeat_kv_interleaves"].message


def _two_bugs(kata_id: str, first: str, second: str) -> targets.Target:
    """The reference of ``kata_id`` with the edits of two known mistakes."""
    by_name = {m.name: m for m in mistakes.catalogue(kata_id)}
    reference = (manifest.REPO_ROOT / manifest.get(kata_id).solution).read_text(encoding="utf-8")
    source = by_name[second].apply(by_name[first].apply(reference))
    return targets.from_source(source, f"<{first} and {second}>", f"{first} and {second}")


def test_a_name_that_contradicts_another_checks_verdict_is_not_given():
    """SPEC: a known mistake is named only when it agrees with the learner's file on every check both were
    graded on. Unseeded draws plus new tokens one position too far: the sampling check's observation ("two
    runs differ") matches "generator ignored" alone, but that mistake passes the greedy checks this file
    fails, and the positions mistake passes the sampling check: neither explains the file, neither is named."""
    target = _two_bugs("08", "generator ignored", "new tokens placed one position too far")
    results = grade.grade("08", target)
    assert [r.check.id for r in results if r.check.id == "greedy_matches_each_prompt_alone" and not r.passed]
    assert not any(r.diagnoses for r in results), [(r.check.id, r.diagnoses) for r in results if r.diagnoses]
    sampling = next(r for r in results if r.check.id == "sampling_is_reproducible")
    assert sampling.status == "fail" and "known mistake" not in sampling.message, sampling.message
    # Named check by check, before the verdicts were compared: so the rule above is what withheld the name.
    ctx, known = grade.context(manifest.get("08"), target, grade.pick_device("cpu"))
    check = next(c for c in checks.for_kata("08").all if c.id == "sampling_is_reproducible")
    assert run_check(check, ctx, known, 60.0).diagnoses == ["generator ignored"]


def test_a_diagnosis_is_explained_once_under_the_first_check_that_names_it():
    """Kata 03's tiled repeat fails five checks that all name it: the explanation and the hint are printed
    once, under the first; each later check names the mistake in one line and says where it is explained."""
    kata, tiled = manifest.get("03"), mistakes.catalogue("03")[0]
    target = targets.from_source(tiled.apply((manifest.REPO_ROOT / kata.solution).read_text()), "<tiled>", "tiled")
    named = [r for r in grade.grade(kata.id, target) if tiled.name in r.diagnoses]
    assert len(named) >= 2, [r.check.id for r in named]
    text = "\n".join(r.message for r in named)
    assert text.count(tiled.hint) == 1 and tiled.hint in named[0].message
    for r in named[1:]:
        assert tiled.name in r.message and named[0].check.title in r.message and tiled.hint not in r.message


def test_watch_says_which_check_a_late_diagnosis_belongs_to():
    """The watcher shows the first failure at once and its diagnosis when every check has run: when
    other failures were shown between, the diagnosis is headed by its own check's title."""
    from grader.learner import watch

    kata = manifest.get("03")
    first, second = checks.for_kata("03").all[:2]
    said: list[str] = []
    verdict = watch.Verdict(kata, None, said.append)
    event = {"event": "result", "status": "fail", "diagnoses": [], "seconds": 0.1}
    verdict.show({**event, "check": first.id, "message": "on input x=1\n  wrong"})
    verdict.show({**event, "check": second.id, "message": "on input x=2\n  wrong too"})
    verdict.show({**event, "event": "explained", "check": first.id, "diagnoses": ["m"],
                  "message": "on input x=1\n  wrong\n  this looks like a known mistake: m. why\n  hint: h"})
    lines = "\n".join(said).splitlines()
    hint = next(i for i, line in enumerate(lines) if "hint: h" in line)
    header = max(i for i, line in enumerate(lines[:hint]) if "✗" in line)
    assert first.title in lines[header], lines
