"""Kata 02 — position and mask offsets (reference solution).

Shapes: B batch, H heads, T new tokens, P cached (past) tokens, S = P + T, D head width.
Cache tensors are (B, H, S, D); hidden states are (B, T, d_model).
"""
from __future__ import annotations

import math
import operator

import torch
from torch import nn

from grader.nn import apply_rope


def _length(name: str, value) -> int:
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected a non-negative int, got {value!r}") from None
    if n < 0:
        raise ValueError(f"{name}: expected a non-negative int, got {n}")
    return n


def position_ids(past_len: int, new_len: int, device=None) -> torch.Tensor:
    """Positions of ``new_len`` tokens that follow ``past_len`` cached ones: LongTensor (T,).

    The first new token sits at the cache position ``past_len``, not at 0.
    Negative lengths raise ValueError naming the argument.
    """
    past_len, new_len = _length("past_len", past_len), _length("new_len", new_len)
    return torch.arange(past_len, past_len + new_len, device=device)  # (T,)


def causal_mask(past_len: int, new_len: int, device=None) -> torch.Tensor:
    """Which keys each new token may see: BoolTensor (T, P + T), True = may attend.

    Row i is the new token at position ``past_len + i``; it sees columns 0 … past_len + i.
    Negative lengths raise ValueError naming the argument.
    """
    past_len, new_len = _length("past_len", past_len), _length("new_len", new_len)
    rows = torch.arange(new_len, device=device)[:, None] + past_len  # (T, 1): row i sits at past_len + i
    cols = torch.arange(past_len + new_len, device=device)[None, :]  # (1, S)
    return cols <= rows  # (T, S)


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


class RopeAttention(nn.Module):
    """Multi-head causal self-attention with rotary positions and a KV cache."""

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

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def forward(self, x: torch.Tensor, cache=None):
        """x (B, T, d_model) -> (out (B, T, d_model), (K, V) each (B, H, P + T, D)).

        ``cache`` is None or the (K, V) a previous call returned, keys already rotated.
        T may be anything from 1 up: a prefill, a chunk of a long prompt, or a decode step.
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: expected (batch, seq, {self.d_model}), got {got}")
        B, T, _ = x.shape
        _expect_cache(cache, B, self.n_heads, self.head_dim, x.dtype)
        past = 0 if cache is None else cache[0].shape[2]  # the cache position
        pos = position_ids(past, T, device=x.device)  # (T,)
        q = apply_rope(self._heads(self.wq(x)), pos, self.rope_base)  # (B, H, T, D)
        # Why rotate before storing: a cached key is never recomputed, so it must carry its position already.
        k = apply_rope(self._heads(self.wk(x)), pos, self.rope_base)  # (B, H, T, D)
        v = self._heads(self.wv(x))  # (B, H, T, D)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)  # (B, H, S, D)
            v = torch.cat([cache[1], v], dim=2)  # (B, H, S, D)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, S)
        scores = scores.masked_fill(~causal_mask(past, T, device=x.device), float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v  # (B, H, T, D)
        out = out.transpose(1, 2).reshape(B, T, self.d_model)  # (B, T, d_model)
        return self.wo(out), (k, v)
