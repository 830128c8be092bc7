"""Kata 04, written from its README: crossover and batch size found by integer search (doubling then bisection), sums expanded in n and p, operator.index validation, config read eagerly with 'dtype' tried before 'torch_dtype'.
"""
from __future__ import annotations

import operator

import torch


def _count(value, name, smallest):
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= {smallest}; a bool ({value}) is not a size")
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= {smallest}, but got {value!r} ({type(value).__name__})") from None
    if n < smallest:
        raise ValueError(f"{name} must be an integer >= {smallest}, but got {n}")
    return n


def kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem):
    factors = [_count(n_layers, "n_layers", 1), _count(n_kv_heads, "n_kv_heads", 1),
               _count(head_dim, "head_dim", 1), _count(bytes_per_elem, "bytes_per_elem", 1)]
    total = 2  # one key and one value
    for f in factors:
        total *= f
    return total


def kv_cache_bytes(n_layers, batch, seq_len, n_kv_heads, head_dim, bytes_per_elem):
    b = _count(batch, "batch", 0)
    s = _count(seq_len, "seq_len", 0)
    return b * s * kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem)


_MISSING = object()


def _need(section, key):
    value = section.get(key, _MISSING)
    if value is _MISSING or value is None:
        raise ValueError(f"config is missing the field {key!r}")
    return value


def kv_cache_bytes_from_config(config, batch, seq_len, bytes_per_elem=None):
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict (a parsed config.json), got {type(config).__name__}")
    section = config
    if "text_config" in config and config["text_config"] is not None:
        section = config["text_config"]
        if not isinstance(section, dict):
            raise ValueError(f"text_config must be a dict, got {type(section).__name__}")
    layers = _count(_need(section, "num_hidden_layers"), "num_hidden_layers", 1)
    heads = _count(_need(section, "num_attention_heads"), "num_attention_heads", 1)
    kv_heads = section.get("num_key_value_heads")
    kv_heads = heads if kv_heads is None else _count(kv_heads, "num_key_value_heads", 1)
    width = section.get("head_dim")
    if width is None:
        width = _count(_need(section, "hidden_size"), "hidden_size", 1) // heads
    width = _count(width, "head_dim", 1)
    if bytes_per_elem is None:
        name = None
        for where in (section, config):
            for key in ("dtype", "torch_dtype"):
                if where.get(key) is not None:
                    name = where[key]
                    break
            if name is not None:
                break
        if name is None:
            raise ValueError("config is missing the field 'torch_dtype' (or 'dtype'), and no bytes_per_elem was given")
        if not isinstance(name, str):
            raise ValueError(f"torch_dtype must be a dtype name such as 'float16', got {name!r}")
        key = name[len("torch."):] if name.startswith("torch.") else name
        dt = getattr(torch, key, None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"torch_dtype {name!r} is not a torch dtype name")
        bytes_per_elem = dt.itemsize
    return kv_cache_bytes(layers, batch, seq_len, kv_heads, width, _count(bytes_per_elem, "bytes_per_elem", 1))


def _smallest_true(pred):
    """Smallest n >= 0 with pred(n) true, pred monotone (false ... false true ...)."""
    if pred(0):
        return 0
    hi = 1
    while not pred(hi):
        hi *= 2
    lo = hi // 2  # pred(lo) is false
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid
    return hi


def crossover_tokens(weight_bytes, n_layers, n_kv_heads, head_dim, bytes_per_elem):
    w = _count(weight_bytes, "weight_bytes", 0)
    per = kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem)
    return _smallest_true(lambda t: t * per >= w)


def max_batch_size(memory_bytes, weight_bytes, seq_len, n_layers, n_kv_heads, head_dim, bytes_per_elem):
    m = _count(memory_bytes, "memory_bytes", 0)
    w = _count(weight_bytes, "weight_bytes", 0)
    s = _count(seq_len, "seq_len", 1)
    per_seq = s * kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem)
    if w > m:
        return 0
    free = m - w
    # the first batch that does not fit, minus one
    return _smallest_true(lambda b: b * per_seq > free) - 1


def projection_counts(n_steps, prompt_len=1):
    n = _count(n_steps, "n_steps", 1)
    p = _count(prompt_len, "prompt_len", 1)
    # pass j (0-based) without a cache projects p + j tokens; with one, the prompt then one each
    uncached = n * p + n * (n - 1) // 2
    cached = p + (n - 1)
    return uncached, cached


def score_counts(n_steps, prompt_len=1):
    n = _count(n_steps, "n_steps", 1)
    p = _count(prompt_len, "prompt_len", 1)
    # sum_{j<n} (p + j)^2 = n p^2 + 2 p sum j + sum j^2
    sum_j = n * (n - 1) // 2
    sum_j2 = (n - 1) * n * (2 * n - 1) // 6
    uncached = n * p * p + 2 * p * sum_j + sum_j2
    # the prompt pass p*p, then step j >= 1 scores against p + j keys
    cached = p * p + (n - 1) * p + sum_j
    return uncached, cached
