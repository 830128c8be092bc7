"""Kata 02, written from its README: lengths accepted as any whole number (an integral float like 3.0 counts, a fraction does not), the mask as ones(...).tril(diagonal=past_len), scores and softmax in float64 by matmul, rotary positions passed to apply_rope as one (B, T) row per batch entry.
"""
from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from grader.nn import apply_rope


def _whole(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a whole number >= 0, not {type(value).__name__} {value!r}")
    if isinstance(value, numbers.Integral):
        n = int(value)
    else:
        if not math.isfinite(value) or value != math.floor(value):
            raise ValueError(f"{name} must be a whole number >= 0, not the fraction {value!r}")
        n = int(value)
    if n < 0:
        raise ValueError(f"{name} must be a whole number >= 0, not {n}")
    return n


def position_ids(past_len, new_len, device=None):
    p, t = _whole("past_len", past_len), _whole("new_len", new_len)
    return torch.arange(p, p + t, dtype=torch.int64, device=device)


def causal_mask(past_len, new_len, device=None):
    p, t = _whole("past_len", past_len), _whole("new_len", new_len)
    return torch.ones(t, p + t, dtype=torch.bool, device=device).tril(diagonal=p)


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

    def forward(self, x, cache=None):
        if not torch.is_tensor(x):
            raise ValueError(f"x must be a tensor (batch, seq, {self.d_model}), not {type(x).__name__}")
        if x.ndim != 3 or x.shape[-1] != self.d_model or x.shape[1] == 0:
            raise ValueError(f"x must be (batch, seq >= 1, {self.d_model}), not {tuple(x.shape)}")
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        if cache is None:
            past = 0
        else:
            if not isinstance(cache, (tuple, list)) or len(cache) != 2 \
                    or not all(torch.is_tensor(t) for t in cache):
                raise ValueError(f"cache must be None or a pair of tensors (K, V), not {type(cache).__name__}")
            K0, V0 = cache
            want = f"({B}, {H}, past_len, {D})"
            if K0.ndim != 4 or K0.shape[0] != B or K0.shape[1] != H or K0.shape[3] != D:
                raise ValueError(f"cache K must be {want}, not {tuple(K0.shape)}")
            if V0.shape != K0.shape:
                raise ValueError(f"cache V must have K's shape {tuple(K0.shape)}, not {tuple(V0.shape)}")
            for t in (K0, V0):
                if t.dtype != x.dtype or t.device != x.device:
                    raise ValueError(f"cache must be {x.dtype} on {x.device} like x, not {t.dtype} on {t.device}")
            past = K0.shape[2]
        rows = position_ids(past, T, device=x.device).unsqueeze(0).expand(B, T)
        q = apply_rope(self.wq(x).unflatten(-1, (H, D)).permute(0, 2, 1, 3), rows, self.rope_base)
        k = apply_rope(self.wk(x).unflatten(-1, (H, D)).permute(0, 2, 1, 3), rows, self.rope_base)
        v = self.wv(x).unflatten(-1, (H, D)).permute(0, 2, 1, 3)
        if cache is None:
            K, V = k.contiguous(), v.contiguous()
        else:
            K = torch.cat([cache[0], k], 2)
            V = torch.cat([cache[1], v], 2)
        scores = q.double() @ K.double().transpose(-1, -2) * (1.0 / math.sqrt(D))
        scores = scores.masked_fill(~causal_mask(past, T, device=x.device), -math.inf)
        ctx = scores.softmax(-1) @ V.double()
        ctx = ctx.to(x.dtype).permute(0, 2, 1, 3).reshape(B, T, H * D)
        return self.wo(ctx), (K, V)
