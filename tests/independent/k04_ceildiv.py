"""Kata 04, written from its README: ceiling division for the crossover, floor division for the batch, closed-form sums, config fields read only when needed.

Validation goes through one helper that accepts any integral number (numpy ints included) but not bools.
"""
from __future__ import annotations

import numbers

import torch


def _whole(name, value, low):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an int >= {low}, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value}")
    return value


def kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem):
    n_layers = _whole("n_layers", n_layers, 1)
    n_kv_heads = _whole("n_kv_heads", n_kv_heads, 1)
    head_dim = _whole("head_dim", head_dim, 1)
    bytes_per_elem = _whole("bytes_per_elem", bytes_per_elem, 1)
    return 2 * n_layers * n_kv_heads * head_dim * bytes_per_elem


def kv_cache_bytes(n_layers, batch, seq_len, n_kv_heads, head_dim, bytes_per_elem):
    per_token = kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem)
    return per_token * _whole("batch", batch, 0) * _whole("seq_len", seq_len, 0)


def _field(cfg, name):
    value = cfg.get(name)
    if value is None:
        raise ValueError(f"config: the field {name!r} is missing (expected an int)")
    return value


def kv_cache_bytes_from_config(config, batch, seq_len, bytes_per_elem=None):
    if not isinstance(config, dict):
        raise ValueError(f"config: expected a dict parsed from config.json, got {type(config).__name__}")
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ValueError(f"text_config: expected a dict of the language model's fields, got {type(text).__name__}")
    cfg = config if text is None else text
    n_layers = _field(cfg, "num_hidden_layers")
    n_kv = cfg.get("num_key_value_heads")
    head_dim = cfg.get("head_dim")
    if n_kv is None or head_dim is None:
        n_heads = _whole("num_attention_heads", _field(cfg, "num_attention_heads"), 1)
        if n_kv is None:
            n_kv = n_heads
        if head_dim is None:
            head_dim = _whole("hidden_size", _field(cfg, "hidden_size"), 1) // n_heads
    if bytes_per_elem is None:
        name = None
        for source in (cfg, config):
            name = source.get("torch_dtype") or source.get("dtype")
            if name is not None:
                break
        if name is None:
            raise ValueError("config: the field 'torch_dtype' (or 'dtype') is missing; pass bytes_per_elem")
        label = str(name).removeprefix("torch.")
        dtype = getattr(torch, label, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"torch_dtype: expected a torch dtype name such as 'bfloat16', got {name!r}")
        bytes_per_elem = dtype.itemsize
    return kv_cache_bytes(_whole("num_hidden_layers", n_layers, 1), batch, seq_len,
                          _whole("num_key_value_heads", n_kv, 1), _whole("head_dim", head_dim, 1),
                          _whole("bytes_per_elem", bytes_per_elem, 1))


def crossover_tokens(weight_bytes, n_layers, n_kv_heads, head_dim, bytes_per_elem):
    weight_bytes = _whole("weight_bytes", weight_bytes, 0)
    per_token = kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem)
    return -(-weight_bytes // per_token)


def max_batch_size(memory_bytes, weight_bytes, seq_len, n_layers, n_kv_heads, head_dim, bytes_per_elem):
    memory_bytes = _whole("memory_bytes", memory_bytes, 0)
    weight_bytes = _whole("weight_bytes", weight_bytes, 0)
    seq_len = _whole("seq_len", seq_len, 1)
    per_seq = kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem) * seq_len
    free = memory_bytes - weight_bytes
    return free // per_seq if free > 0 else 0


def _sum_to(m):
    return m * (m + 1) // 2


def _squares_to(m):
    return m * (m + 1) * (2 * m + 1) // 6


def projection_counts(n_steps, prompt_len=1):
    n = _whole("n_steps", n_steps, 1)
    p = _whole("prompt_len", prompt_len, 1)
    last = p + n - 1
    return _sum_to(last) - _sum_to(p - 1), last


def score_counts(n_steps, prompt_len=1):
    n = _whole("n_steps", n_steps, 1)
    p = _whole("prompt_len", prompt_len, 1)
    last = p + n - 1
    uncached = _squares_to(last) - _squares_to(p - 1)
    cached = p * p + (_sum_to(last) - _sum_to(p))
    return uncached, cached
