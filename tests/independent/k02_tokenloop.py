"""Kata 02, written from its README: strict int lengths, the mask as the negation of triu(diagonal=past_len + 1), attention as a loop over the new tokens where token i reads the first past_len + i + 1 keys (no mask tensor), a max-subtracted softmax by hand, keys and queries rotated together in one apply_rope call.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from grader.nn import apply_rope


def _nonneg_int(value, name):
    if type(value) is not int:
        raise ValueError(f"{name}: want an int length >= 0, have {value!r}")
    if value < 0:
        raise ValueError(f"{name}: want an int length >= 0, have {value}")
    return value


def position_ids(past_len, new_len, device=None):
    start = _nonneg_int(past_len, "past_len")
    count = _nonneg_int(new_len, "new_len")
    ids = torch.empty(count, dtype=torch.long, device=device)
    if count:
        torch.arange(start, start + count, out=ids)
    return ids


def causal_mask(past_len, new_len, device=None):
    p = _nonneg_int(past_len, "past_len")
    t = _nonneg_int(new_len, "new_len")
    blocked = torch.triu(torch.ones((t, p + t), dtype=torch.bool, device=device), diagonal=p + 1)
    return blocked.logical_not()


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

    def _check(self, x, cache):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"x: want a (batch, seq, d_model) tensor, have {type(x).__name__}")
        if x.ndim != 3 or x.size(2) != self.d_model or x.size(1) < 1:
            raise ValueError(f"x: want (batch, seq >= 1, {self.d_model}), have {tuple(x.shape)}")
        if cache is None:
            return 0
        if not isinstance(cache, tuple) and not isinstance(cache, list):
            raise ValueError(f"cache: want None or (K, V), have {type(cache).__name__}")
        if len(cache) != 2:
            raise ValueError(f"cache: want a pair (K, V), have {len(cache)} items")
        K, V = cache
        if not isinstance(K, torch.Tensor) or not isinstance(V, torch.Tensor):
            raise ValueError(f"cache: want two tensors, have {type(K).__name__} and {type(V).__name__}")
        if K.ndim != 4 or K.shape != V.shape:
            raise ValueError(f"cache: want K and V of one 4-D shape, have {tuple(K.shape)} and {tuple(V.shape)}")
        if K.size(0) != x.size(0):
            raise ValueError(f"cache: want batch {x.size(0)} like x, have {K.size(0)}")
        if K.size(1) != self.n_heads or K.size(3) != self.head_dim:
            raise ValueError(f"cache: want {self.n_heads} heads of width {self.head_dim}, have {tuple(K.shape)}")
        if K.dtype != x.dtype or V.dtype != x.dtype:
            raise ValueError(f"cache: want dtype {x.dtype} like x, have {K.dtype}/{V.dtype}")
        if K.device != x.device or V.device != x.device:
            raise ValueError(f"cache: want device {x.device} like x, have {K.device}/{V.device}")
        return K.size(2)

    def forward(self, x, cache=None):
        past = self._check(x, cache)
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        pos = position_ids(past, T, device=x.device)
        q = self.wq(x).reshape(B, T, H, D).transpose(1, 2)
        k = self.wk(x).reshape(B, T, H, D).transpose(1, 2)
        v = self.wv(x).reshape(B, T, H, D).transpose(1, 2)
        qk = apply_rope(torch.stack((q, k)), pos, self.rope_base)  # (2, B, H, T, D)
        q, k = qk[0], qk[1].clone()
        K = k if cache is None else torch.cat((cache[0], k), dim=2)
        V = v.clone() if cache is None else torch.cat((cache[1], v), dim=2)
        scale = 1.0 / math.sqrt(D)
        rows = []
        for i in range(T):
            seen = past + i + 1
            s = (q[:, :, i:i + 1] @ K[:, :, :seen].transpose(-1, -2)) * scale  # (B, H, 1, seen)
            s = (s - s.max(dim=-1, keepdim=True).values).exp()
            rows.append((s / s.sum(dim=-1, keepdim=True)) @ V[:, :, :seen])
        ctx = torch.cat(rows, dim=2).transpose(1, 2).reshape(B, T, H * D)
        return self.wo(ctx), (K, V)
