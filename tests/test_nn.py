"""The shared building blocks: apply_rope's properties and the Llama model (forward, cache, files)."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from grader.nn import Llama, LlamaConfig, apply_rope, llama_inv_freq, rope_inv_freq

TINY = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# -- apply_rope -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rope_preserves_norms(dtype):
    x = torch.randn(2, 3, 7, 16, generator=_gen(0), dtype=torch.float64).to(dtype)
    out = apply_rope(x, torch.randint(0, 500, (2, 7), generator=_gen(1)))
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


def test_rope_score_depends_only_on_the_position_difference():
    q, k = torch.randn(2, 16, generator=_gen(2), dtype=torch.float64).unbind(0)
    def score(m, n):
        return float(apply_rope(q[None], torch.tensor([m])) @ apply_rope(k[None], torch.tensor([n]))[0])
    for m, n in [(5, 2), (0, 0), (17, 30)]:
        for shift in (1, 9, 250):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), rel=1e-9, abs=1e-12)
    assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-3)


def test_rope_matches_a_hand_computed_2d_rotation():
    # D = 2: one frequency, base ** 0 = 1, so position p rotates (x, y) by p radians.
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    out = apply_rope(x, torch.tensor([0, 1, 2]))
    c1, s1, c2, s2 = math.cos(1), math.sin(1), math.cos(2), math.sin(2)
    expected = torch.tensor([[1.0, 0.0], [-2 * s1, 2 * c1], [3 * c2 - 4 * s2, 3 * s2 + 4 * c2]], dtype=torch.float64)
    torch.testing.assert_close(out, expected)


def test_rope_per_row_positions_equal_one_call_per_row():
    x = torch.randn(3, 2, 4, 8, generator=_gen(3))
    pos = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [2, 2, 9, 0]])
    out = apply_rope(x, pos)
    for b in range(3):
        torch.testing.assert_close(out[b], apply_rope(x[b], pos[b]))


def test_rope_rejects_mismatched_positions():
    with pytest.raises(ValueError, match="positions"):
        apply_rope(torch.zeros(2, 5, 8), torch.arange(4))


# -- config -----------------------------------------------------------------------------------
def test_config_ignores_unknown_fields_and_fills_defaults(tmp_path):
    raw = {**TINY, "num_key_value_heads": None, "bos_token_id": 1, "torch_dtype": "bfloat16", "architectures": ["x"]}
    config = LlamaConfig.from_dict(raw)
    assert config.num_key_value_heads == 4 and config.head_dim == 8 and config.vocab_size == 40
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert LlamaConfig.from_json(tmp_path / "config.json") == config
    with pytest.raises(ValueError, match="num_key_value_heads"):
        LlamaConfig(num_attention_heads=4, num_key_value_heads=3)


def test_llama3_rope_scaling_keeps_fast_and_stretches_slow_frequencies():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    plain = rope_inv_freq(128, 500000.0, dtype=torch.float64)
    scaled = llama_inv_freq(LlamaConfig(head_dim=128, rope_theta=500000.0, rope_scaling=scaling))
    wavelen = 2 * math.pi / plain
    fast, slow = wavelen < 8192 / 4, wavelen > 8192 / 1
    torch.testing.assert_close(scaled[fast], plain[fast])
    torch.testing.assert_close(scaled[slow], plain[slow] / 8)
    middle = ~fast & ~slow
    assert middle.any() and ((scaled[middle] < plain[middle]) & (scaled[middle] > plain[middle] / 8)).all()
    with pytest.raises(ValueError, match="rope_scaling"):
        llama_inv_freq(LlamaConfig(head_dim=8, rope_scaling={"rope_type": "yarn", "factor": 2.0}))


# -- the model --------------------------------------------------------------------------------
def _model(seed=0, **overrides) -> Llama:
    torch.manual_seed(seed)
    model = Llama(LlamaConfig(**{**TINY, **overrides})).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # norms away from 1
    return model


def _naive_forward(model: Llama, ids: torch.Tensor) -> torch.Tensor:
    """The Llama forward written out from the state dict, one explicit step at a time."""
    cfg, w = model.config, model.state_dict()
    B, T = ids.shape
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    def norm(x, weight):
        return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)

    h = w["model.embed_tokens.weight"][ids]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        x = norm(h, w[p + "input_layernorm.weight"])
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(B, T, Hq, D).transpose(1, 2)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        q, k = apply_rope(q, torch.arange(T), cfg.rope_theta), apply_rope(k, torch.arange(T), cfg.rope_theta)
        k, v = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(~causal, float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, Hq * D)
        h = h + out @ w[p + "self_attn.o_proj.weight"].T
        x = norm(h, w[p + "post_attention_layernorm.weight"])
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return norm(h, w["model.norm.weight"]) @ w["lm_head.weight"].T


def test_parameter_names_are_those_of_llama_for_causal_lm():
    names = set(_model().state_dict())
    per_layer = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"}
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} | {
        f"model.layers.{i}.{name}.weight" for i in range(2) for name in per_layer}
    assert names == expected
    assert _model().state_dict()["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 8, 32)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_forward_matches_the_written_out_computation(kv_heads):
    model = _model(1, num_key_value_heads=kv_heads)
    ids = torch.randint(0, 40, (2, 9), generator=_gen(4))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), _naive_forward(model, ids))


class ConcatCache:
    """The simplest cache: one growing (K, V) per layer."""

    def __init__(self):
        self.layers = {}

    def update(self, layer, k, v):
        if layer in self.layers:
            k, v = torch.cat([self.layers[layer][0], k], 2), torch.cat([self.layers[layer][1], v], 2)
        self.layers[layer] = (k, v)
        return k, v


def test_cached_forward_equals_the_uncached_forward():
    model = _model(2)
    ids = torch.randint(0, 40, (3, 11), generator=_gen(5))
    with torch.no_grad():
        full = model(ids)
        cache, pieces, start = ConcatCache(), [], 0
        for length in (4, 1, 3, 1, 2):  # a prefill, then single steps and chunks
            positions = torch.arange(start, start + length).expand(3, length)
            pieces.append(model(ids[:, start:start + length], position_ids=positions, cache=cache))
            start += length
    torch.testing.assert_close(torch.cat(pieces, 1), full)


def test_left_padded_rows_with_a_mask_equal_each_row_alone():
    model = _model(3)
    prompts = [[5, 6, 7, 8, 9], [1, 2], [30]]
    P = 5
    ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts])
    real = torch.tensor([[False] * (P - len(p)) + [True] * len(p) for p in prompts])
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)
    mask = torch.ones(P, P, dtype=torch.bool).tril() & real[:, None, :]  # pad queries see nothing at all
    with torch.no_grad():
        out = model(ids, position_ids=positions, attention_mask=mask, logits_to_keep=1)
        assert out.shape == (3, 1, 40) and not out.isnan().any()
        for b, prompt in enumerate(prompts):
            torch.testing.assert_close(out[b, -1], model(torch.tensor([prompt]))[0, -1])


def test_forward_names_bad_arguments():
    model = _model()
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="position_ids"):
        model(torch.zeros(2, 5, dtype=torch.long), position_ids=torch.arange(4)[None])
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.zeros(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 5, 4, dtype=torch.bool))


# -- files ------------------------------------------------------------------------------------
def _same_model(a: Llama, b: Llama):
    ids = torch.randint(0, 40, (2, 6), generator=_gen(6))
    assert a.state_dict().keys() == b.state_dict().keys()
    with torch.no_grad():
        torch.testing.assert_close(a(ids), b(ids), rtol=0, atol=0)


def test_save_and_load_one_file(tmp_path):
    model = _model(4)
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    loaded = Llama.from_pretrained(tmp_path)
    assert loaded.dtype == torch.float64 and loaded.config == model.config
    _same_model(model, loaded)
    assert Llama.from_pretrained(tmp_path, dtype=torch.float32).dtype == torch.float32


def test_save_and_load_shards(tmp_path):
    model = _model(5)
    model.save_pretrained(tmp_path, max_shard_size=40_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all((tmp_path / s).is_file() for s in shards)
    assert set(index["weight_map"]) == set(model.state_dict())
    _same_model(model, Llama.from_pretrained(tmp_path))


def test_tied_embeddings_are_stored_once_and_loaded_tied(tmp_path):
    from safetensors import safe_open

    model = _model(6, tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert "lm_head.weight" not in f.keys()
    loaded = Llama.from_pretrained(tmp_path)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    _same_model(model, loaded)


def test_loaded_in_place_the_weights_are_the_files_own_and_writes_never_reach_it(tmp_path):
    model = _model(8, tie_word_embeddings=True)
    model.save_pretrained(tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()
    loaded = Llama.from_pretrained(tmp_path)
    for p in loaded.parameters():
        assert p.device.type == "cpu" and p.dtype == torch.float64 and p.requires_grad
    with torch.no_grad():  # a check that perturbs a weight in place must not change the checkpoint
        for p in loaded.parameters():
            p.add_(1.0)
    assert (tmp_path / "model.safetensors").read_bytes() == before
    _same_model(model, Llama.from_pretrained(tmp_path))
    assert Llama.from_pretrained(tmp_path, dtype=torch.float32).lm_head.weight.dtype == torch.float32


def _write_checkpoint(folder, model: Llama, *, config_changes=None, shards=2, drop=(), reshape=()):
    """A Hugging Face style sharded checkpoint written by hand, independently of save_pretrained."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float64",
              **{k: v for k, v in vars(model.config).items()}, **(config_changes or {})}
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {n: t.clone() for n, t in model.state_dict().items() if n not in drop}
    for name in reshape:
        tensors[name] = tensors[name][:-1].clone()
    names, weight_map = sorted(tensors), {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        save_file(part, str(folder / file))
        weight_map.update(dict.fromkeys(part, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_loads_a_hand_written_sharded_checkpoint(tmp_path):
    model = _model(7)
    _write_checkpoint(tmp_path, model, shards=3)
    _same_model(model, Llama.from_pretrained(tmp_path))


def test_errors_name_the_file_and_the_tensor(tmp_path):
    model = _model(8)
    with pytest.raises(FileNotFoundError, match="config.json"):
        Llama.from_pretrained(tmp_path / "nowhere")
    _write_checkpoint(tmp_path / "mistral", model, config_changes={"architectures": ["MistralForCausalLM"],
                                                                  "model_type": "mistral"})
    with pytest.raises(ValueError, match="config.json.*mistral"):
        Llama.from_pretrained(tmp_path / "mistral")
    _write_checkpoint(tmp_path / "short", model, reshape=["model.layers.1.mlp.up_proj.weight"])
    with pytest.raises(ValueError, match=r"model-0000\d-of-00002\.safetensors.*model\.layers\.1\.mlp\.up_proj\.weight.*shape"):
        Llama.from_pretrained(tmp_path / "short")
    _write_checkpoint(tmp_path / "missing", model, drop=["model.norm.weight"])
    with pytest.raises(ValueError, match="model.norm.weight"):
        Llama.from_pretrained(tmp_path / "missing")
    _write_checkpoint(tmp_path / "lost", model)
    (tmp_path / "lost" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        Llama.from_pretrained(tmp_path / "lost")
    _write_checkpoint(tmp_path / "biased", model, config_changes={"attention_bias": True})
    with pytest.raises(ValueError, match="attention_bias"):
        Llama.from_pretrained(tmp_path / "biased")
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "config.json").write_text(json.dumps({**TINY, "model_type": "llama"}))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        Llama.from_pretrained(tmp_path / "none")


def test_an_extra_tensor_is_named(tmp_path):
    from safetensors.torch import save_file

    model = _model(9)
    model.save_pretrained(tmp_path)
    tensors = {n: t.clone() for n, t in model.state_dict().items()}
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(32, dtype=torch.float64)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="model.safetensors.*q_proj.bias"):
        Llama.from_pretrained(tmp_path)
