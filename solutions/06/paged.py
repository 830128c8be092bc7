"""Kata 06 — paged block tables with copy-on-write (reference solution).

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
        if not isinstance(num_blocks, int) or num_blocks <= 0:
            raise ValueError(f"num_blocks: expected a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self._refs = [0] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 is handed out first

    def _expect_known(self, block) -> None:
        if not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ValueError(f"block: expected a block id from 0 to {self.num_blocks - 1}, got {block!r}")

    def _expect_held(self, block, what: str) -> None:
        self._expect_known(block)
        if self._refs[block] == 0:
            raise ValueError(f"block: {what} of block {block}, which is free (a double free?)")

    def allocate(self) -> int:
        """A free block, now with reference count 1. OutOfBlocksError when none is free."""
        if not self._free:
            raise OutOfBlocksError(f"allocate: all {self.num_blocks} blocks are in use")
        block = self._free.pop()
        self._refs[block] = 1
        return block

    def incref(self, block: int) -> None:
        """One more holder of an allocated ``block``."""
        self._expect_held(block, "incref")
        self._refs[block] += 1

    def decref(self, block: int) -> None:
        """One holder fewer; the block is free again at zero. ValueError on a free or unknown block."""
        self._expect_held(block, "decref")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free.append(block)

    def refcount(self, block: int) -> int:
        """How many holders ``block`` has (0 when free)."""
        self._expect_known(block)
        return self._refs[block]

    @property
    def num_free(self) -> int:
        """Blocks not held by anyone."""
        return len(self._free)


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
        for name, value in (("block_size", block_size), ("n_layers", n_layers),
                            ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        self.allocator = BlockAllocator(num_blocks)
        self.block_size, self.n_layers, self.n_kv_heads, self.head_dim = block_size, n_layers, n_kv_heads, head_dim
        shape = (num_blocks, n_kv_heads, block_size, head_dim)  # (N, H, P, D)
        self.k_pages = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v_pages = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self._tables: dict = {}  # seq_id -> physical block of each logical block
        self._lens: dict = {}  # seq_id -> tokens reserved

    def _expect_seq(self, seq_id, name: str = "seq_id") -> None:
        if seq_id not in self._tables:
            raise ValueError(f"{name}: expected a sequence in the cache, got {seq_id!r}")

    def _expect_layer(self, layer) -> None:
        if not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer: expected an int from 0 to {self.n_layers - 1}, got {layer!r}")

    def add_sequence(self, seq_id) -> None:
        """Start an empty sequence. ValueError if ``seq_id`` is already in the cache."""
        if seq_id in self._tables:
            raise ValueError(f"seq_id: sequence {seq_id!r} is already in the cache")
        self._tables[seq_id], self._lens[seq_id] = [], 0

    def reserve(self, seq_id, n_tokens: int) -> torch.Tensor:
        """Room for ``n_tokens`` more tokens; returns their slots, a LongTensor (T,).

        Allocates the blocks needed and first copies a shared, partly filled last block (every
        layer). Atomic: on OutOfBlocksError nothing has changed.
        """
        self._expect_seq(seq_id)
        if not isinstance(n_tokens, int) or n_tokens < 0:
            raise ValueError(f"n_tokens: expected an int >= 0, got {n_tokens!r}")
        table, length, P = self._tables[seq_id], self._lens[seq_id], self.block_size
        # Only the last block can be partly filled; writing into it while another table holds it
        # would change that sequence too. A full shared block is never written again: keep sharing.
        copy_last = n_tokens > 0 and length % P > 0 and self.allocator.refcount(table[-1]) > 1
        new_blocks = -(-(length + n_tokens) // P) - len(table)
        # Check before act, so that a failure leaves everything as it was.
        if new_blocks + copy_last > self.allocator.num_free:
            raise OutOfBlocksError(f"reserve: {n_tokens} token(s) for sequence {seq_id!r} need "
                                   f"{new_blocks + copy_last} free block(s), {self.allocator.num_free} left")
        if copy_last:
            shared, fresh = table[-1], self.allocator.allocate()
            for layer in range(self.n_layers):  # the block holds part of every layer's cache
                self.k_pages[layer][fresh] = self.k_pages[layer][shared]
                self.v_pages[layer][fresh] = self.v_pages[layer][shared]
            self.allocator.decref(shared)
            table[-1] = fresh
        table.extend(self.allocator.allocate() for _ in range(new_blocks))
        self._lens[seq_id] = length + n_tokens
        slots = [table[p // P] * P + p % P for p in range(length, length + n_tokens)]  # the README's slot formula
        return torch.tensor(slots, dtype=torch.long)  # (T,) on the CPU: indices from there index the pages too

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``, ``v`` (H, T, D) of ``layer`` at ``slots`` (T,)."""
        self._expect_layer(layer)
        if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.is_floating_point():
            raise ValueError(f"slots: expected a 1-D LongTensor, got {slots!r}")
        T, total = slots.shape[0], self.allocator.num_blocks * self.block_size
        if T and not (0 <= int(slots.min()) and int(slots.max()) < total):
            raise ValueError(f"slots: expected slots from 0 to {total - 1}, got {slots.tolist()}")
        shape = (self.n_kv_heads, T, self.head_dim)
        for name, x in (("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor) or x.shape != shape:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name}: expected (n_kv_heads, len(slots), head_dim) = {shape}, got {got}")
        blocks, offsets = slots // self.block_size, slots % self.block_size  # (T,), (T,)
        pages_k, pages_v = self.k_pages[layer], self.v_pages[layer]
        pages_k[blocks, :, offsets] = k.transpose(0, 1).to(pages_k.dtype)  # (T, H, D) into (N, H, P, D)
        pages_v[blocks, :, offsets] = v.transpose(0, 1).to(pages_v.dtype)  # (T, H, D)

    def gather(self, seq_id, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's keys and values of ``layer``, each (H, S, D), in token order."""
        self._expect_seq(seq_id)
        self._expect_layer(layer)
        table = torch.tensor(self._tables[seq_id], dtype=torch.long, device=self.k_pages[layer].device)  # (n,)
        H, D, S = self.n_kv_heads, self.head_dim, self._lens[seq_id]
        # The table's blocks in order, (n, H, P, D), then their tokens side by side: (H, n * P, D).
        K = self.k_pages[layer].index_select(0, table).transpose(0, 1).reshape(H, -1, D)
        V = self.v_pages[layer].index_select(0, table).transpose(0, 1).reshape(H, -1, D)
        return K[:, :S], V[:, :S]  # the last block may be only partly filled

    def fork(self, parent_id, child_id) -> None:
        """A new sequence ``child_id`` that shares every block of ``parent_id``."""
        self._expect_seq(parent_id, "parent_id")
        if child_id in self._tables:
            raise ValueError(f"child_id: sequence {child_id!r} is already in the cache")
        for block in self._tables[parent_id]:
            self.allocator.incref(block)  # one more table holds it
        self._tables[child_id] = list(self._tables[parent_id])
        self._lens[child_id] = self._lens[parent_id]

    def free(self, seq_id) -> None:
        """Drop a sequence; its blocks go back to the allocator once no table holds them."""
        self._expect_seq(seq_id)
        for block in self._tables.pop(seq_id):
            self.allocator.decref(block)
        del self._lens[seq_id]

    def block_table(self, seq_id) -> list[int]:
        """The physical block of each logical block of the sequence (a copy)."""
        self._expect_seq(seq_id)
        return list(self._tables[seq_id])

    def seq_len(self, seq_id) -> int:
        """Tokens reserved for the sequence."""
        self._expect_seq(seq_id)
        return self._lens[seq_id]
