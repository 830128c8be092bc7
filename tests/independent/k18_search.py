"""Kata 18, written from its README: the model as a list of named matrix shapes (like a state dict),
FLOPs and bytes summed over that list, attention pairs as an arithmetic series, peaks turned exact with
float.as_integer_ratio, and the crossover found by doubling then bisecting over the batch.
"""
from __future__ import annotations

from fractions import Fraction

import torch


def _whole(value, name, low):
    if type(value) is bool or not isinstance(value, int):
        raise ValueError(f"{name} should be an int >= {low}; it is {value!r}")
    if value < low:
        raise ValueError(f"{name} should be an int >= {low}; it is {value}")
    return value


def _peak(value, name):
    if type(value) is bool or not isinstance(value, (int, float, Fraction)):
        raise ValueError(f"{name} should be a positive int, Fraction or float; it is {value!r}")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{name} should be finite; it is {value}")
        value = Fraction(*value.as_integer_ratio())
    if value <= 0:
        raise ValueError(f"{name} should be > 0; it is {value}")
    return Fraction(value)


def _model(config):
    if type(config) is not dict:
        raise ValueError(f"config should be a dict, it is a {type(config).__name__}")
    lm = config["text_config"] if config.get("text_config") is not None else config
    if type(lm) is not dict:
        raise ValueError("config: text_config should be a dict")

    def need(key):
        if lm.get(key) is None:
            raise ValueError(f"config is missing {key}")
        return _whole(lm[key], key, 1)

    n = {key: need(key) for key in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                     "intermediate_size", "vocab_size")}
    kv = lm.get("num_key_value_heads")
    n["kv"] = n["num_attention_heads"] if kv is None else _whole(kv, "num_key_value_heads", 1)
    hd = lm.get("head_dim")
    n["hd"] = n["hidden_size"] // n["num_attention_heads"] if hd is None else _whole(hd, "head_dim", 1)
    n["lm"], n["top"] = lm, config
    return n


def _matrices(n):
    """(name, rows, cols) of every matrix a token goes through, per layer; the LM head separately."""
    d, q, kv = n["hidden_size"], n["num_attention_heads"] * n["hd"], n["kv"] * n["hd"]
    inter = n["intermediate_size"]
    return [("q_proj", q, d), ("k_proj", kv, d), ("v_proj", kv, d), ("o_proj", d, q),
            ("gate_proj", inter, d), ("up_proj", inter, d), ("down_proj", d, inter)]


def _layer_numbers(n):
    return sum(rows * cols for _, rows, cols in _matrices(n))


def forward_flops(config, batch, new_tokens, past_len):
    n = _model(config)
    b, t, p = _whole(batch, "batch", 1), _whole(new_tokens, "new_tokens", 1), _whole(past_len, "past_len", 0)
    macs = b * t * n["num_hidden_layers"] * _layer_numbers(n)
    first, last = p + 1, p + t  # keys seen by the first and the last new token
    keys = (first + last) * t // 2
    macs += b * n["num_hidden_layers"] * n["num_attention_heads"] * keys * n["hd"] * 2
    macs += b * n["vocab_size"] * n["hidden_size"]
    return macs * 2


def _dtype(n):
    for place in (n["lm"], n["top"]):
        for key in ("dtype", "torch_dtype"):
            if place.get(key):
                dt = getattr(torch, str(place[key]).replace("torch.", ""), None)
                if not isinstance(dt, torch.dtype):
                    raise ValueError(f"unknown dtype {place[key]!r}")
                return dt.itemsize
    raise ValueError("config has no dtype (torch_dtype); give weight_bytes_per_elem")


def _weights_and_token(n, weight_bytes_per_elem, kv_bytes_per_elem):
    wb = _dtype(n) if weight_bytes_per_elem is None else _whole(weight_bytes_per_elem, "weight_bytes_per_elem", 1)
    kb = wb if kv_bytes_per_elem is None else _whole(kv_bytes_per_elem, "kv_bytes_per_elem", 1)
    numbers = n["num_hidden_layers"] * _layer_numbers(n) + n["vocab_size"] * n["hidden_size"]
    return numbers * wb, n["num_hidden_layers"] * n["kv"] * n["hd"] * 2 * kb


def forward_bytes(config, batch, new_tokens, past_len, weight_bytes_per_elem=None, kv_bytes_per_elem=None):
    n = _model(config)
    b, t, p = _whole(batch, "batch", 1), _whole(new_tokens, "new_tokens", 1), _whole(past_len, "past_len", 0)
    weights, token = _weights_and_token(n, weight_bytes_per_elem, kv_bytes_per_elem)
    return weights + token * b * p + token * b * t


def arithmetic_intensity(config, batch, new_tokens, past_len, weight_bytes_per_elem=None, kv_bytes_per_elem=None):
    moved = forward_bytes(config, batch, new_tokens, past_len, weight_bytes_per_elem, kv_bytes_per_elem)
    return Fraction(forward_flops(config, batch, new_tokens, past_len)) / moved


def ridge_point(peak_flops, bandwidth):
    return _peak(peak_flops, "peak_flops") / _peak(bandwidth, "bandwidth")


def roofline_time(config, batch, new_tokens, past_len, peak_flops, bandwidth,
                  weight_bytes_per_elem=None, kv_bytes_per_elem=None):
    peak, bw = _peak(peak_flops, "peak_flops"), _peak(bandwidth, "bandwidth")
    a = forward_flops(config, batch, new_tokens, past_len) / peak
    m = forward_bytes(config, batch, new_tokens, past_len, weight_bytes_per_elem, kv_bytes_per_elem) / bw
    return a if a >= m else m


def decode_crossover_batch(config, past_len, peak_flops, bandwidth, weight_bytes_per_elem=None, kv_bytes_per_elem=None):
    peak, bw = _peak(peak_flops, "peak_flops"), _peak(bandwidth, "bandwidth")
    p = _whole(past_len, "past_len", 0)
    n = _model(config)
    weights, token = _weights_and_token(n, weight_bytes_per_elem, kv_bytes_per_elem)

    def compute_bound(b):
        return forward_flops(config, b, 1, p) * bw >= (weights + token * b * (p + 1)) * peak

    # Both sides are linear in the batch: if one more sequence adds no more compute than memory time, never.
    if (forward_flops(config, 2, 1, p) - forward_flops(config, 1, 1, p)) * bw <= token * (p + 1) * peak:
        return None
    hi = 1
    while not compute_bound(hi):
        hi *= 2
    lo = hi // 2  # compute_bound(lo) is false, or lo == 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if compute_bound(mid):
            hi = mid
        else:
            lo = mid
    return hi
