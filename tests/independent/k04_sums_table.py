"""Kata 04, written from its README: every count as an explicit sum's closed form, arguments checked
against one table of lower bounds, the config read through a small lookup that needs a field only
when the answer does (num_attention_heads only for a default), and the dtype looked up as
torch_dtype first, named that way when it is missing.
"""
from __future__ import annotations

import torch

LEAST = {"n_layers": 1, "n_kv_heads": 1, "head_dim": 1, "bytes_per_elem": 1, "batch": 0, "seq_len": 0,
         "weight_bytes": 0, "memory_bytes": 0, "n_steps": 1, "prompt_len": 1}


def _check(**given):
    for name, value in given.items():
        if type(value) is not int or value < LEAST[name]:
            raise ValueError(f"{name} must be an int >= {LEAST[name]}, got {value!r}")
    return given.values()


def kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem):
    L, H, D, b = _check(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, bytes_per_elem=bytes_per_elem)
    return 2 * L * H * D * b  # K and V, every layer, every KV head


def kv_cache_bytes(n_layers, batch, seq_len, n_kv_heads, head_dim, bytes_per_elem):
    B, S = _check(batch=batch, seq_len=seq_len)
    return B * S * kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem)


def _field(section, name):
    value = section.get(name)
    if value is None:
        raise ValueError(f"{name} is missing from the config")
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} must be an int >= 1 in the config, got {value!r}")
    return value


def _elem_bytes(section, config):
    for place in (section, config):
        for key in ("torch_dtype", "dtype"):
            name = place.get(key)
            if name is not None:
                dtype = getattr(torch, str(name).removeprefix("torch."), None)
                if not isinstance(dtype, torch.dtype):
                    raise ValueError(f"torch_dtype: {name!r} is not a torch dtype name")
                return dtype.itemsize
    raise ValueError("torch_dtype: missing from config (or pass bytes_per_elem)")


def kv_cache_bytes_from_config(config, batch, seq_len, bytes_per_elem=None):
    if type(config) is not dict:
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    section = config.get("text_config") or config
    if type(section) is not dict:
        raise ValueError("config: text_config must be a dict")
    layers = _field(section, "num_hidden_layers")
    kv = _field(section, "num_key_value_heads") if section.get("num_key_value_heads") is not None else None
    dim = _field(section, "head_dim") if section.get("head_dim") is not None else None
    if kv is None or dim is None:
        heads = _field(section, "num_attention_heads")
        kv = heads if kv is None else kv
        dim = _field(section, "hidden_size") // heads if dim is None else dim
    if bytes_per_elem is None:
        bytes_per_elem = _elem_bytes(section, config)
    return kv_cache_bytes(layers, batch, seq_len, kv, dim, bytes_per_elem)


def crossover_tokens(weight_bytes, n_layers, n_kv_heads, head_dim, bytes_per_elem):
    (W,) = _check(weight_bytes=weight_bytes)
    per_token = kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem)
    return (W + per_token - 1) // per_token  # the fewest tokens whose cache reaches W


def max_batch_size(memory_bytes, weight_bytes, seq_len, n_layers, n_kv_heads, head_dim, bytes_per_elem):
    M, W = _check(memory_bytes=memory_bytes, weight_bytes=weight_bytes)
    if type(seq_len) is not int or seq_len < 1:
        raise ValueError(f"seq_len must be an int >= 1, got {seq_len!r}")
    per_sequence = seq_len * kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem)
    return 0 if W > M else (M - W) // per_sequence


def projection_counts(n_steps, prompt_len=1):
    n, P = _check(n_steps=n_steps, prompt_len=prompt_len)
    uncached = n * P + n * (n - 1) // 2  # passes over P, P + 1, …, P + n - 1 tokens
    return uncached, P + (n - 1)  # the prompt once, then one token a step


def score_counts(n_steps, prompt_len=1):
    n, P = _check(n_steps=n_steps, prompt_len=prompt_len)
    last = P + n - 1
    squares = last * (last + 1) * (2 * last + 1) // 6 - (P - 1) * P * (2 * P - 1) // 6  # P² + … + last²
    cached = P * P + (last * (last + 1) - P * (P + 1)) // 2  # P² then (P + 1) + … + last
    return squares, cached
