"""Kata 14 — an offloaded cache with layer-ahead prefetch, then block swap.

Fill in every function that raises NotImplementedError; the README walks through the tasks.
Shapes: L layers, B batch, Hkv KV heads, T new tokens, S tokens held, D head width; N host blocks,
P block size. Keys and values are (B, Hkv, S, D) as in every kata; a block of the paged cache
(``grader.paged.PagedKVCache``, kata 06's API) holds (Hkv, P, D) of one layer.
"""
from __future__ import annotations

import torch

from grader.paged import OutOfBlocksError, PagedKVCache  # swap_in raises OutOfBlocksError


class OffloadedKVCache:
    """Every layer's keys and values live in host memory; only the layer being computed, and the
    next one on its way, are on the device."""

    def __init__(self, n_layers: int, device=None, *, offload_device="cpu", pin_memory: bool | None = None):
        """``device`` None: the device of the first ``k``. ``pin_memory`` None: pin when CUDA is present.
        Sets ``host_keys`` and ``host_values`` (one entry per layer, None until its first update)."""
        raise NotImplementedError("kata 14: OffloadedKVCache.__init__ — see README, task 1")

    @property
    def stats(self) -> dict:
        """Cumulative ``h2d_bytes``, ``d2h_bytes`` and ``misses``."""
        raise NotImplementedError("kata 14: OffloadedKVCache.stats — see README, task 1")

    def seq_len(self, layer: int = 0) -> int:
        """Tokens held for ``layer``; 0 before its first update."""
        raise NotImplementedError("kata 14: OffloadedKVCache.seq_len — see README, task 1")

    def resident(self) -> list[int]:
        """The layers whose keys and values the cache holds on the device now, sorted."""
        raise NotImplementedError("kata 14: OffloadedKVCache.resident — see README, task 1")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k``, ``v`` (B, Hkv, T, D) to ``layer``; return its whole (K, V) (B, Hkv, S + T, D) on the
        device, valid until the next update. Writes only the new tokens back to the host; starts the copy
        of layer (layer + 1) % L to the device."""
        raise NotImplementedError("kata 14: OffloadedKVCache.update — see README, task 2")


class OutOfHostBlocksError(RuntimeError):
    """The host pool has too few free blocks for a swap-out. Nothing was changed."""


class HostBlockPool:
    """Host blocks the blocks of swapped-out sequences wait in: per layer (N, Hkv, P, D), like the pages."""

    def __init__(self, num_blocks: int, block_size: int, n_layers: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, pin_memory: bool | None = None):
        """Every block free. ValueError naming a size that is not an int >= 1, or a dtype that is not floating."""
        raise NotImplementedError("kata 14: HostBlockPool.__init__ — see README, task 3")

    @property
    def num_free(self) -> int:
        """Host blocks not holding a swapped-out block."""
        raise NotImplementedError("kata 14: HostBlockPool.num_free — see README, task 3")


def is_swapped(pool: HostBlockPool, seq_id) -> bool:
    """Whether ``seq_id``'s blocks wait in ``pool``."""
    raise NotImplementedError("kata 14: is_swapped — see README, task 3")


def swap_out(cache: PagedKVCache, pool: HostBlockPool, seq_id) -> None:
    """Copy every layer of ``seq_id``'s blocks to host blocks, then drop the sequence from the cache (a block
    a fork still uses stays there). OutOfHostBlocksError, changing nothing, when the pool has too few."""
    raise NotImplementedError("kata 14: swap_out — see README, task 3")


def swap_in(cache: PagedKVCache, pool: HostBlockPool, seq_id) -> None:
    """Bring ``seq_id`` back into fresh device blocks and free its host blocks. OutOfBlocksError,
    changing nothing, when the cache has too few free blocks."""
    raise NotImplementedError("kata 14: swap_in — see README, task 3")
