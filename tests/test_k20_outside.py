"""Kata 20's reference against transformers' own hybrid caches (tiny random Gemma 3 and Qwen3-Next
configs, float64 where the model allows): a window layer returns and keeps what transformers' sliding
layer does, the masks follow its mask functions, and on a real forward the reference's counts (tokens
stored per layer, the request's length, the bytes held) are what transformers' cache holds.

Skipped without transformers: pip install 'kv-cache-katas[dev]' (or pip install transformers).
"""
from __future__ import annotations

import random
import warnings

import pytest
import torch

from grader import manifest
from grader.engine import targets

transformers = pytest.importorskip("transformers", reason="the cross-checks need transformers: "
                                   "pip install 'kv-cache-katas[dev]'")
cache_utils = pytest.importorskip("transformers.cache_utils")
masking_utils = pytest.importorskip("transformers.masking_utils")
REF = targets.reference(manifest.get("20")).namespace


def _needs(*names):
    missing = [n for n in names if not hasattr(transformers, n) and not hasattr(cache_utils, n)]
    if missing:
        pytest.skip(f"transformers {transformers.__version__} has no {missing}: pip install -U transformers")


def test_a_window_layer_returns_and_keeps_what_transformers_sliding_layer_does():
    _needs("DynamicSlidingWindowLayer")
    rng = random.Random(20)
    for trial in range(200):
        window = rng.randint(2, 9)  # transformers keeps every token at W = 1 (a slice of -0: ours keeps none)
        theirs, ours = cache_utils.DynamicSlidingWindowLayer(window), REF["SlidingLayer"](window)
        for step in range(rng.randint(1, 7)):
            T = rng.randint(1, 6)
            k, v = torch.randn(1, 2, T, 4, dtype=torch.float64), torch.randn(1, 2, T, 4, dtype=torch.float64)
            K, V = theirs.update(k, v)
            K2, V2, _ = ours.update(k, v)
            assert torch.equal(K, K2) and torch.equal(V, V2), (trial, step, window)
            assert theirs.keys.shape[-2] == len(ours), (trial, step, window)


@pytest.mark.parametrize("kind,overlay", [("sliding_attention", "sliding_window_overlay"),
                                          ("chunked_attention", "chunked_overlay")])
def test_the_masks_follow_transformers_mask_functions(kind, overlay):
    if not hasattr(masking_utils, overlay):
        pytest.skip(f"transformers {transformers.__version__} has no masking_utils.{overlay}")
    for window in (1, 2, 3, 4, 7):
        make = getattr(masking_utils, overlay)
        extra = make(window) if kind == "sliding_attention" else make(window, torch.zeros(1, dtype=torch.long))
        q, k = torch.arange(0, 20), torch.arange(0, 20)
        theirs = torch.tensor([[bool(kv <= qi and extra(0, 0, qi, kv)) for kv in range(20)] for qi in range(20)])
        assert torch.equal(REF["window_mask"](kind, q, k, window), theirs), window


def _forward(model, ids, cache, chunks):
    outs, seen = [], 0
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        for T in chunks:
            outs.append(model(ids[:, seen:seen + T], past_key_values=cache, use_cache=True).logits)
            seen += T
    return torch.cat(outs, 1)


def _kv_bytes(layer):
    return sum(t.numel() * t.element_size() for t in (layer.keys, layer.values) if isinstance(t, torch.Tensor))


def test_gemma3_cache_holds_what_the_reference_counts():
    _needs("Gemma3TextConfig", "Gemma3ForCausalLM", "DynamicCache")
    types = ["sliding_attention"] * 5 + ["full_attention"]
    config = transformers.Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, sliding_window=4, layer_types=types, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config).double().eval()
    ids = torch.randint(0, 64, (1, 13))
    with torch.no_grad():
        whole = model(ids).logits
    cache = transformers.DynamicCache(config=config)
    cached = _forward(model, ids, cache, [9, 1, 1, 1, 1])
    assert (cached - whole).abs().max() < 1e-12  # a cache past the window changes nothing
    ours = REF["HybridKVCache"](types, window=4)
    for T in (9, 1, 1, 1, 1):
        for layer in range(6):
            ours.update(layer, torch.zeros(1, 1, T, 16, dtype=torch.float64), torch.zeros(1, 1, T, 16,
                                                                                         dtype=torch.float64))
    assert cache.get_seq_length() == ours.seq_len() == 13
    assert [layer.keys.shape[-2] for layer in cache.layers] == [ours.stored(i) for i in range(6)] == [3] * 5 + [13]
    held = sum(_kv_bytes(layer) for layer in cache.layers)
    assert held == ours.nbytes() == REF["hybrid_cache_bytes"](types, 13, n_kv_heads=1, head_dim=16, window=4,
                                                              dtype_bytes=8)


def test_qwen3_next_linear_layers_hold_a_fixed_state_counted_by_the_formula():
    _needs("Qwen3NextConfig", "Qwen3NextForCausalLM", "DynamicCache")
    types = ["linear_attention"] * 3 + ["full_attention"]
    config = transformers.Qwen3NextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=2, num_experts_per_tok=1,
        moe_intermediate_size=16, shared_expert_intermediate_size=16, layer_types=types, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.Qwen3NextForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 13))
    cache = transformers.DynamicCache(config=config)

    def state_bytes(layer):
        parts = [getattr(layer, name, None) for name in ("conv_states", "recurrent_states")]
        tensors = [t for p in parts for t in (p.values() if isinstance(p, dict) else [p]) if isinstance(t, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)

    _forward(model, ids, cache, [1])
    after_one = [state_bytes(layer) for layer in cache.layers[:3]]
    _forward(model, ids[:, 1:], cache, [12])
    after_13 = [state_bytes(layer) for layer in cache.layers[:3]]
    assert after_one == after_13 and after_one[0] > 0  # the state never grows
    held = sum(after_13) + _kv_bytes(cache.layers[3])
    assert held == REF["hybrid_cache_bytes"](types, 13, n_kv_heads=1, head_dim=16, window=4,
                                             state_bytes=after_13[0], dtype_bytes=4)
