"""Kata 19 — multi-head latent attention.

Fill in the pieces below, then run ``pytest katas/19``. The README explains the idea.
Shapes: B batch, H heads, T new tokens, P cached tokens, S = P + T, C the latent width (kv_lora_rank),
R the shared rotary width (qk_rope_dim), N the no-rotation part of a query/key head (qk_nope_dim),
V the value head width (v_head_dim). The cache holds per token one latent (C) and one rotary key (R):
no head axis anywhere.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from grader.nn import apply_rope


def mla_cache_bytes(n_layers, seq_len, kv_lora_rank, qk_rope_dim, dtype_bytes=2, batch=1):
    """Bytes of a latent cache: per layer, sequence and token one latent (kv_lora_rank) and one rotary key."""
    raise NotImplementedError("kata 19: mla_cache_bytes — see README, task 1")


def gqa_groups(kv_lora_rank, qk_rope_dim, head_dim) -> float:
    """The number of KV heads of width head_dim (K and V each) that hold as many bytes per token as MLA."""
    raise NotImplementedError("kata 19: gqa_groups — see README, task 1")


class LatentKVCache:
    """Per layer, the latents (B, S, C) and the shared rotary keys (B, S, R) of every token seen."""

    def __init__(self):
        pass  # your storage here

    def update(self, layer: int, c_kv: torch.Tensor, k_pe: torch.Tensor):
        """Append T tokens' (B, T, C) latents and (B, T, R) rotary keys; return all (B, S, C), (B, S, R)."""
        raise NotImplementedError("kata 19: LatentKVCache.update — see README, task 2")

    def seq_len(self, layer: int = 0) -> int:
        raise NotImplementedError("kata 19: LatentKVCache.seq_len — see README, task 2")

    def nbytes(self) -> int:
        raise NotImplementedError("kata 19: LatentKVCache.nbytes — see README, task 2")


def split_kv_b(weight: torch.Tensor, n_heads: int, qk_nope_dim: int, v_head_dim: int):
    """kv_b_proj.weight (H * (N + V), C) -> (W_UK (H, N, C), W_UV (H, V, C)); head h owns rows h*(N+V) …"""
    raise NotImplementedError("kata 19: split_kv_b — see README, task 3")


def decode_flops(seq_len, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim, *, absorbed) -> int:
    """FLOPs (2 per multiply-add) of one decode step, one sequence, one layer, from the latents to the
    heads' outputs: what naive and absorbed decode do differently (projections of the new token left out)."""
    raise NotImplementedError("kata 19: decode_flops — see README, task 6")


class MLAttention(nn.Module):
    """Multi-head latent attention with DeepSeek's parameter names; caches one latent and one rotary key a token."""

    def __init__(self, hidden_size: int, n_heads: int, kv_lora_rank: int, qk_nope_dim: int, qk_rope_dim: int,
                 v_head_dim: int, q_lora_rank: int | None = None, rope_base: float = 10000.0, eps: float = 1e-6):
        """q_proj (or q_a_proj, q_a_layernorm, q_b_proj when q_lora_rank is given), kv_a_proj_with_mqa,
        kv_a_layernorm, kv_b_proj, o_proj: the README's table gives every shape."""
        super().__init__()
        raise NotImplementedError("kata 19: MLAttention.__init__ — see README, task 4")

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None, layer: int = 0, *, absorbed: bool = True):
        """x (B, T, hidden), positions (B, T) -> (B, T, hidden). ``cache``: None (attend to these tokens only)
        or an object whose update(layer, c_kv, k_pe) stores them and returns every token's (B, S, C), (B, S, R).
        absorbed=False up-projects every cached latent (task 4); absorbed=True folds kv_b_proj into the
        query and the output (task 5)."""
        raise NotImplementedError("kata 19: MLAttention.forward — see README, tasks 4 and 5")
