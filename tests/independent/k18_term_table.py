"""Kata 18, written from its README: each count kept as a table of named terms (per token, per
sequence, per forward) summed at the end; the config read key by key into a plain dict, the dtype
looked up as `torch_dtype` first and named that way when it is missing; the crossover as the ceiling
of one exact Fraction.
"""
from __future__ import annotations

import math
from fractions import Fraction

import torch

REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


def _whole(name, value, least):
    if type(value) is not int or value < least:
        raise ValueError(f"{name} must be an int >= {least}; got {value!r}")
    return value


def _peak(name, value):
    ok = type(value) in (int, float, Fraction) and (type(value) is not float or math.isfinite(value))
    if not ok or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0; got {value!r}")
    return Fraction(value)


def _model(config):
    if type(config) is not dict:
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    lm = config["text_config"] if config.get("text_config") is not None else config
    if type(lm) is not dict:
        raise ValueError(f"config: text_config must be a dict, got {type(lm).__name__}")
    sizes = {}
    for key in REQUIRED:
        if lm.get(key) is None:
            raise ValueError(f"config is missing {key}")
        sizes[key] = _whole(key, lm[key], 1)
    heads = sizes["num_attention_heads"]
    for key, fallback in (("num_key_value_heads", heads), ("head_dim", sizes["hidden_size"] // heads)):
        sizes[key] = fallback if lm.get(key) is None else _whole(key, lm[key], 1)
    sizes["dtype_name"] = None
    for place in (lm, config):
        for key in ("torch_dtype", "dtype"):
            if place.get(key) is not None and sizes["dtype_name"] is None:
                sizes["dtype_name"] = place[key]
    return sizes


def _terms(m):
    """Numbers per matrix of one layer, and of the whole model."""
    d, D = m["hidden_size"], m["head_dim"]
    layer = {"q": d * m["num_attention_heads"] * D, "o": d * m["num_attention_heads"] * D,
             "k": d * m["num_key_value_heads"] * D, "v": d * m["num_key_value_heads"] * D,
             "gate": d * m["intermediate_size"], "up": d * m["intermediate_size"], "down": d * m["intermediate_size"]}
    return layer, m["num_hidden_layers"] * sum(layer.values()) + m["vocab_size"] * d


def forward_flops(config, batch, new_tokens, past_len):
    m = _model(config)
    b, t, p = _whole("batch", batch, 1), _whole("new_tokens", new_tokens, 1), _whole("past_len", past_len, 0)
    layer, _ = _terms(m)
    pairs = t * p + t * (t + 1) // 2  # keys seen by the t new tokens together
    macs = {
        "projections and MLP": b * t * m["num_hidden_layers"] * sum(layer.values()),
        "scores": b * pairs * m["num_hidden_layers"] * m["num_attention_heads"] * m["head_dim"],
        "weighted values": b * pairs * m["num_hidden_layers"] * m["num_attention_heads"] * m["head_dim"],
        "lm head": b * m["hidden_size"] * m["vocab_size"],
    }
    return 2 * sum(macs.values())


def _elements(m, weight_bytes_per_elem, kv_bytes_per_elem):
    if weight_bytes_per_elem is None:
        name = m["dtype_name"]
        if name is None:
            raise ValueError("torch_dtype: missing from config (or give weight_bytes_per_elem)")
        dtype = getattr(torch, str(name).replace("torch.", ""), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"torch_dtype: {name!r} names no torch dtype")
        weight = dtype.itemsize
    else:
        weight = _whole("weight_bytes_per_elem", weight_bytes_per_elem, 1)
    kv = weight if kv_bytes_per_elem is None else _whole("kv_bytes_per_elem", kv_bytes_per_elem, 1)
    return weight, kv


def forward_bytes(config, batch, new_tokens, past_len, weight_bytes_per_elem=None, kv_bytes_per_elem=None):
    m = _model(config)
    b, t, p = _whole("batch", batch, 1), _whole("new_tokens", new_tokens, 1), _whole("past_len", past_len, 0)
    weight, kv = _elements(m, weight_bytes_per_elem, kv_bytes_per_elem)
    _, numbers = _terms(m)
    token = 2 * m["num_hidden_layers"] * m["num_key_value_heads"] * m["head_dim"] * kv
    moved = {"weights": numbers * weight, "cache read": b * p * token, "cache write": b * t * token}
    return sum(moved.values())


def arithmetic_intensity(config, batch, new_tokens, past_len, weight_bytes_per_elem=None, kv_bytes_per_elem=None):
    moved = forward_bytes(config, batch, new_tokens, past_len, weight_bytes_per_elem, kv_bytes_per_elem)
    return Fraction(forward_flops(config, batch, new_tokens, past_len), moved)


def ridge_point(peak_flops, bandwidth):
    return _peak("peak_flops", peak_flops) / _peak("bandwidth", bandwidth)


def roofline_time(config, batch, new_tokens, past_len, peak_flops, bandwidth,
                  weight_bytes_per_elem=None, kv_bytes_per_elem=None):
    peak, bw = _peak("peak_flops", peak_flops), _peak("bandwidth", bandwidth)
    flops = forward_flops(config, batch, new_tokens, past_len)
    moved = forward_bytes(config, batch, new_tokens, past_len, weight_bytes_per_elem, kv_bytes_per_elem)
    return max(flops / peak, moved / bw)


def decode_crossover_batch(config, past_len, peak_flops, bandwidth, weight_bytes_per_elem=None,
                           kv_bytes_per_elem=None):
    peak, bw = _peak("peak_flops", peak_flops), _peak("bandwidth", bandwidth)
    p = _whole("past_len", past_len, 0)
    one = forward_bytes(config, 1, 1, p, weight_bytes_per_elem, kv_bytes_per_elem)
    two = forward_bytes(config, 2, 1, p, weight_bytes_per_elem, kv_bytes_per_elem)
    per_sequence, fixed = two - one, 2 * one - two  # bytes: fixed + B x per_sequence
    flops = forward_flops(config, 1, 1, p)  # compute: B x flops
    gain = flops / peak - per_sequence / bw  # compute time minus memory time one more sequence adds
    if gain <= 0:
        return None
    return max(1, math.ceil((fixed / bw) / gain))
