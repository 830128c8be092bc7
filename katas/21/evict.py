"""Kata 21 — eviction by attention score.

Fill in the pieces below, then run ``pytest katas/21``. The README explains the idea.
Shapes: B batch, Hq query heads, Hkv KV heads, S tokens, W window queries, T new tokens,
n tokens held, D head width. Cache tensors are (B, Hkv, n, D).
Rotate with ``apply_rope`` from grader.nn; do not write your own RoPE.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from grader.nn import apply_rope


def h2o_keep(scores: torch.Tensor, budget: int, recent: int) -> torch.Tensor:
    """scores (B, Hkv, S) -> long (B, Hkv, min(S, budget)): the last ``recent`` tokens plus the
    ``budget - recent`` best scored of the others, ascending; ties keep the older token."""
    raise NotImplementedError("kata 21: h2o_keep — see README, task 1")


def snapkv_scores(q_window: torch.Tensor, keys: torch.Tensor, kernel_size: int = 5) -> torch.Tensor:
    """q_window (B, Hq, W, D), keys (B, Hkv, S, D), both rotated -> (B, Hkv, S - W): what the last W
    queries pay each earlier key, averaged over the window, pooled, averaged over the group."""
    raise NotImplementedError("kata 21: snapkv_scores — see README, task 2")


def snapkv_keep(scores: torch.Tensor, budget: int, window: int) -> torch.Tensor:
    """scores (B, Hkv, P) of the prefix -> long (B, Hkv, min(P + window, budget)): the ``budget - window``
    best scored prefix tokens plus the window P … P + window - 1, ascending; ties keep the older token."""
    raise NotImplementedError("kata 21: snapkv_keep — see README, task 2")


class ScoredKVCache:
    """One layer's kept tokens per KV head, keys rotated at their true positions, with their scores."""

    def __init__(self, budget: int, recent: int, rope_base: float = 10000.0):
        """Empty cache. ``budget`` >= 1 tokens per head after ``observe``; ``recent`` <= budget never evicted."""
        raise NotImplementedError("kata 21: ScoredKVCache — see README, task 3")

    def reset(self) -> None:
        """Forget every token: an empty cache, tokens_seen 0."""
        raise NotImplementedError("kata 21: ScoredKVCache.reset — see README, task 3")

    def __len__(self) -> int:
        """Tokens held per KV head now."""
        raise NotImplementedError("kata 21: ScoredKVCache.__len__ — see README, task 3")

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append unrotated k_new, v_new (B, Hkv, T, D), keys rotated at positions tokens_seen …; return
        the held (keys, values), each (B, Hkv, n, D). Never evicts; never modifies the inputs."""
        raise NotImplementedError("kata 21: ScoredKVCache.update — see README, task 3")

    def observe(self, probs: torch.Tensor) -> None:
        """Add what the new queries paid, probs (B, Hq, T, n), to each held key's score (summed over the
        queries and the group); then keep ``budget`` tokens per head by h2o_keep."""
        raise NotImplementedError("kata 21: ScoredKVCache.observe — see README, task 3")

    def compress(self, keep: torch.Tensor) -> None:
        """Keep the held tokens ``keep`` (B, Hkv, m) names, distinct per row, in arrival order."""
        raise NotImplementedError("kata 21: ScoredKVCache.compress — see README, task 3")

    def positions(self) -> torch.Tensor:
        """long (B, Hkv, n): each held token's true position, increasing along each row."""
        raise NotImplementedError("kata 21: ScoredKVCache.positions — see README, task 3")

    def scores(self) -> torch.Tensor:
        """float64 (B, Hkv, n): each held token's accumulated score."""
        raise NotImplementedError("kata 21: ScoredKVCache.scores — see README, task 3")
