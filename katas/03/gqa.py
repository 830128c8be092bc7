"""Kata 03 — grouped-query attention.

Fill in the pieces below, then run ``pytest katas/03``. The README explains the idea.
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
    raise NotImplementedError("kata 03: repeat_kv — see README, task 1")


class GQAttention(nn.Module):
    """Causal self-attention with n_q_heads query heads sharing n_kv_heads cached key/value heads, with RoPE."""

    def __init__(self, d_model: int, n_q_heads: int, n_kv_heads: int, head_dim: int | None = None,
                 rope_base: float = 10000.0):
        """wq: d_model -> n_q_heads * head_dim; wk, wv: d_model -> n_kv_heads * head_dim;
        wo: n_q_heads * head_dim -> d_model; all without bias. head_dim defaults to d_model // n_q_heads.
        n_q_heads not divisible by n_kv_heads raises ValueError naming n_kv_heads."""
        super().__init__()
        raise NotImplementedError("kata 03: GQAttention.__init__ — see README, task 2")

    def forward(self, x: torch.Tensor, cache=None):
        """x (B, T, d_model) -> (out (B, T, d_model), (K, V) each (B, Hkv, P + T, D)).

        ``cache`` is None or the (K, V) a previous call returned, keys already rotated. T is any
        number of new tokens; they sit at positions P … P + T - 1. The cache keeps Hkv heads.
        """
        raise NotImplementedError("kata 03: GQAttention.forward — see README, task 2")
