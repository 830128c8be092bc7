"""Kata 01 — appending to the cache (reference solution).

Shapes: B batch, H heads, T new tokens, S cached tokens (past + new), D head width.
Cache tensors are (B, H, S, D); hidden states are (B, T, d_model).
"""
from __future__ import annotations

import math

import torch
from torch import nn


def _expect_kv(name: str, x) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name}: expected a tensor (batch, heads, seq, head_dim), got {got}")


def append_kv(cache, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Grow ``cache`` = None or (K, V), each (B, H, S, D), by ``k_new``, ``v_new`` (B, H, T, D)."""
    _expect_kv("k_new", k_new)
    _expect_kv("v_new", v_new)
    if k_new.shape != v_new.shape:
        raise ValueError(f"v_new: expected the shape of k_new {tuple(k_new.shape)}, got {tuple(v_new.shape)}")
    if k_new.dtype != v_new.dtype:
        raise ValueError(f"v_new: expected the dtype of k_new {k_new.dtype}, got {v_new.dtype}")
    if cache is None:
        return k_new, v_new
    if not isinstance(cache, (tuple, list)) or len(cache) != 2:
        raise ValueError(f"cache: expected None or a pair (K, V), got {type(cache).__name__}")
    K, V = cache
    _expect_kv("cache keys", K)
    _expect_kv("cache values", V)
    if K.shape != V.shape or K.dtype != V.dtype:
        raise ValueError(f"cache: expected keys and values of one shape and dtype, got {tuple(K.shape)} {K.dtype} "
                         f"and {tuple(V.shape)} {V.dtype}")
    if K.shape[:2] != k_new.shape[:2] or K.shape[3] != k_new.shape[3]:
        raise ValueError(f"k_new: expected (batch, heads, *, head_dim) = {tuple(K.shape[:2])} and {K.shape[3]} "
                         f"to match the cache keys {tuple(K.shape)}, got {tuple(k_new.shape)}")
    if K.dtype != k_new.dtype:
        raise ValueError(f"k_new: expected the cache's dtype {K.dtype}, got {k_new.dtype}")
    # Why dim=2: the sequence axis; batch, heads and head width stay fixed.
    K = torch.cat([K, k_new], dim=2)  # (B, H, S + T, D)
    V = torch.cat([V, v_new], dim=2)  # (B, H, S + T, D)
    return K, V


class DynamicKVCache:
    """One (K, V) pair per layer, grown by concatenation."""

    def __init__(self):
        self._layers: list[tuple[torch.Tensor, torch.Tensor]] = []

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append to ``layer`` and return that layer's whole cache (K, V)."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= len(self._layers):
            raise ValueError(f"layer: expected an int from 0 to {len(self._layers)}, got {layer!r}")
        if layer == len(self._layers):
            self._layers.append(append_kv(None, k_new, v_new))
        else:
            self._layers[layer] = append_kv(self._layers[layer], k_new, v_new)
        return self._layers[layer]

    def seq_len(self, layer: int = 0) -> int:
        """Tokens cached in ``layer``; 0 for a layer not seen yet."""
        return self._layers[layer][0].shape[2] if 0 <= layer < len(self._layers) else 0

    def __len__(self) -> int:
        return len(self._layers)


class CachedAttention(nn.Module):
    """Multi-head causal self-attention that takes and returns its KV cache."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if n_heads <= 0 or d_model <= 0 or d_model % n_heads:
            raise ValueError(f"n_heads: expected a positive divisor of d_model={d_model}, got {n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def forward(self, x: torch.Tensor, cache=None):
        """x (B, T, d_model) -> (out (B, T, d_model), (K, V) each (B, H, S, D))."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: expected (batch, seq, {self.d_model}), got {got}")
        B, T, _ = x.shape
        # Only the new tokens are projected; the query is used once and never stored.
        q = self._heads(self.wq(x))  # (B, H, T, D)
        K, V = append_kv(cache, self._heads(self.wk(x)), self._heads(self.wv(x)))  # (B, H, S, D)
        past = K.shape[2] - T
        scores = q @ K.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, S)
        rows = torch.arange(T, device=x.device)[:, None] + past  # new token i sits at past + i
        cols = torch.arange(K.shape[2], device=x.device)[None, :]
        scores = scores.masked_fill(cols > rows, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ V  # (B, H, T, D)
        out = out.transpose(1, 2).reshape(B, T, self.d_model)  # (B, T, d_model)
        return self.wo(out), (K, V)
