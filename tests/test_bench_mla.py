"""Kata 19's bench section runs the reference at small sizes and prints what it measured."""
from __future__ import annotations

from grader.bench import k19


def test_bench_times_both_paths_and_they_agree():
    rows = k19.bench_mla(lengths=(8, 16), heads=2, hidden=64, repeats=1)
    assert [r["S"] for r in rows] == [8, 16]
    for r in rows:
        assert r["naive_ms"] > 0 and r["absorbed_ms"] > 0
        assert r["naive_flops"] > r["absorbed_flops"]
        assert r["max_diff"] < 1e-4  # float32: the two paths differ only by rounding
    text = "\n".join(k19.lines(rows))
    assert "S =     8" in text and "1,152 bytes" in text and "fewer" not in text
