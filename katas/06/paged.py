"""Kata 06 — paged block tables with copy-on-write.

Fill in the two classes below, then run ``pytest katas/06``. The README explains the idea.
Shapes: N blocks, P block size (tokens per block), H KV heads, D head width, T new tokens,
S tokens of one sequence. Pages are per-layer tensors (N, H, P, D); a slot is block * P + offset.
"""
from __future__ import annotations

import torch


class OutOfBlocksError(RuntimeError):
    """No free block is left for what was asked. Nothing was changed."""


class BlockAllocator:
    """Hands out block ids and counts the holders of each. Bookkeeping only: no tensors."""

    def __init__(self, num_blocks: int):
        """``num_blocks`` blocks, all free. ValueError unless it is a positive int."""
        raise NotImplementedError("kata 06: BlockAllocator — see README, task 1")

    def allocate(self) -> int:
        """A free block, now with reference count 1. OutOfBlocksError when none is free."""
        raise NotImplementedError("kata 06: BlockAllocator.allocate — see README, task 1")

    def incref(self, block: int) -> None:
        """One more holder of an allocated ``block``."""
        raise NotImplementedError("kata 06: BlockAllocator.incref — see README, task 1")

    def decref(self, block: int) -> None:
        """One holder fewer; the block is free again at zero. ValueError on a free or unknown block."""
        raise NotImplementedError("kata 06: BlockAllocator.decref — see README, task 1")

    def refcount(self, block: int) -> int:
        """How many holders ``block`` has (0 when free)."""
        raise NotImplementedError("kata 06: BlockAllocator.refcount — see README, task 1")

    @property
    def num_free(self) -> int:
        """Blocks not held by anyone."""
        raise NotImplementedError("kata 06: BlockAllocator.num_free — see README, task 1")


class PagedKVCache:
    """Keys and values of many sequences in fixed-size blocks, one block table per sequence.

    Logical block i of a sequence (its tokens i*P … i*P + P - 1) lives in physical block
    ``block_table(seq)[i]``. Forked sequences share blocks; a shared, partly filled last block
    is copied before it is written (copy-on-write).
    """

    def __init__(self, num_blocks: int, block_size: int, n_layers: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        """Make ``allocator`` (a BlockAllocator) and ``k_pages``, ``v_pages``: one zero tensor
        (N, H, P, D) per layer, allocated once. ValueError on a size that is not a positive int."""
        raise NotImplementedError("kata 06: PagedKVCache — see README, task 2")

    def add_sequence(self, seq_id) -> None:
        """Start an empty sequence. ValueError if ``seq_id`` is already in the cache."""
        raise NotImplementedError("kata 06: PagedKVCache.add_sequence — see README, task 2")

    def reserve(self, seq_id, n_tokens: int) -> torch.Tensor:
        """Room for ``n_tokens`` more tokens; returns their slots, a LongTensor (T,).

        Allocates the blocks needed and first copies a shared, partly filled last block (every
        layer). Atomic: on OutOfBlocksError nothing has changed.
        """
        raise NotImplementedError("kata 06: PagedKVCache.reserve — see README, task 2")

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``, ``v`` (H, T, D) of ``layer`` at ``slots`` (T,)."""
        raise NotImplementedError("kata 06: PagedKVCache.write — see README, task 2")

    def gather(self, seq_id, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's keys and values of ``layer``, each (H, S, D), in token order."""
        raise NotImplementedError("kata 06: PagedKVCache.gather — see README, task 2")

    def fork(self, parent_id, child_id) -> None:
        """A new sequence ``child_id`` that shares every block of ``parent_id``."""
        raise NotImplementedError("kata 06: PagedKVCache.fork — see README, task 2")

    def free(self, seq_id) -> None:
        """Drop a sequence; its blocks go back to the allocator once no table holds them."""
        raise NotImplementedError("kata 06: PagedKVCache.free — see README, task 2")

    def block_table(self, seq_id) -> list[int]:
        """The physical block of each logical block of the sequence (a copy)."""
        raise NotImplementedError("kata 06: PagedKVCache.block_table — see README, task 2")

    def seq_len(self, seq_id) -> int:
        """Tokens reserved for the sequence."""
        raise NotImplementedError("kata 06: PagedKVCache.seq_len — see README, task 2")
