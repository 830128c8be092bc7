"""Kata 20 — a cache per layer type.

Fill in the pieces below, then run ``pytest katas/20``. The README explains the idea.

Shapes: B batch, H heads, T new tokens, S keys returned, D head width (Dk, Dv for a linear state).
Cache tensors are (B, H, S, D); positions are int64 tensors of absolute token indices.
"""
from __future__ import annotations

import torch

KINDS = ("full_attention", "sliding_attention", "chunked_attention", "shared", "linear_attention")
ATTENTION = KINDS[:3]  # the kinds that store keys and values


def hybrid_cache_bytes(layer_types, seq_len: int, *, n_kv_heads, head_dim, window: int, state_bytes: int = 0,
                       dtype_bytes: int = 2, batch: int = 1) -> int:
    """Bytes a hybrid cache holds after ``seq_len`` tokens: a sum over layers by kind (README, task 1)."""
    raise NotImplementedError("kata 20: hybrid_cache_bytes — see README, task 1")


def window_mask(kind: str, q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """(T, S) bool, True where the query at q_pos[i] may attend to the key at k_pos[j] (README, task 2)."""
    raise NotImplementedError("kata 20: window_mask — see README, task 2")


class SlidingLayer:
    """One window layer (sliding or chunked): keeps the last ``window - 1`` tokens between updates."""

    def __init__(self, window: int):
        raise NotImplementedError("kata 20: SlidingLayer — see README, task 2")

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add k, v (B, H, T, D); return the kept tokens and the new ones with their positions (task 2)."""
        raise NotImplementedError("kata 20: SlidingLayer.update — see README, task 2")

    def __len__(self) -> int:
        """Tokens stored now: min(seen, window - 1)."""
        raise NotImplementedError("kata 20: SlidingLayer.__len__ — see README, task 2")

    def nbytes(self) -> int:
        """Bytes of the keys and values stored now (0 before the first update)."""
        raise NotImplementedError("kata 20: SlidingLayer.nbytes — see README, task 2")


class LinearState:
    """A fixed-size recurrent state S (B, H, Dk, Dv): S <- decay * S + k^T v, out = q S (task 4)."""

    def __init__(self):
        raise NotImplementedError("kata 20: LinearState — see README, task 4")

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
        """q, k (B, H, T, Dk), v (B, H, T, Dv), decay (B, H, T) -> out (B, H, T, Dv), token by token."""
        raise NotImplementedError("kata 20: LinearState.step — see README, task 4")

    def nbytes(self) -> int:
        """Bytes of the state (0 before the first step)."""
        raise NotImplementedError("kata 20: LinearState.nbytes — see README, task 4")


class HybridKVCache:
    """One cache for a model whose layers store different things, one entry per layer (task 3)."""

    def __init__(self, layer_types, *, window: int, shared_from: dict[int, int] | None = None):
        raise NotImplementedError("kata 20: HybridKVCache — see README, task 3")

    def reset(self) -> None:
        """Forget every token; the layer types, window and producers stay."""
        raise NotImplementedError("kata 20: HybridKVCache.reset — see README, task 3")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write layer's new k, v; return (K, V, k_pos) the new queries attend to."""
        raise NotImplementedError("kata 20: HybridKVCache.update — see README, task 3")

    def shared(self, layer: int):
        """The (K, V, k_pos) the producer of shared ``layer`` returned on its latest update."""
        raise NotImplementedError("kata 20: HybridKVCache.shared — see README, task 3")

    def state(self, layer: int) -> LinearState:
        """The LinearState of linear ``layer``."""
        raise NotImplementedError("kata 20: HybridKVCache.state — see README, task 3")

    def seq_len(self) -> int:
        """Tokens the request has seen (never what a window layer stores)."""
        raise NotImplementedError("kata 20: HybridKVCache.seq_len — see README, task 3")

    def stored(self, layer: int) -> int:
        """Tokens layer holds: all for full, min(seen, window - 1) for a window, 0 for shared and linear."""
        raise NotImplementedError("kata 20: HybridKVCache.stored — see README, task 3")

    def nbytes(self, layer: int | None = None) -> int:
        """Bytes held by layer's tensors (every layer's when None)."""
        raise NotImplementedError("kata 20: HybridKVCache.nbytes — see README, task 3")