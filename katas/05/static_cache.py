"""Kata 05 — preallocation.

Fill in StaticKVCache below, then run ``pytest katas/05``. The README explains the idea.
Shapes: B batch, Hkv KV heads, T new tokens, L max_len (slots per buffer), D head width.
Each layer owns a key buffer and a value buffer, both (B, Hkv, L, D). Slots 0 … seq_len-1 of a
layer are filled; the slots after them are unfilled (zeros, or stale values after a reset).
"""
from __future__ import annotations

import torch


class CacheFullError(ValueError):
    """An update would write past ``max_len``; the cache was left exactly as it was."""


class StaticKVCache:
    """Keys and values of every layer in buffers of ``max_len`` slots, allocated once."""

    def __init__(self, n_layers: int, batch: int, max_len: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        """Allocate ``keys[l]`` and ``values[l]``, each (B, Hkv, L, D), for every layer ``l``.

        Sizes that are not positive ints raise ValueError naming the argument.
        """
        raise NotImplementedError("kata 05: StaticKVCache — see README, task 1")

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k_new``, ``v_new`` (B, Hkv, T, D) at ``layer``'s position, slots seq_len … seq_len+T-1.

        Returns ``(keys[layer], values[layer])``: the same two buffer objects on every call.
        Inputs of another dtype or device are converted to the buffers' (a ValueError would do too).
        Writing past ``max_len`` raises CacheFullError and writes nothing; bad shapes or a bad
        ``layer`` raise ValueError naming the argument.
        """
        raise NotImplementedError("kata 05: StaticKVCache.update — see README, task 2")

    def seq_len(self, layer: int = 0) -> int:
        """Tokens written to ``layer`` since construction or the last reset."""
        raise NotImplementedError("kata 05: StaticKVCache.seq_len — see README, task 2")

    def attention_mask(self, new_len: int, layer: int = 0) -> torch.Tensor:
        """BoolTensor (new_len, L) for the last ``new_len`` tokens written to ``layer``; True = may attend.

        Row i is the token in slot seq_len - new_len + i: it sees the filled slots up to its own and
        nothing after (later tokens of its chunk, unfilled slots).
        """
        raise NotImplementedError("kata 05: StaticKVCache.attention_mask — see README, task 3")

    def reset(self) -> None:
        """Forget every layer's tokens and keep the buffers; stale values stay hidden behind seq_len."""
        raise NotImplementedError("kata 05: StaticKVCache.reset — see README, task 4")
