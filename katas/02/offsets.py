"""Kata 02 — position and mask offsets.

Fill in the three pieces below, then run ``pytest katas/02``. The README explains the idea.
Shapes: B batch, H heads, T new tokens, P cached (past) tokens, S = P + T, D head width.
Cache tensors are (B, H, S, D); hidden states are (B, T, d_model).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from grader.nn import apply_rope


def position_ids(past_len: int, new_len: int, device=None) -> torch.Tensor:
    """Positions of ``new_len`` tokens that follow ``past_len`` cached ones: LongTensor (T,).

    The first new token sits at the cache position ``past_len``, not at 0.
    Negative lengths raise ValueError naming the argument.
    """
    raise NotImplementedError("kata 02: position_ids — see README, task 1")


def causal_mask(past_len: int, new_len: int, device=None) -> torch.Tensor:
    """Which keys each new token may see: BoolTensor (T, P + T), True = may attend.

    Row i is the new token at position ``past_len + i``; it sees columns 0 … past_len + i.
    Negative lengths raise ValueError naming the argument.
    """
    raise NotImplementedError("kata 02: causal_mask — see README, task 2")


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

    def forward(self, x: torch.Tensor, cache=None):
        """x (B, T, d_model) -> (out (B, T, d_model), (K, V) each (B, H, P + T, D)).

        ``cache`` is None or the (K, V) a previous call returned, keys already rotated.
        T may be anything from 1 up: a prefill, a chunk of a long prompt, or a decode step.
        """
        raise NotImplementedError("kata 02: RopeAttention.forward — see README, task 3")
