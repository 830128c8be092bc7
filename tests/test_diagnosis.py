"""A diagnosis is never wrong: a known mistake is named only when it is the learner's.

Grading a mistake of the catalogue names that mistake and no other; grading a bug the catalogue
does not know (each below: the reference with one edit) fails a check and names nothing. A
shrunk input can make two different bugs give the same output; these tests hold the grader to
telling them apart on further inputs before it names one.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from grader import checks, grade, manifest, mistakes
from grader.engine import targets
from grader.classroom.cohort import judge
from grader.engine import plain, run_check
from grader.mistakes import Mistake
from grader.classroom.cohort.record import RecordingCtx

KATAS = list(manifest.load().values())
MISTAKES = [(k.id, m) for k in KATAS for m in mistakes.catalogue(k.id)]

_SCALE = ("/ math.sqrt(self.head_dim)", "/ self.head_dim")  # scores divided by D instead of sqrt(D)

# Bugs no catalogue holds: kata -> name -> edits of the reference (each text occurs once).
UNKNOWN = {
    "01": {
        "scores divided by head_dim": (_SCALE,),
        "heads merged without the transpose": (
            ("out = out.transpose(1, 2).reshape(B, T, self.d_model)", "out = out.reshape(B, T, self.d_model)"),),
    },
    "02": {
        "positions start one past the cache": (
            ("torch.arange(past_len, past_len + new_len, device=device)",
             "torch.arange(past_len + 1, past_len + new_len + 1, device=device)"),),
        "scores divided by head_dim": (_SCALE,),
        "heads merged without the transpose": (
            ("out = out.transpose(1, 2).reshape(B, T, self.d_model)", "out = out.reshape(B, T, self.d_model)"),),
    },
    "03": {
        "scores divided by head_dim": (_SCALE,),
        "heads merged without the transpose": (
            ("out = out.transpose(1, 2).reshape(B, T, self.n_q_heads * self.head_dim)",
             "out = out.reshape(B, T, self.n_q_heads * self.head_dim)"),),
    },
    "04": {
        "cache bytes counted twice": (
            ('return _count("batch", batch) * _count("seq_len", seq_len) * per_token',
             'return 2 * _count("batch", batch) * _count("seq_len", seq_len) * per_token'),),
        "a negative batch when the weights do not fit": (
            ("    if free < 0:  # not even the weights fit\n        return 0\n", ""),),
    },
    "05": {
        "values written with the keys": (("V[:, :, start:end] = v_new", "V[:, :, start:end] = k_new"),),
        "keys stored doubled": (("K[:, :, start:end] = k_new", "K[:, :, start:end] = 2 * k_new"),),
    },
    "06": {
        "a chunk's values written with its keys": (
            ("pages_v[blocks, :, offsets] = v.transpose(0, 1)", "pages_v[blocks, :, offsets] = k.transpose(0, 1)"),),
        "a decode step's slot one further on": (
            ("slot = table[length // P] * P + length % P", "slot = table[length // P] * P + (length + 1) % P"),),
    },
    "07": {
        "the cache returns its keys as values": (
            ("return apply_rope(K, slots, self.rope_base), V", "return apply_rope(K, slots, self.rope_base), K"),),
        "heads merged without the transpose": (
            ("self.wo(out.transpose(1, 2).reshape(B, T, self.d_model))", "self.wo(out.reshape(B, T, self.d_model))"),),
        "scores divided by head_dim": (_SCALE,),
    },
    "08": {
        "greedy picks the least likely token": (("return logits.argmax(-1)", "return logits.argmin(-1)"),),
        "prompt positions start at 1": (
            ("positions = (slots[None, :P] - first[:, None]).clamp(min=0)",
             "positions = (slots[None, :P] - first[:, None] + 1).clamp(min=0)"),),
    },
}
UNKNOWN_CASES = [(kata, name) for kata, bugs in UNKNOWN.items() for name in bugs]


def _failing(kata_id: str, target) -> list:
    return [r for r in grade.grade(kata_id, target) if not r.passed]


@pytest.mark.parametrize("kata_id,mistake", MISTAKES, ids=[f"{k}-{m.name}" for k, m in MISTAKES])
def test_a_known_mistake_is_named_and_nothing_else(kata_id, mistake):
    built = dict((m.name, t) for m, t in mistakes.load(kata_id))
    failed = _failing(kata_id, built[mistake.name])
    assert any(mistake.name in r.diagnoses for r in failed), [(r.check.id, r.status, r.diagnoses) for r in failed]
    wrong = [(r.check.id, name) for r in failed for name in r.diagnoses if name != mistake.name]
    assert not wrong, f"grading {mistake.name!r} also named: {wrong}"


def test_every_kata_has_unknown_bugs():
    """Katas of levels 1-3 so far; the level-4 catalogues are held by the test above (each mistake named alone)."""
    assert sorted(UNKNOWN) == sorted(k.id for k in KATAS if mistakes.catalogue(k.id) and k.level <= 3)
    assert all(len(bugs) >= 2 for bugs in UNKNOWN.values())
    for kata_id, bugs in UNKNOWN.items():  # not a catalogue mistake under another name
        known = {m.edits for m in mistakes.catalogue(kata_id)}
        assert not known & set(bugs.values()), kata_id


@pytest.mark.parametrize("kata_id,name", UNKNOWN_CASES, ids=[f"{k}-{n}" for k, n in UNKNOWN_CASES])
def test_an_unknown_bug_is_caught_and_never_given_a_known_name(kata_id, name):
    kata = manifest.get(kata_id)
    reference = (manifest.REPO_ROOT / kata.solution).read_text(encoding="utf-8")
    source = Mistake(name, "", "", UNKNOWN[kata_id][name]).apply(reference)
    target = targets.from_source(source, f"<unknown bug {kata_id}: {name}>", f"unknown bug {name!r}")
    failed = _failing(kata_id, target)
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


@pytest.mark.parametrize("kata_id", [k.id for k in KATAS])
def test_classroom_grading_passes_the_reference(kata_id, tmp_path):
    """Record and replay never fail a correct file (kata 02's device check once did)."""
    failed = [(r.check.id, r.message) for r in _classroom(kata_id, targets.reference(manifest.get(kata_id)), tmp_path)
              if not r.passed]
    assert not failed


CLASSROOM = [("03", "tiled repeat instead of interleave"), ("03", "query heads grouped as (n_rep, n_kv)"),
             ("06", "free leaks the blocks"), ("03", "scores divided by head_dim")]


@pytest.mark.parametrize("kata_id,name", CLASSROOM, ids=[f"{k}-{n}" for k, n in CLASSROOM])
def test_classroom_grading_gives_the_same_diagnoses(kata_id, name, tmp_path):
    built = dict((m.name, t) for m, t in mistakes.load(kata_id))
    if name in built:
        target = built[name]
    else:
        reference = (manifest.REPO_ROOT / manifest.get(kata_id).solution).read_text(encoding="utf-8")
        target = targets.from_source(Mistake(name, "", "", UNKNOWN[kata_id][name]).apply(reference),
                                     f"<unknown bug {kata_id}: {name}>", name)
    direct = grade.grade(kata_id, target)
    judged = _classroom(kata_id, target, tmp_path)
    rows = [[(r.check.id, r.status, r.diagnoses) for r in results] for results in (judged, direct)]
    assert rows[0] == rows[1]


def test_a_mistake_in_the_first_task_is_named_while_later_tasks_are_stubs():
    """Inputs of checks the learner has not reached yet (stubs) tell nothing, and never hide a name."""
    kata = manifest.get("03")
    tiled = next(m for m in mistakes.catalogue("03") if m.name == "tiled repeat instead of interleave")
    body = '    raise NotImplementedError("kata 03: repeat_kv — see README, task 1")\n'
    solved = ("    B, H, S, D = x.shape\n"
              "    return x[:, None].expand(B, n_rep, H, S, D).reshape(B, H * n_rep, S, D)\n")
    stub = (manifest.REPO_ROOT / kata.stub).read_text(encoding="utf-8")
    assert stub.count(body) == 1 and tiled.edits[0][1] in solved
    target = targets.from_source(stub.replace(body, solved), "<task 1 tiled>", "task 1 tiled")
    results = {r.check.id: r for r in grade.grade("03", target)}
    assert results["repeat_kv_interleaves"].diagnoses == [tiled.name], results["repeat_kv_interleaves"].message
