"""Kata 15's bench section counts what it says: token rows and score entries of a padded and a packed
prefill of the same prompts, whose last-token logits agree."""
from __future__ import annotations

import torch

from grader.bench import k15 as bench_k15


class _Silent:
    def step(self, label: str, result: str) -> None:
        pass


def test_lengths_are_skewed_from_shortest_to_longest():
    sizes = bench_k15.lengths()
    assert len(sizes) == 16 and sizes[0] == 5 and sizes[-1] == 500 and sizes == sorted(sizes)
    assert sum(n < 100 for n in sizes) > len(sizes) // 2  # most prompts short


def test_packing_rows_count_tokens_and_scores_and_agree():
    torch.set_num_threads(1)
    pad, pack = bench_k15.bench_packing(torch.device("cpu"), _Silent(), quick=True)
    sizes = bench_k15.lengths(longest=200)
    assert (pad["tokens"], pack["tokens"]) == (16 * 200, sum(sizes))
    assert (pad["score_entries"], pack["score_entries"]) == (16 * 200 * 200, sum(sizes) ** 2)
    assert pack["varlen_score_entries"] == sum(n * n for n in sizes)
    assert pack["max_logit_diff"] < 1e-3 and pad["seconds"] > 0 and pack["seconds"] > 0
    text = "\n".join(bench_k15.lines([pad, pack]))
    assert f"padded prefill computes {16 * 200} token rows, packed {sum(sizes)}" in text
