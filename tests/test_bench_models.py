"""The real-model bench sections (grader.bench.k07, the real part of grader.bench.k09) on a small
random Llama, against plain forwards of the same weights; and their saved results drawn."""
from __future__ import annotations

import pytest
import torch

from grader import manifest
from grader.bench import k07 as bench_k07
from grader.bench import k09 as bench_k09
from grader.engine import targets


def _plain_nll(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0, :-1]
    return -torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


IDS = [int(i) for i in torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(1))]


def test_a_sink_cache_longer_than_the_text_reads_it_as_a_plain_forward(tiny):
    _, SinkKVCache = bench_k07.sink_cache_class("solution")
    for prefill in (1, 10, 39):
        nll = bench_k07.stream_nll(tiny, IDS, lambda: SinkKVCache(0, 64, rope_base=100000.0), prefill)
        assert torch.allclose(nll, _plain_nll(tiny, IDS), atol=1e-5), prefill


def test_a_short_window_changes_what_the_model_reads_only_after_eviction(tiny):
    _, SinkKVCache = bench_k07.sink_cache_class("solution")
    nll = bench_k07.stream_nll(tiny, IDS, lambda: SinkKVCache(2, 8, rope_base=100000.0), 10)
    plain = _plain_nll(tiny, IDS)
    assert torch.allclose(nll[:10], plain[:10], atol=1e-5)  # tokens 1 … 10 saw every earlier token
    assert not torch.allclose(nll[12:], plain[12:], atol=1e-3)


def test_an_8_bit_cache_reads_close_to_full_precision_and_2_bits_further(tiny):
    QuantizedKVCache = targets.reference(manifest.get("09")).namespace["QuantizedKVCache"]
    plain = _plain_nll(tiny, IDS)
    gaps = {}
    for bits in (8, 2):
        nll = bench_k09.quantized_nll(tiny, IDS, QuantizedKVCache(n_bits=bits, residual_len=8), 7)
        assert torch.allclose(nll[:7], plain[:7], atol=1e-5)  # nothing quantized before the first group fills
        gaps[bits] = (nll - plain).abs().max().item()
    assert 0 < gaps[8] < gaps[2]


def test_per_channel_keys_beat_per_token_keys_when_channels_are_outliers():
    ref = targets.reference(manifest.get("09")).namespace
    k, _ = bench_k09.outlier_keys(64, torch.device("cpu"))
    assert bench_k09._grouped_error(ref, k, 4, 2, 32) < bench_k09._grouped_error(ref, k, 4, 3, 32)
    found = bench_k09.outliers(k)
    assert set(found["outliers"]) == set(bench_k09.OUTLIERS)


def test_the_fp8_section_finds_e4m3_closer_than_e5m2_and_counts_saturation(tiny):
    from types import SimpleNamespace

    ref = targets.reference(manifest.get("09")).namespace
    quiet = SimpleNamespace(step=lambda *a: None)
    result = bench_k09.bench_real_fp8(SimpleNamespace(model=tiny), IDS, ref, quiet, calibrate=4)
    error = {(r["fmt"], r["per_head"]): r for r in result["rows"]}
    for per_head in (False, True):
        assert 0 < error["e4m3", per_head]["keys"] < error["e5m2", per_head]["keys"] < 0.1
    assert result["elements"] == 2 * 2 * len(IDS) * 8  # 2 layers, 2 KV heads of width 8
    assert 0 <= result["saturated"] < result["elements"]
    assert "per head" in bench_k09.fp8_table(result)


@pytest.mark.parametrize("name", ["plot_streaming", "plot_kivi", "plot_roofline"])
def test_the_saved_measurements_are_drawn(name):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from grader.learner import pictures_models

    path = {"plot_streaming": bench_k07.RESULTS, "plot_kivi": bench_k09.RESULTS,
            "plot_roofline": pictures_models.ROOFLINE_RESULTS}[name]
    if not path.is_file():
        pytest.skip(f"no saved measurement at {path.name}")
    fig = getattr(pictures_models, name)()
    assert fig.axes and all(ax.has_data() for ax in fig.axes)
    matplotlib.pyplot.close(fig)


def test_an_early_exit_draft_shares_the_targets_weights_and_keeps_its_tokens(tiny):
    from grader.bench import k12 as bench_k12

    draft = bench_k12.early_exit_draft(tiny, 1)
    assert len(draft.model.layers) == 1
    assert draft.model.layers[0].self_attn.q_proj.weight is tiny.model.layers[0].self_attn.q_proj.weight
    assert draft.lm_head.weight is tiny.lm_head.weight
    ns = targets.reference(manifest.get("12")).namespace
    plain = targets.reference(manifest.get("08")).namespace["generate"](tiny, [IDS[:8]], 12)[0]
    tokens, _ = ns["speculative_generate"](tiny, draft, IDS[:8], 12, 3)
    assert tokens == plain
