""""start with task N" names the task of the first result that differed: a check that calls several
functions points at the one whose result it found wrong, whatever function the check exercises first."""
from __future__ import annotations

import re

import pytest

from conftest import ROOT
from grader import grade, manifest
from grader.engine import Result, targets


def _bugged(kata, old: str, new: str) -> targets.Target:
    source = (ROOT / kata.solution).read_text()
    assert source.count(old) == 1, f"kata {kata.id}: the edit's anchor is not unique: {old!r}"
    return targets.from_source(source.replace(old, new), f"<kata {kata.id} bug>", "bug")


# (kata, checks of several functions, the edit, the function whose result differs first)
CASES = [
    ("05", ["mixed_run", "full_and_empty_edges", "caches_share_no_storage"],  # a mask that forgets causality
     "return cols <= rows  # (T, L)", "return (cols <= rows) | (cols < filled)", "StaticKVCache.attention_mask"),
    # a full decode block never cached
    ("10", ["shared_system_prompt", "eviction_order", "random_programs", "memory_pressure"],
     "            self._register(table[-1], hashes[-1])\n", "", "PrefixCache.append_token"),
    ("14", ["swap_programs_match"],  # swap_in keeps the host blocks
     "    del pool._swapped[seq_id]\n    pool._free.extend(reversed(host))", "    del pool._swapped[seq_id]", "swap_in"),
    ("18", ["every_argument_rejects_bad_values"],  # a check of every function; decode_crossover_batch takes any peak
     '    peak, bw = _rate("peak_flops", peak_flops), _rate("bandwidth", bandwidth)\n    one',
     "    peak, bw = peak_flops, bandwidth\n    one", "decode_crossover_batch"),
    ("16", ["disaggregated_equals_one_process"],  # the prefill worker miscounts its messages
     '"messages": len(messages) + 2}', '"messages": len(messages) + 1}', "prefill_worker"),
]


@pytest.mark.parametrize("kata_id, check_ids, old, new, differed", CASES, ids=[c[0] for c in CASES])
def test_the_pointer_follows_the_function_whose_result_differed(kata_id, check_ids, old, new, differed):
    kata = manifest.get(kata_id)
    results = grade.grade(kata.id, _bugged(kata, old, new), diagnose=False, only=check_ids)
    for result in results:
        assert result.status == "fail", (result.check.id, result.status, result.message[:300])
        line = grade.summary(kata, [result])
        assert f"start with task {kata.task_number(differed)}, {differed}" in line, (result.check.id, line,
                                                                                    result.message[:600])


def test_a_decode_result_that_differs_points_at_decode_worker():
    """The other direction of the kata-16 case above: the decode worker's tokens differed, so task 3."""
    kata = manifest.get("16")
    source = (ROOT / kata.solution).read_text()
    first = re.search(r"(?m)^def decode_worker.*?\n    return (\w+)", source, re.S)
    assert first, "kata 16's decode_worker returns a name"
    target = _bugged(kata, first.group(0), first.group(0) + "[:-1] if len(" + first.group(1) + ") > 1 else "
                     + first.group(1))
    [result] = grade.grade(kata.id, target, diagnose=False, only=["disaggregated_equals_one_process"])
    assert result.status == "fail", result.message
    assert "start with task 3, decode_worker" in grade.summary(kata, [result]), result.message


def test_a_function_a_stub_leaves_unimplemented_is_the_one_pointed_at():
    """Kata 04 with its task-1 functions written and the rest still stubs: the checks of every function
    (``exact_past_2_53``) stop at kv_cache_bytes_from_config, task 2, and so does the pointer."""
    kata = manifest.get("04")
    parts = lambda text: dict(re.findall(r"(?ms)^def (\w+)(.*?)(?=^def |\Z)", text))  # noqa: E731
    solution, stub = parts((ROOT / kata.solution).read_text()), parts((ROOT / kata.stub).read_text())
    head = re.split(r"(?m)^def ", (ROOT / kata.solution).read_text(), maxsplit=1)[0]
    written = {"kv_bytes_per_token", "kv_cache_bytes"}
    source = head + "".join(f"def {name}{body if name in written or name not in stub else stub[name]}"
                            for name, body in solution.items())
    results = grade.grade(kata.id, targets.from_source(source, "<task 1 only>", "task 1 only"), diagnose=False)
    assert {r.status for r in results} == {"pass", "not-implemented"}
    assert all(kata.task_number(r.check.uses) == 1 for r in results if r.passed)
    assert "start with task 2, kv_cache_bytes_from_config" in grade.summary(kata, results)


def test_a_message_naming_a_method_at_its_start_points_at_that_method():
    """The rule on messages alone (what a cohort's or a handout's result carries): the label the message
    begins with, the step a program marks, a crash's outermost function of the learner."""
    kata, check = manifest.get("05"), next(c for c in grade.checks_for("05") if c.uses == "StaticKVCache")
    cases = {
        "on input x=1\n  after op 3 of 3, update(layer=0) with 1 new token(s):\n  attention_mask(2, layer=0) differs":
            "StaticKVCache.attention_mask",
        "on input x=1\n  after op 2 of 2, update(layer=0) with 2 new token(s): but your update raised ValueError":
            "StaticKVCache.update",
        "on input x=1\n  the program:\n     0  update(0, 1)\n  →  1  reset()\n  seq_len of every layer: got [1]":
            "StaticKVCache.reset",
        'on input x=1\n  your code raised ValueError: no\n  File "f.py", line 3, in seq_len\n    update(0)':
            "StaticKVCache.seq_len",
    }
    for message, differed in cases.items():
        line = grade.summary(kata, [Result(check, "fail", message)])
        assert f"start with task {kata.task_number(differed)}, {differed}" in line, (message, line)
    from grader.engine import hangs, report

    timed_out = report.TIMED_OUT.format(seconds=10) + hangs.HUNG_IN.format(name="StaticKVCache.reset")
    for status, message in (("timeout", timed_out), ("not-run", hangs.NOT_RUN.format(name="StaticKVCache.reset", check="x"))):
        line = grade.summary(kata, [Result(check, status, message)])
        assert "start with task 4, StaticKVCache.reset" in line, (status, line)
