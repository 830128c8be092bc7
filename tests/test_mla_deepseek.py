"""Kata 19's reference against its outside truths: transformers' DeepseekV3Attention (a tiny random config,
its state dict loaded as it is) and the DeepSeek-V2 paper's numbers from the public configs."""
from __future__ import annotations

import math

import pytest
import torch

from grader import manifest
from grader.engine import targets

MLA = targets.reference(manifest.get("19")).namespace
SIZES = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8,
             qk_rope_head_dim=4, v_head_dim=6)
TOLERANCE = 1e-6  # transformers' RMSNorm computes in float32 even for a float64 model


def _deepseek(q_lora_rank):
    transformers = pytest.importorskip(
        "transformers", reason="the cross-check needs transformers: pip install -e '.[dev]'")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as modeling

    config = transformers.DeepseekV3Config(**SIZES, q_lora_rank=q_lora_rank, rope_interleave=True, rope_scaling=None)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        attention = modeling.DeepseekV3Attention(config, layer_idx=0).double()
        for p in attention.parameters():
            torch.nn.init.normal_(p, std=0.3)
        rotary = modeling.DeepseekV3RotaryEmbedding(config).double()
    return transformers, config, attention.eval(), rotary


def _mask(T: int, S: int) -> torch.Tensor:
    allowed = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    return torch.zeros(T, S, dtype=torch.float64).masked_fill(~allowed, float("-inf"))[None, None]


@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_reference_loads_deepseek_v3_attention_and_matches_it(q_lora_rank):
    transformers, config, theirs, rotary = _deepseek(q_lora_rank)
    ours = MLA["MLAttention"](64, 4, 16, 8, 4, 6, q_lora_rank=q_lora_rank,
                              rope_base=config.rope_parameters["rope_theta"]).double()
    ours.load_state_dict(theirs.state_dict(), strict=True)  # transformers' names, as they are
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 11, 64, generator=g, dtype=torch.float64)
    pos = torch.arange(300, 311).expand(2, 11)  # past 256: interleaved RoPE judged where it matters
    hf_cache = transformers.DynamicCache(config=config)
    cache, start = MLA["LatentKVCache"](), 0
    for n, absorbed in ((7, False), (1, True), (2, True), (1, False)):
        chunk, p = x[:, start:start + n], pos[:, start:start + n]
        want, _ = theirs(chunk, rotary(chunk, p), _mask(n, start + n), cache=hf_cache)
        got = ours(chunk, p, cache, absorbed=absorbed)
        assert (got - want).abs().max() < TOLERANCE, (n, absorbed)
        start += n
    latent, k_pe = cache.layers[0]
    their_latent, their_key = hf_cache.layers[0].keys[:, 0], hf_cache.layers[0].values[:, 0]  # (B, S, C), (B, S, R)
    assert (latent - their_latent).abs().max() < TOLERANCE  # the normalized, unrotated latent
    # transformers keeps the rotated key de-interleaved (evens, then odds); the kata keeps DeepSeek's pair layout
    assert (torch.cat([k_pe[..., 0::2], k_pe[..., 1::2]], -1) - their_key).abs().max() < TOLERANCE


def test_the_papers_numbers_from_the_public_configs():
    cache_bytes, groups = MLA["mla_cache_bytes"], MLA["gqa_groups"]
    v2, dense_67b = cache_bytes(60, 1, 512, 64, 1), 2 * 8 * 128 * 95  # elements a token
    assert (v2, dense_67b) == (34_560, 194_560)
    assert round(100 * (1 - v2 / dense_67b), 2) == 82.24  # the same precision
    assert round(100 * (1 - cache_bytes(60, 1, 512, 64, 0.75) / (dense_67b * 2)), 1) == 93.3  # 6 bits against 16
    assert groups(512, 64, 128) == 2.25
    assert cache_bytes(61, 1, 512, 64) == 70_272
    assert math.isclose(cache_bytes(61, 131_072, 512, 64) / 2**30, 8.578125)
    flops = MLA["decode_flops"]
    naive = [flops(s, 128, 512, 128, 64, 128, absorbed=False) for s in (1024, 4096)]
    absorbed = [flops(s, 128, 512, 128, 64, 128, absorbed=True) for s in (1024, 4096)]
    assert [round(f / 1e9, 1) for f in naive] == [34.4, 137.8]
    assert [round(f / 1e9, 3) for f in absorbed] == [0.319, 1.174]
    assert 2 * 128 * (576 + 512) == 278_528 and 2 * 128 * (192 + 128) == 81_920  # per query-key pair
