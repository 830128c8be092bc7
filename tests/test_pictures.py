"""A failure picture shows the difference it is about, or is left out: two identical pictures side by side
would point the learner away from what differs."""
from __future__ import annotations

from conftest import ROOT
from grader import grade, manifest
from grader.engine import targets


def _kata10(old: str, new: str) -> list:
    kata = manifest.get("10")
    source = (ROOT / kata.solution).read_text()
    assert source.count(old) == 1
    target = targets.from_source(source.replace(old, new), "<kata 10 bug>", "bug")
    return [r for r in grade.grade(kata.id, target, diagnose=False) if r.status == "fail"]


def test_kata_10_draws_no_block_tables_when_only_the_reused_count_differs():
    failing = _kata10("        return len(hits) * P\n", "        return 0\n")
    reused = [r for r in failing if "reused tokens; expected" in r.message]
    assert reused, [r.message[:300] for r in failing]
    for r in reused:
        assert "your block tables (same letter" not in r.message, r.message


def test_kata_10_draws_both_block_tables_when_the_sharing_differs():
    failing = _kata10("= hits + fresh, tokens", "= fresh + hits, tokens")  # the reused blocks at the end
    drawn = [r for r in failing if "your block tables (same letter" in r.message]
    assert drawn, [r.message[:300] for r in failing]
    for r in drawn:
        yours, expected = r.message.split("your block tables (same letter = same physical block):\n")[1].split(
            "  expected (any block ids will do")
        assert yours.strip() != expected.split(":\n", 1)[1].strip(), r.message
