"""Kata 03 — grouped-query attention (reference solution).

Shapes: B batch, Hq query heads, Hkv key/value heads (Hq = Hkv * n_rep), T new tokens,
P cached tokens, S = P + T, D head width. Cache tensors are (B, Hkv, S, D); hidden states (B, T, d_model).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from grader.nn import apply_rope


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, Hkv, S, D) -> (B, Hkv * n_rep, S, D): KV head h serves query heads h*n_rep … h*n_rep + n_rep - 1.

    The heads are interleaved (k0 k0 k1 k1 for n_rep = 2), as ``repeat_interleave`` on dim 1 does.
    A non-4-D ``x`` or an ``n_rep`` below 1 raises ValueError naming the argument.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x: expected a tensor (batch, n_kv_heads, seq, head_dim), got {got}")
    if isinstance(n_rep, bool) or not isinstance(n_rep, int) or n_rep < 1:
        raise ValueError(f"n_rep: expected an int of at least 1, got {n_rep!r}")
    B, H, S, D = x.shape
    # Why a new axis after the heads: each KV head is copied n_rep times in place, next to itself.
    return x[:, :, None].expand(B, H, n_rep, S, D).reshape(B, H * n_rep, S, D)  # (B, Hkv * n_rep, S, D)


def _expect_cache(cache, batch: int, heads: int, head_dim: int, dtype: torch.dtype) -> None:
    """``cache`` is None or a pair (K, V), each (batch, heads, past_len, head_dim) in ``dtype``."""
    if cache is None:
        return
    pair = isinstance(cache, (tuple, list)) and len(cache) == 2 and all(isinstance(t, torch.Tensor) for t in cache)
    if not pair:
        raise ValueError(f"cache: expected None or the pair (K, V) a previous call returned, got {type(cache).__name__}")
    K, V = cache
    if K.shape != V.shape or K.dim() != 4 or (K.shape[0], K.shape[1], K.shape[3]) != (batch, heads, head_dim) \
            or K.dtype != dtype or V.dtype != dtype:
        raise ValueError(f"cache: expected K and V of shape ({batch}, {heads}, past_len, {head_dim}) in {dtype}, "
                         f"got {tuple(K.shape)} {K.dtype} and {tuple(V.shape)} {V.dtype}")


class GQAttention(nn.Module):
    """Causal self-attention with n_q_heads query heads sharing n_kv_heads cached key/value heads, with RoPE."""

    def __init__(self, d_model: int, n_q_heads: int, n_kv_heads: int, head_dim: int | None = None,
                 rope_base: float = 10000.0):
        """wq: d_model -> n_q_heads * head_dim; wk, wv: d_model -> n_kv_heads * head_dim;
        wo: n_q_heads * head_dim -> d_model; all without bias. head_dim defaults to d_model // n_q_heads.
        n_q_heads not divisible by n_kv_heads raises ValueError naming n_kv_heads."""
        super().__init__()
        if n_q_heads <= 0 or d_model <= 0:
            raise ValueError(f"n_q_heads: expected positive n_q_heads and d_model, got {n_q_heads} and {d_model}")
        if n_kv_heads <= 0 or n_q_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads: expected a positive divisor of n_q_heads={n_q_heads}, got {n_kv_heads}")
        head_dim = d_model // n_q_heads if head_dim is None else head_dim
        if head_dim <= 0 or head_dim % 2:
            raise ValueError(f"head_dim: expected a positive even width (RoPE rotates pairs), got {head_dim}")
        self.d_model, self.n_q_heads, self.n_kv_heads, self.head_dim = d_model, n_q_heads, n_kv_heads, head_dim
        self.n_rep, self.rope_base = n_q_heads // n_kv_heads, rope_base
        self.wq = nn.Linear(d_model, n_q_heads * head_dim, bias=False)
        self.wk = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_q_heads * head_dim, d_model, bias=False)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, heads, self.head_dim).transpose(1, 2)  # (B, heads, T, D)

    def forward(self, x: torch.Tensor, cache=None):
        """x (B, T, d_model) -> (out (B, T, d_model), (K, V) each (B, Hkv, P + T, D)).

        ``cache`` is None or the (K, V) a previous call returned, keys already rotated. T is any
        number of new tokens; they sit at positions P … P + T - 1. The cache keeps Hkv heads.
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: expected (batch, seq, {self.d_model}), got {got}")
        B, T, _ = x.shape
        _expect_cache(cache, B, self.n_kv_heads, self.head_dim, x.dtype)
        past = 0 if cache is None else cache[0].shape[2]  # the cache position
        pos = torch.arange(past, past + T, device=x.device)  # (T,)
        q = apply_rope(self._split(self.wq(x), self.n_q_heads), pos, self.rope_base)  # (B, Hq, T, D)
        k = apply_rope(self._split(self.wk(x), self.n_kv_heads), pos, self.rope_base)  # (B, Hkv, T, D)
        v = self._split(self.wv(x), self.n_kv_heads)  # (B, Hkv, T, D)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)  # (B, Hkv, S, D)
            v = torch.cat([cache[1], v], dim=2)  # (B, Hkv, S, D)
        # Why repeat only here: the cache keeps Hkv heads; the copies live just for this product.
        K, V = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)  # (B, Hq, S, D)
        scores = q @ K.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, Hq, T, S)
        rows = torch.arange(T, device=x.device)[:, None] + past  # (T, 1): new token i sits at past + i
        cols = torch.arange(past + T, device=x.device)[None, :]  # (1, S)
        scores = scores.masked_fill(cols > rows, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ V  # (B, Hq, T, D)
        out = out.transpose(1, 2).reshape(B, T, self.n_q_heads * self.head_dim)  # (B, T, Hq * D)
        return self.wo(out), (k, v)
