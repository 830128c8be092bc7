"""Kata 03, written from its README: repeat_kv by repeat_interleave, attention by SDPA with enable_gqa (no repeated copies; a manual repeat_kv path for a torch without it) and an explicit boolean offset mask, all sizes validated in __init__.
"""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn

from grader.nn import apply_rope

try:  # enable_gqa arrived in torch 2.5: probe for it once
    F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 2), torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2),
                                   enable_gqa=True)
    _HAS_GQA = True
except TypeError:
    _HAS_GQA = False


def _shape(x):
    return f"a tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else f"a {type(x).__name__}"


def repeat_kv(x, n_rep):
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x: expected a 4-D tensor (B, n_kv, S, D), got {_shape(x)}")
    if isinstance(n_rep, bool) or not isinstance(n_rep, numbers.Integral) or n_rep < 1:
        raise ValueError(f"n_rep: expected an int >= 1, got {n_rep!r}")
    return x.repeat_interleave(int(n_rep), dim=1)


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
    return int(value)


class GQAttention(nn.Module):
    def __init__(self, d_model, n_q_heads, n_kv_heads, head_dim=None, rope_base=10000.0):
        super().__init__()
        d_model = _positive_int("d_model", d_model)
        n_q_heads = _positive_int("n_q_heads", n_q_heads)
        n_kv_heads = _positive_int("n_kv_heads", n_kv_heads)
        if n_q_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads: expected a divisor of n_q_heads={n_q_heads}, got {n_kv_heads}")
        if head_dim is None:
            head_dim = d_model // n_q_heads
        if isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral) or head_dim < 2 or head_dim % 2:
            raise ValueError(f"head_dim: expected a positive even int (RoPE rotates pairs), got {head_dim!r}")
        if not isinstance(rope_base, numbers.Real) or isinstance(rope_base, bool) or not rope_base > 0 \
                or not math.isfinite(rope_base):
            raise ValueError(f"rope_base: expected a positive number, got {rope_base!r}")
        self.d_model, self.n_q_heads, self.n_kv_heads = d_model, n_q_heads, n_kv_heads
        self.head_dim, self.rope_base = int(head_dim), float(rope_base)
        self.n_rep = n_q_heads // n_kv_heads
        self.wq = nn.Linear(d_model, n_q_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_q_heads * self.head_dim, d_model, bias=False)

    def _past_len(self, x, cache):
        if cache is None:
            return 0
        if not isinstance(cache, (tuple, list)) or len(cache) != 2:
            raise ValueError(f"cache: expected None or a pair (K, V), got {_shape(cache)}")
        want = (x.shape[0], self.n_kv_heads, self.head_dim)
        for name, t in zip("KV", cache):
            if not isinstance(t, torch.Tensor) or t.dim() != 4 or (t.shape[0], t.shape[1], t.shape[3]) != want:
                raise ValueError(f"cache: expected {name} of shape ({want[0]}, {want[1]}, S, {want[2]}), got {_shape(t)}")
            if t.dtype != x.dtype or t.device != x.device:
                raise ValueError(f"cache: expected {name} as {x.dtype} on {x.device}, got {t.dtype} on {t.device}")
        if cache[0].shape != cache[1].shape:
            raise ValueError(f"cache: expected K and V of one shape, got {tuple(cache[0].shape)} and {tuple(cache[1].shape)}")
        return cache[0].shape[2]

    def forward(self, x, cache=None):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model or x.shape[1] < 1:
            raise ValueError(f"x: expected (batch, seq >= 1, {self.d_model}), got {_shape(x)}")
        past = self._past_len(x, cache)
        B, T, _ = x.shape
        D = self.head_dim
        pos = torch.arange(past, past + T, device=x.device)
        q = apply_rope(self.wq(x).view(B, T, self.n_q_heads, D).transpose(1, 2), pos, self.rope_base)
        k = apply_rope(self.wk(x).view(B, T, self.n_kv_heads, D).transpose(1, 2), pos, self.rope_base)
        v = self.wv(x).view(B, T, self.n_kv_heads, D).transpose(1, 2)
        if cache is None:
            K, V = k, v.contiguous()
        else:
            K, V = torch.cat((cache[0], k), 2), torch.cat((cache[1], v), 2)
        S = past + T
        mask = torch.arange(S, device=x.device)[None, :] <= pos[:, None]
        if _HAS_GQA:
            out = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, repeat_kv(K, self.n_rep), repeat_kv(V, self.n_rep), attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(B, T, self.n_q_heads * D)), (K, V)
