"""Kata 18 — the two regimes: prefill and decode on a roofline (reference solution).

Exact counts for one forward pass of a Llama-family model: the FLOPs it does and the bytes it moves,
their ratio, and what a hardware's two peaks make of them. Counts are Python ints, ratios and times
``fractions.Fraction`` — no float, so nothing rounds, at any size.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction

import torch

FLOPS_PER_MAC = 2  # a multiply-add is two floating-point operations: one multiply, one add


def _count(name: str, value, minimum: int) -> int:
    """``value`` as an int >= ``minimum``, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


def _rate(name: str, value) -> Fraction:
    """A peak (FLOP/s or bytes/s) as an exact Fraction > 0: an int, a Fraction or a finite float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected a number > 0 (int, Fraction or float), got {value!r} ({type(value).__name__})")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")
    exact = Fraction(value)  # exact: a float's binary value, not a rounded decimal
    if exact <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {value!r}")
    return exact


def _field(text: dict, name: str, default: int | None = None) -> int:
    """A positive int field of the config; a missing or null one is ``default``, or an error when there is none."""
    value = text.get(name)
    if value is None and default is None:
        raise ValueError(f"config: the field {name!r} is missing; the counts need it")
    return _count(f"config[{name!r}]", default if value is None else value, 1)


def _dtype_bytes(text: dict, config: dict) -> int:
    """Bytes per number of the config's dtype: the text model's own, else the top level's."""
    for source in (text, config):
        name = source.get("dtype") or source.get("torch_dtype")
        if name:
            dtype = getattr(torch, str(name).removeprefix("torch."), None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"config: torch_dtype: expected a dtype name such as 'bfloat16', got {name!r}")
            return dtype.itemsize
    raise ValueError("config: neither 'torch_dtype' nor 'dtype' is given; pass weight_bytes_per_elem")


