"""Kata 01 — appending to the cache.

Fill in the three pieces below, then run ``pytest katas/01``. The README explains the idea.
Shapes: B batch, H heads, T new tokens, S cached tokens (past + new), D head width.
Cache tensors are (B, H, S, D); hidden states are (B, T, d_model).
"""
from __future__ import annotations

import math

import torch
from torch import nn


def append_kv(cache, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Grow ``cache`` = None or (K, V), each (B, H, S, D), by ``k_new``, ``v_new`` (B, H, T, D).

    Returns the grown (K, V), each (B, H, S + T, D). With ``cache=None`` the new entries are the
    whole cache. Bad input (not 4-D, shapes that do not line up) raises ValueError naming the
    argument, what was expected and what was given. Never modify the inputs in place.
    """
    raise NotImplementedError("kata 01: append_kv — see README, task 1")


class DynamicKVCache:
    """One (K, V) pair per layer, grown by concatenation."""

    def __init__(self):
        raise NotImplementedError("kata 01: DynamicKVCache — see README, task 2")

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append to ``layer`` and return that layer's whole cache (K, V)."""
        raise NotImplementedError("kata 01: DynamicKVCache.update — see README, task 2")

    def seq_len(self, layer: int = 0) -> int:
        """Tokens cached in ``layer``; 0 for a layer not seen yet."""
        raise NotImplementedError("kata 01: DynamicKVCache.seq_len — see README, task 2")

    def __len__(self) -> int:
        """Layers held."""
        raise NotImplementedError("kata 01: DynamicKVCache.__len__ — see README, task 2")


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

    def forward(self, x: torch.Tensor, cache=None):
        """x (B, T, d_model) -> (out (B, T, d_model), (K, V) each (B, H, S, D)).

        ``cache=None``: prefill over T tokens with a causal mask. Otherwise one new token
        (T = 1) attends to every cached token and to itself. Project only the new tokens.
        """
        raise NotImplementedError("kata 01: CachedAttention.forward — see README, task 3")
