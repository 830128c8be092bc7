"""The real-model bench of kata 21 (grader.bench.k21) on a small random Llama: the full cache reads the
text as a plain forward does, and each policy keeps the number of tokens it says, at true positions."""
from __future__ import annotations

import pytest
import torch

from grader.bench import k21 as bench

CONTEXT = 24


IDS = [int(i) for i in torch.randint(0, 64, (36,), generator=torch.Generator().manual_seed(1))]


def test_the_full_cache_reads_the_text_as_a_plain_forward(tiny):
    _, api = bench.evict_api("solution")
    layers = bench.prefill(tiny, torch.tensor([IDS[:CONTEXT - 1]]))  # the prefill predicts nothing here
    caches = [bench.build_cache(api, layer, "full", CONTEXT, 100000.0) for layer in layers]
    nll = bench.decode_nll(tiny, torch.tensor([IDS[CONTEXT - 1:]]), caches)  # tokens CONTEXT … end
    with torch.no_grad():
        logits = tiny(torch.tensor([IDS]))[0, CONTEXT - 1:-1]
    plain = -torch.log_softmax(logits, -1).gather(1, torch.tensor(IDS[CONTEXT:])[:, None])[:, 0]
    assert torch.allclose(nll, plain, atol=1e-5)


@pytest.mark.parametrize("policy", bench.POLICIES)
def test_each_policy_keeps_its_budget_at_true_positions(tiny, policy):
    _, api = bench.evict_api("solution")
    layers = bench.prefill(tiny, torch.tensor([IDS[:CONTEXT]]))
    budget = 20 if policy == "snapkv" else 8  # SnapKV's window of 16 needs a larger budget
    cache = bench.build_cache(api, layers[0], policy, budget, 100000.0)
    pos = cache.positions()
    assert len(cache) == budget and cache.tokens_seen == CONTEXT
    assert (pos[..., -1] == CONTEXT - 1).all() and (pos.diff(dim=-1) > 0).all()
    if policy == "sinks":
        assert pos[0, 0, :bench.SINKS].tolist() == list(range(bench.SINKS))


def test_the_suites_eviction_section_reads_one_stretch_with_every_policy(tiny, monkeypatch):
    """``kvkata bench --real-model``'s kata 21 section (grader.bench.suite.bench_eviction), on the small model."""
    from types import SimpleNamespace
    from grader.bench import suite
    monkeypatch.setattr(bench, "CONTEXT", CONTEXT)
    monkeypatch.setattr(bench, "NEXT", 11)
    monkeypatch.setattr(suite.bench_k07, "corpus", lambda tokenizer, n: IDS[:n] + [0] * 5)
    progress = suite.Progress(1, quiet=True)
    rows = suite.bench_eviction(SimpleNamespace(model=tiny, tokenizer=None), progress, budgets=(20,))
    assert [(r["policy"], r["budget"]) for r in rows] == [("full", CONTEXT)] + [(p, 20) for p in bench.POLICIES]
    assert all(r["ppl"] > 1 for r in rows) and progress.done == progress.total == 1
    assert "full cache:" in bench.table(rows)
