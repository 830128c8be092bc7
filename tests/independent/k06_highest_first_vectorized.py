"""Kata 06, written from its README: the highest free block id first (a heap), refcounts in a list, slots computed vectorized on the pages' device, gather via index_select, an empty pool accepted, k/v of another dtype refused.

Shapes: N blocks, P block size, H KV heads, D head width, T new tokens, S tokens of a sequence.
Pages are per-layer tensors (N, H, P, D); a slot is block * P + offset.
"""
from __future__ import annotations

import heapq
import math

import torch


class OutOfBlocksError(RuntimeError):
    """The pool has too few free blocks for the request; the cache is as it was."""


def _whole(value) -> bool:
    return type(value) is int


class BlockAllocator:
    def __init__(self, num_blocks: int):
        if not _whole(num_blocks) or num_blocks < 0:
            raise ValueError(f"num_blocks must be an int >= 0 (got {num_blocks!r})")
        self.num_blocks = num_blocks
        self._count = [0] * num_blocks
        self._heap = [-b for b in range(num_blocks)]  # max-heap of free ids
        heapq.heapify(self._heap)

    def _id(self, block) -> int:
        if not _whole(block) or block < 0 or block >= self.num_blocks:
            raise ValueError(f"block must be an id in [0, {self.num_blocks}) (got {block!r})")
        return block

    def allocate(self) -> int:
        if not self._heap:
            raise OutOfBlocksError(f"allocate: every one of the {self.num_blocks} blocks is in use")
        block = -heapq.heappop(self._heap)
        self._count[block] = 1
        return block

    def incref(self, block: int) -> None:
        block = self._id(block)
        if self._count[block] == 0:
            raise ValueError(f"block {block} is not allocated (got incref of a free block)")
        self._count[block] += 1

    def decref(self, block: int) -> None:
        block = self._id(block)
        if self._count[block] == 0:
            raise ValueError(f"block {block} is not allocated (got decref of a free block)")
        self._count[block] -= 1
        if self._count[block] == 0:
            heapq.heappush(self._heap, -block)

    def refcount(self, block: int) -> int:
        return self._count[self._id(block)]

    @property
    def num_free(self) -> int:
        return len(self._heap)