def _sizes(config) -> dict:
    """The sizes of a Llama-family config.json: layers, width, heads, KV heads, head width, MLP, vocabulary."""
    if not isinstance(config, dict):
        raise ValueError(f"config: expected a dict (a parsed config.json), got {type(config).__name__}")
    text = config.get("text_config") or config
    if not isinstance(text, dict):
        raise ValueError(f"config: expected 'text_config' to be a dict, got {type(text).__name__}")
    heads = _field(text, "num_attention_heads")
    hidden = _field(text, "hidden_size")
    return {"layers": _field(text, "num_hidden_layers"), "hidden": hidden, "heads": heads,
            "kv_heads": _field(text, "num_key_value_heads", default=heads),
            "head_dim": _field(text, "head_dim", default=hidden // heads),
            "mlp": _field(text, "intermediate_size"), "vocab": _field(text, "vocab_size"),
            "text": text, "config": config}


def _layer_weights(m: dict) -> int:
    """Numbers in one layer's matrices: q and o (heads wide), k and v (KV heads wide), the gated MLP's three."""
    q_and_o = 2 * m["hidden"] * m["heads"] * m["head_dim"]
    k_and_v = 2 * m["hidden"] * m["kv_heads"] * m["head_dim"]
    return q_and_o + k_and_v + 3 * m["hidden"] * m["mlp"]


def _shape(batch, new_tokens, past_len) -> tuple[int, int, int]:
    return _count("batch", batch, 1), _count("new_tokens", new_tokens, 1), _count("past_len", past_len, 0)


def forward_flops(config: dict, batch: int, new_tokens: int, past_len: int) -> int:
    """FLOPs of one forward: ``batch`` sequences, each ``new_tokens`` new tokens after ``past_len`` cached ones."""
    m = _sizes(config)
    b, t, p = _shape(batch, new_tokens, past_len)
    # Every new token goes through every layer's matrices: one multiply-add per weight.
    matrices = b * t * m["layers"] * _layer_weights(m)
    # New token i (0-based) sees the p cached keys and the i + 1 new ones up to itself (the causal mask).
    pairs = t * p + t * (t + 1) // 2
    # Per pair and query head: a score (head_dim multiply-adds) and its share of the weighted sum (as many).
    attention = b * m["layers"] * m["heads"] * pairs * 2 * m["head_dim"]
    # The LM head runs over the last new token of each sequence: only its logits choose the next token.
    lm_head = b * m["hidden"] * m["vocab"]
    return FLOPS_PER_MAC * (matrices + attention + lm_head)


def _elem_bytes(m: dict, weight_bytes_per_elem, kv_bytes_per_elem) -> tuple[int, int]:
    if weight_bytes_per_elem is None:
        weight = _dtype_bytes(m["text"], m["config"])
    else:
        weight = _count("weight_bytes_per_elem", weight_bytes_per_elem, 1)
    kv = weight if kv_bytes_per_elem is None else _count("kv_bytes_per_elem", kv_bytes_per_elem, 1)
    return weight, kv


def _byte_terms(m: dict, weight_bytes_per_elem, kv_bytes_per_elem) -> tuple[int, int]:
    """(bytes of the weights, bytes of one token's K and V over all layers)."""
    weight, kv = _elem_bytes(m, weight_bytes_per_elem, kv_bytes_per_elem)
    # The matrices every token goes through, and the LM head (vocab x hidden); norms and embeddings left out.
    weights = (m["layers"] * _layer_weights(m) + m["vocab"] * m["hidden"]) * weight
    # Per token, all layers: a key and a value of kv_heads x head_dim numbers.
    return weights, 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * kv


def forward_bytes(config: dict, batch: int, new_tokens: int, past_len: int,
                  weight_bytes_per_elem: int | None = None, kv_bytes_per_elem: int | None = None) -> int:
    """Bytes one forward moves to and from memory: the weights read once, the cache read, the new K/V written."""
    m = _sizes(config)
    b, t, p = _shape(batch, new_tokens, past_len)
    weights, kv_per_token = _byte_terms(m, weight_bytes_per_elem, kv_bytes_per_elem)
    cache_read = b * p * kv_per_token
    cache_write = b * t * kv_per_token
    # The weights are read once per forward, however many tokens share them.
    return weights + cache_read + cache_write


def arithmetic_intensity(config: dict, batch: int, new_tokens: int, past_len: int,
                         weight_bytes_per_elem: int | None = None, kv_bytes_per_elem: int | None = None) -> Fraction:
    """FLOPs per byte moved of one forward, exact."""
    flops = forward_flops(config, batch, new_tokens, past_len)
    return Fraction(flops, forward_bytes(config, batch, new_tokens, past_len, weight_bytes_per_elem, kv_bytes_per_elem))


def ridge_point(peak_flops, bandwidth) -> Fraction:
    """The intensity (FLOP/byte) at which a machine's compute time equals its memory time."""
    return _rate("peak_flops", peak_flops) / _rate("bandwidth", bandwidth)


def roofline_time(config: dict, batch: int, new_tokens: int, past_len: int, peak_flops, bandwidth,
                  weight_bytes_per_elem: int | None = None, kv_bytes_per_elem: int | None = None) -> Fraction:
    """Seconds one forward takes at best: the slower of computing its FLOPs and moving its bytes."""
    compute = forward_flops(config, batch, new_tokens, past_len) / _rate("peak_flops", peak_flops)
    memory = forward_bytes(config, batch, new_tokens, past_len, weight_bytes_per_elem,
                           kv_bytes_per_elem) / _rate("bandwidth", bandwidth)
    return max(compute, memory)


def decode_crossover_batch(config: dict, past_len: int, peak_flops, bandwidth,
                           weight_bytes_per_elem: int | None = None, kv_bytes_per_elem: int | None = None) -> int | None:
    """The smallest batch whose decode step (one new token each, ``past_len`` cached) is no longer
    bandwidth-bound, or None when no batch gets there."""
    peak, bw = _rate("peak_flops", peak_flops), _rate("bandwidth", bandwidth)
    one = forward_flops(config, 1, 1, past_len)  # every FLOP of a decode step grows with the batch
    p = int(past_len)  # forward_flops has checked it
    weights, kv_per_token = _byte_terms(_sizes(config), weight_bytes_per_elem, kv_bytes_per_elem)
    per_sequence = (p + 1) * kv_per_token  # each sequence reads its p cached tokens and writes one
    # Compute-bound from batch B on: B * one / peak >= (weights + B * per_sequence) / bw.
    gain = one * bw - per_sequence * peak  # what one more sequence adds to compute time over memory time
    if gain <= 0:  # the cache grows as fast as the FLOPs: batching amortizes the weights, never the cache
        return None
    return math.ceil(weights * peak / gain)  # at least 1: weights, peak and gain are all > 0
