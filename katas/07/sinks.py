"""Kata 07 — a sink-preserving sliding window.

Fill in the pieces below, then run ``pytest katas/07``. The README explains the idea.
Shapes: B batch, H heads, T new tokens, n kept tokens (sinks + window), D head width.
Cache tensors are (B, H, n, D); hidden states are (B, T, d_model).
Rotate with ``apply_rope`` from grader.nn; do not write your own RoPE.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from grader.nn import apply_rope


def kept_positions(seq_len: int, n_sink: int, window: int) -> list[int]:
    """Original indices of the tokens a sink cache holds after ``seq_len`` tokens.

    The first ``n_sink`` tokens plus the last ``window`` tokens (the window does not count the
    sinks); every token while ``seq_len <= n_sink + window``. Sorted ascending. Negative
    ``seq_len`` or ``n_sink``, or ``window < 1``, raise ValueError naming the argument.
    """
    raise NotImplementedError("kata 07: kept_positions — see README, task 1")


class SinkKVCache:
    """The first ``n_sink`` tokens plus the last ``window`` tokens, keys rotated at their slots."""

    def __init__(self, n_sink: int, window: int, rope_base: float = 10000.0):
        """Empty cache: ``len(cache) == 0``, ``tokens_seen == 0``. Bad sizes raise ValueError."""
        raise NotImplementedError("kata 07: SinkKVCache — see README, task 2")

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add unrotated ``k_new``, ``v_new`` (B, H, T, D); return the kept (keys, values), each
        (B, H, n, D), keys rotated at slots 0 … n-1.

        Evicts the oldest non-sink token once more than ``n_sink + window`` are held. T > 1 is
        allowed only while nothing must be evicted, else ValueError (and nothing changes).
        Never modify the inputs in place.
        """
        raise NotImplementedError("kata 07: SinkKVCache.update — see README, task 2")

    def __len__(self) -> int:
        """Tokens kept now (at most n_sink + window)."""
        raise NotImplementedError("kata 07: SinkKVCache.__len__ — see README, task 2")


class SinkAttention(nn.Module):
    """Multi-head attention over a SinkKVCache, RoPE at positions inside the cache."""

    def __init__(self, d_model: int, n_heads: int, n_sink: int, window: int, rope_base: float = 10000.0):
        super().__init__()
        if n_heads <= 0 or d_model <= 0 or d_model % n_heads or (d_model // n_heads) % 2:
            raise ValueError(f"n_heads: expected a divisor of d_model={d_model} leaving an even head width, "
                             f"got {n_heads}")
        if n_sink < 0:
            raise ValueError(f"n_sink: expected an int >= 0, got {n_sink!r}")
        if window < 1:
            raise ValueError(f"window: expected an int >= 1, got {window!r}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.n_sink, self.window, self.rope_base = n_sink, window, rope_base
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, cache: SinkKVCache) -> torch.Tensor:
        """x (B, T, d_model) -> out (B, T, d_model); ``cache`` is updated with the new tokens.

        New token i sits at slot n - T + i of the cache after the update (n = len(cache)); its
        query is rotated there, and it attends to slots 0 … n - T + i. A 2-D x, or one of the
        wrong width, raises ValueError naming x; a ``cache`` that is not a SinkKVCache, naming cache.
        """
        raise NotImplementedError("kata 07: SinkAttention.forward — see README, task 3")
