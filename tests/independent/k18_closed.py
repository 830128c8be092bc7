"""Kata 18, written from its README: one dataclass of sizes read from the config, every count as a
closed formula in the README's symbols, argument checks through operator.index, and the crossover
from the two lines a + b x B (memory) and c x B (compute) solved in integers after clearing
denominators.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from fractions import Fraction

import torch

_ITEMSIZE = {}


def _int(name, value, low):
    if isinstance(value, bool):
        raise ValueError(f"bad {name}: a bool is not a count ({value!r})")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"bad {name}: expected an integer >= {low}, got {value!r}") from None
    if value < low:
        raise ValueError(f"bad {name}: expected an integer >= {low}, got {value}")
    return value


def _rate(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        raise ValueError(f"bad {name}: expected a positive number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"bad {name}: expected a finite number, got {value}")
    if not value > 0:
        raise ValueError(f"bad {name}: expected a positive number, got {value}")
    return Fraction(value)


@dataclass(frozen=True)
class _Sizes:
    L: int
    d: int
    h: int
    g: int
    D: int
    I: int
    V: int
    dtype: str | None

    @property
    def per_layer(self):  # numbers in one layer's matrices
        return 2 * self.d * self.D * (self.h + self.g) + 3 * self.d * self.I

    @property
    def matrices(self):
        return self.L * self.per_layer + self.V * self.d


def _read(config):
    if not isinstance(config, dict):
        raise ValueError(f"bad config: expected a dict, got {type(config).__name__}")
    nested = config.get("text_config")
    if nested is not None and not isinstance(nested, dict):
        raise ValueError("bad config: text_config is not a dict")
    src = nested or config

    def get(key, default=None):
        raw = src.get(key)
        if raw is None:
            if default is None:
                raise ValueError(f"bad config: {key} is missing")
            return default
        return _int(key, raw, 1)

    h, d = get("num_attention_heads"), get("hidden_size")
    dtype = next((s.get(k) for s in (src, config) for k in ("dtype", "torch_dtype") if s.get(k)), None)
    return _Sizes(get("num_hidden_layers"), d, h, get("num_key_value_heads", h), get("head_dim", d // h),
                  get("intermediate_size"), get("vocab_size"), dtype)


def _shape(batch, new_tokens, past_len):
    return _int("batch", batch, 1), _int("new_tokens", new_tokens, 1), _int("past_len", past_len, 0)


def forward_flops(config, batch, new_tokens, past_len):
    s = _read(config)
    B, T, P = _shape(batch, new_tokens, past_len)
    # sum over i < T of (P + i + 1) = T P + T (T + 1) / 2, doubled to keep it an int
    twice_pairs = T * (2 * P + T + 1)
    return 2 * B * (T * s.L * s.per_layer + s.L * s.h * s.D * twice_pairs + s.d * s.V)


def _elem(s, weight_bytes_per_elem, kv_bytes_per_elem):
    if weight_bytes_per_elem is None:
        if s.dtype is None:
            raise ValueError("bad config: no torch_dtype/dtype, and no weight_bytes_per_elem")
        dt = getattr(torch, str(s.dtype).split(".")[-1], None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"bad config: dtype {s.dtype!r} is not a torch dtype")
        w = dt.itemsize
    else:
        w = _int("weight_bytes_per_elem", weight_bytes_per_elem, 1)
    return w, (w if kv_bytes_per_elem is None else _int("kv_bytes_per_elem", kv_bytes_per_elem, 1))


def forward_bytes(config, batch, new_tokens, past_len, weight_bytes_per_elem=None, kv_bytes_per_elem=None):
    s = _read(config)
    B, T, P = _shape(batch, new_tokens, past_len)
    w, kv = _elem(s, weight_bytes_per_elem, kv_bytes_per_elem)
    return s.matrices * w + B * (P + T) * 2 * s.L * s.g * s.D * kv


def arithmetic_intensity(config, batch, new_tokens, past_len, weight_bytes_per_elem=None, kv_bytes_per_elem=None):
    return Fraction(forward_flops(config, batch, new_tokens, past_len),
                    forward_bytes(config, batch, new_tokens, past_len, weight_bytes_per_elem, kv_bytes_per_elem))


def ridge_point(peak_flops, bandwidth):
    return _rate("peak_flops", peak_flops) / _rate("bandwidth", bandwidth)


def roofline_time(config, batch, new_tokens, past_len, peak_flops, bandwidth,
                  weight_bytes_per_elem=None, kv_bytes_per_elem=None):
    pk, bw = _rate("peak_flops", peak_flops), _rate("bandwidth", bandwidth)
    return max(Fraction(forward_flops(config, batch, new_tokens, past_len)) / pk,
               Fraction(forward_bytes(config, batch, new_tokens, past_len, weight_bytes_per_elem, kv_bytes_per_elem)) / bw)


def decode_crossover_batch(config, past_len, peak_flops, bandwidth, weight_bytes_per_elem=None, kv_bytes_per_elem=None):
    pk, bw = _rate("peak_flops", peak_flops), _rate("bandwidth", bandwidth)
    P = _int("past_len", past_len, 0)
    s = _read(config)
    w, kv = _elem(s, weight_bytes_per_elem, kv_bytes_per_elem)
    c = forward_flops(config, 1, 1, P)  # compute per sequence
    a = s.matrices * w  # memory that does not grow
    b = (P + 1) * 2 * s.L * s.g * s.D * kv  # memory per sequence
    # B c / pk >= (a + B b) / bw  <=>  B (c bw - b pk) >= a pk; clear the denominators of pk and bw.
    scale = pk.denominator * bw.denominator
    C, A = c * bw * scale, a * pk * scale
    slope = C - b * pk * scale
    if slope <= 0:
        return None
    A, slope = int(A), int(slope)
    return max(1, -(-A // slope))
