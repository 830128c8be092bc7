"""Kata 02, written from its README: operator.index validation (numpy ints accepted, bools and floats refused), the mask by comparing aranges, SDPA with that boolean mask, positions from an arange shifted by the cache length.
"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from grader.nn import apply_rope


def _length(name, value):
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a non-negative int, got the bool {value}")
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected a non-negative int, got {value!r} ({type(value).__name__})") from None
    if n < 0:
        raise ValueError(f"{name}: expected a non-negative int, got {n}")
    return n


def position_ids(past_len, new_len, device=None):
    p = _length("past_len", past_len)
    t = _length("new_len", new_len)
    return torch.arange(t, dtype=torch.long, device=device) + p


def causal_mask(past_len, new_len, device=None):
    p = _length("past_len", past_len)
    t = _length("new_len", new_len)
    rows = torch.arange(p, p + t, device=device)
    cols = torch.arange(p + t, device=device)
    return cols[None, :] <= rows[:, None]


def _describe(obj):
    return f"a tensor of shape {tuple(obj.shape)}" if isinstance(obj, torch.Tensor) else type(obj).__name__


class RopeAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, rope_base: float = 10000.0):
        super().__init__()
        if n_heads <= 0 or d_model <= 0 or d_model % n_heads or (d_model // n_heads) % 2:
            raise ValueError(f"n_heads: expected a positive divisor of d_model={d_model} leaving an even "
                             f"head width (RoPE rotates pairs), got {n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.rope_base = rope_base
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def _past(self, x, cache):
        if cache is None:
            return 0
        if not isinstance(cache, (tuple, list)) or len(cache) != 2:
            raise ValueError(f"cache: expected None or a pair (K, V), got {_describe(cache)}")
        K, V = cache
        B = x.shape[0]
        for label, t in (("K", K), ("V", V)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(f"cache: expected {label} as a 4-D tensor (B, H, P, D), got {_describe(t)}")
            if (t.shape[0], t.shape[1], t.shape[3]) != (B, self.n_heads, self.head_dim):
                raise ValueError(f"cache: expected {label} of shape ({B}, {self.n_heads}, P, {self.head_dim}), "
                                 f"got {tuple(t.shape)}")
            if t.dtype != x.dtype or t.device != x.device:
                raise ValueError(f"cache: expected {label} in {x.dtype} on {x.device} like x, got {t.dtype} on {t.device}")
        if K.shape != V.shape:
            raise ValueError(f"cache: expected K and V of one shape, got {tuple(K.shape)} and {tuple(V.shape)}")
        return K.shape[2]

    def forward(self, x, cache=None):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[2] != self.d_model or x.shape[1] < 1:
            raise ValueError(f"x: expected a tensor (batch, seq >= 1, {self.d_model}), got {_describe(x)}")
        past = self._past(x, cache)
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        pos = position_ids(past, T, device=x.device)
        q = self.wq(x).view(B, T, H, D).transpose(1, 2)
        k = self.wk(x).view(B, T, H, D).transpose(1, 2)
        v = self.wv(x).view(B, T, H, D).transpose(1, 2)
        q = apply_rope(q, pos, self.rope_base)
        k = apply_rope(k, pos, self.rope_base)
        if cache is None:
            K, V = k, v.contiguous()
        else:
            K, V = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
        out = F.scaled_dot_product_attention(q, K, V, attn_mask=causal_mask(past, T, device=x.device))
        return self.wo(out.transpose(1, 2).reshape(B, T, H * D)), (K, V)