class PagedKVCache:
    def __init__(self, num_blocks: int, block_size: int, n_layers: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        self.allocator = BlockAllocator(num_blocks)  # validates num_blocks
        for name, value in (("block_size", block_size), ("n_layers", n_layers),
                            ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
            if not _whole(value) or value <= 0:
                raise ValueError(f"{name} must be a positive int (got {value!r})")
        self.block_size, self.n_layers, self.n_kv_heads, self.head_dim = block_size, n_layers, n_kv_heads, head_dim
        self.dtype = dtype
        self.k_pages, self.v_pages = [], []
        for _ in range(n_layers):
            self.k_pages.append(torch.zeros(num_blocks, n_kv_heads, block_size, head_dim, dtype=dtype, device=device))
            self.v_pages.append(torch.zeros(num_blocks, n_kv_heads, block_size, head_dim, dtype=dtype, device=device))
        self.device = self.k_pages[0].device
        self._seqs: dict = {}  # seq_id -> [block table, seq_len]

    def _get(self, seq_id, name="seq_id"):
        try:
            return self._seqs[seq_id]
        except (KeyError, TypeError):
            raise ValueError(f"{name} {seq_id!r} is not a sequence of this cache") from None

    def _fresh_id(self, seq_id, name):
        try:
            taken = seq_id in self._seqs
        except TypeError:
            raise ValueError(f"{name} must be hashable (got {type(seq_id).__name__})") from None
        if taken:
            raise ValueError(f"{name} {seq_id!r} is already a sequence of this cache")

    def add_sequence(self, seq_id) -> None:
        self._fresh_id(seq_id, "seq_id")
        self._seqs[seq_id] = [[], 0]

    def seq_len(self, seq_id) -> int:
        return self._get(seq_id)[1]

    def block_table(self, seq_id) -> list[int]:
        return self._get(seq_id)[0].copy()

    def reserve(self, seq_id, n_tokens: int) -> torch.Tensor:
        entry = self._get(seq_id)
        if not _whole(n_tokens) or n_tokens < 0:
            raise ValueError(f"n_tokens must be an int >= 0 (got {n_tokens!r})")
        table, length = entry
        P, alloc = self.block_size, self.allocator
        shared_tail = n_tokens > 0 and length % P > 0 and alloc.refcount(table[-1]) > 1
        grow = math.ceil((length + n_tokens) / P) - len(table)
        if grow + int(shared_tail) > alloc.num_free:
            raise OutOfBlocksError(f"reserve({seq_id!r}, {n_tokens}): {grow + int(shared_tail)} blocks needed, "
                                   f"{alloc.num_free} free")
        if shared_tail:
            src, dst = table[-1], alloc.allocate()
            for pages in (*self.k_pages, *self.v_pages):
                pages[dst] = pages[src]
            alloc.decref(src)
            table[-1] = dst
        table.extend(alloc.allocate() for _ in range(grow))
        entry[1] = length + n_tokens
        pos = torch.arange(length, length + n_tokens, device=self.device)
        blocks = torch.tensor(table, dtype=torch.long, device=self.device)
        if n_tokens == 0:
            return pos  # an empty LongTensor
        return blocks[pos // P] * P + pos % P

    def _layer(self, layer) -> int:
        if not _whole(layer) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be an int in [0, {self.n_layers}) (got {layer!r})")
        return layer

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        layer = self._layer(layer)
        int_dtypes = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
        if not isinstance(slots, torch.Tensor) or slots.ndim != 1 or slots.dtype not in int_dtypes:
            got = (f"shape {tuple(slots.shape)}, dtype {slots.dtype}" if isinstance(slots, torch.Tensor)
                   else type(slots).__name__)
            raise ValueError(f"slots must be a 1-D integer tensor (got {got})")
        T = slots.shape[0]
        slots = slots.to(device=self.device, dtype=torch.long)
        capacity = self.allocator.num_blocks * self.block_size
        if T and (bool((slots < 0).any()) or bool((slots >= capacity).any())):
            raise ValueError(f"slots must lie in [0, {capacity}) (got min {int(slots.min())}, max {int(slots.max())})")
        for name, x in (("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"{name} must be a tensor (n_kv_heads, n_tokens, head_dim) (got {type(x).__name__})")
            if tuple(x.shape) != (self.n_kv_heads, T, self.head_dim):
                raise ValueError(f"{name} must have shape {(self.n_kv_heads, T, self.head_dim)} "
                                 f"(n_kv_heads, n_tokens, head_dim) (got {tuple(x.shape)})")
            if x.dtype != self.dtype:
                raise ValueError(f"{name} must have the pages' dtype {self.dtype} (got {x.dtype})")
        blocks, offsets = slots // self.block_size, slots % self.block_size
        # pages[blocks, :, offsets] is (T, H, D): the advanced indices go first.
        self.k_pages[layer][blocks, :, offsets] = k.to(self.device).transpose(0, 1)
        self.v_pages[layer][blocks, :, offsets] = v.to(self.device).transpose(0, 1)

    def gather(self, seq_id, layer: int):
        table, length = self._get(seq_id)
        layer = self._layer(layer)
        idx = torch.tensor(table, dtype=torch.long, device=self.device)
        out = []
        for pages in (self.k_pages[layer], self.v_pages[layer]):
            picked = pages.index_select(0, idx)  # (n_blocks, H, P, D), a copy
            out.append(picked.permute(1, 0, 2, 3).reshape(self.n_kv_heads, -1, self.head_dim)[:, :length])
        return out[0], out[1]

    def fork(self, parent_id, child_id) -> None:
        table, length = self._get(parent_id, "parent_id")
        self._fresh_id(child_id, "child_id")
        for block in table:
            self.allocator.incref(block)
        self._seqs[child_id] = [list(table), length]

    def free(self, seq_id) -> None:
        table, _ = self._get(seq_id)
        for block in table:
            self.allocator.decref(block)
        del self._seqs[seq_id]
