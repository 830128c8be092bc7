"""Kata 04, written from its README: divmod for both roundings, triangular-number identities for the counts, plain-int validation (isinstance int, bool refused), config sections merged as a chain of lookups.
"""
from __future__ import annotations

import torch


class _Bad(ValueError):
    pass


def _int(value, name, *, zero_ok=False):
    floor = 0 if zero_ok else 1
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Bad(f"{name}: expected an int >= {floor}, got {value!r} of type {type(value).__name__}")
    if value < floor:
        raise _Bad(f"{name}: expected an int >= {floor}, got {value}")
    return value


def kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem):
    L = _int(n_layers, "n_layers")
    H = _int(n_kv_heads, "n_kv_heads")
    D = _int(head_dim, "head_dim")
    b = _int(bytes_per_elem, "bytes_per_elem")
    return (L * 2) * (H * D) * b


def kv_cache_bytes(n_layers, batch, seq_len, n_kv_heads, head_dim, bytes_per_elem):
    tokens = _int(batch, "batch", zero_ok=True) * _int(seq_len, "seq_len", zero_ok=True)
    return tokens * kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem)


_DTYPE_BYTES = {}


def _dtype_bytes(name):
    if isinstance(name, torch.dtype):
        return name.itemsize
    if not isinstance(name, str):
        raise _Bad(f"torch_dtype: expected a dtype name like 'bfloat16', got {name!r}")
    short = name.split(".")[-1] if name.startswith("torch.") else name
    dt = getattr(torch, short, None)
    if not isinstance(dt, torch.dtype):
        raise _Bad(f"torch_dtype: {name!r} names no torch dtype")
    return dt.itemsize


def kv_cache_bytes_from_config(config, batch, seq_len, bytes_per_elem=None):
    if not isinstance(config, dict):
        raise _Bad(f"config: expected a dict, got {type(config).__name__}")
    tc = config.get("text_config", None)
    if tc is not None and not isinstance(tc, dict):
        raise _Bad(f"text_config: expected a nested dict, got {type(tc).__name__}")
    lm = tc if tc is not None else config

    def get(key):
        v = lm.get(key)
        return v

    def need(key):
        v = get(key)
        if v is None:
            raise _Bad(f"config: missing field {key}")
        return v

    layers = _int(need("num_hidden_layers"), "num_hidden_layers")
    kv = get("num_key_value_heads")
    hd = get("head_dim")
    if kv is None:
        kv = _int(need("num_attention_heads"), "num_attention_heads")
    if hd is None:
        q = _int(need("num_attention_heads"), "num_attention_heads")
        hd = _int(need("hidden_size"), "hidden_size") // q
    if bytes_per_elem is not None:
        size = _int(bytes_per_elem, "bytes_per_elem")
    else:
        name = None
        for key in ("torch_dtype", "dtype"):
            if lm.get(key) is not None:
                name = lm[key]
                break
        else:
            for key in ("torch_dtype", "dtype"):
                if config.get(key) is not None:
                    name = config[key]
                    break
        if name is None:
            raise _Bad("config: missing field torch_dtype (or dtype) and no bytes_per_elem given")
        size = _dtype_bytes(name)
    return kv_cache_bytes(layers, batch, seq_len, _int(kv, "num_key_value_heads"), _int(hd, "head_dim"), size)


def crossover_tokens(weight_bytes, n_layers, n_kv_heads, head_dim, bytes_per_elem):
    w = _int(weight_bytes, "weight_bytes", zero_ok=True)
    q, r = divmod(w, kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem))
    return q + (1 if r else 0)


def max_batch_size(memory_bytes, weight_bytes, seq_len, n_layers, n_kv_heads, head_dim, bytes_per_elem):
    m = _int(memory_bytes, "memory_bytes", zero_ok=True)
    w = _int(weight_bytes, "weight_bytes", zero_ok=True)
    s = _int(seq_len, "seq_len")
    one = kv_cache_bytes(n_layers, 1, s, n_kv_heads, head_dim, bytes_per_elem)
    if m <= w:
        return 0
    fit, _left = divmod(m - w, one)
    return fit


def _tri(m):
    # 0 + 1 + ... + m
    return (m * m + m) >> 1


def projection_counts(n_steps, prompt_len=1):
    n = _int(n_steps, "n_steps")
    p = _int(prompt_len, "prompt_len")
    hi = p + n - 1  # tokens in the last pass
    return _tri(hi) - _tri(p - 1), p + n - 1


def score_counts(n_steps, prompt_len=1):
    n = _int(n_steps, "n_steps")
    p = _int(prompt_len, "prompt_len")
    hi = p + n - 1

    def sq(m):  # 1^2 + ... + m^2 = m(m+1)(2m+1)/6 = (2 m^3 + 3 m^2 + m) / 6
        return (2 * m ** 3 + 3 * m ** 2 + m) // 6

    return sq(hi) - sq(p - 1), p * p + (_tri(hi) - _tri(p))
