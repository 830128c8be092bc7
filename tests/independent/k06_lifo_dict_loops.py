"""Kata 06, written from its README: a LIFO free list (a freed block is the next one handed out), refcounts in a dict, slots computed in a Python loop, gather by a loop over blocks, num_blocks = 0 refused.

Shapes: N blocks, P block size, H KV heads, D head width, T new tokens, S tokens of a sequence.
Pages are per-layer tensors (N, H, P, D); a slot is block * P + offset.
"""
from __future__ import annotations

import torch


class OutOfBlocksError(RuntimeError):
    """Not enough free blocks; nothing was changed."""


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class BlockAllocator:
    def __init__(self, num_blocks: int):
        if not _int(num_blocks) or num_blocks < 1:
            raise ValueError(f"num_blocks: needs a positive int, was given {num_blocks!r}")
        self._total = num_blocks
        # A stack: the top is handed out next, a freed block goes back on top.
        self._stack = list(range(num_blocks - 1, -1, -1))
        self._refs: dict[int, int] = {}  # only allocated blocks appear here

    def _known(self, block) -> int:
        if not _int(block) or not 0 <= block < self._total:
            raise ValueError(f"block: needs a block id in 0 … {self._total - 1}, was given {block!r}")
        return block

    def allocate(self) -> int:
        if not self._stack:
            raise OutOfBlocksError(f"no free block: all {self._total} are held")
        block = self._stack.pop()
        self._refs[block] = 1
        return block

    def incref(self, block: int) -> None:
        block = self._known(block)
        if block not in self._refs:
            raise ValueError(f"block: {block} is free, it cannot gain a holder")
        self._refs[block] += 1

    def decref(self, block: int) -> None:
        block = self._known(block)
        if block not in self._refs:
            raise ValueError(f"block: {block} is already free (double free?)")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            del self._refs[block]
            self._stack.append(block)

    def refcount(self, block: int) -> int:
        return self._refs.get(self._known(block), 0)

    @property
    def num_free(self) -> int:
        return len(self._stack)


class PagedKVCache:
    def __init__(self, num_blocks: int, block_size: int, n_layers: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        for name, val in (("block_size", block_size), ("n_layers", n_layers),
                          ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
            if not _int(val) or val < 1:
                raise ValueError(f"{name}: needs a positive int, was given {val!r}")
        self.allocator = BlockAllocator(num_blocks)
        self.num_blocks, self.block_size, self.n_layers = num_blocks, block_size, n_layers
        self.n_kv_heads, self.head_dim, self.dtype = n_kv_heads, head_dim, dtype
        shape = (num_blocks, n_kv_heads, block_size, head_dim)
        self.k_pages = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v_pages = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.device = self.k_pages[0].device
        self._tables: dict = {}
        self._lens: dict = {}

    # -- sequences ---------------------------------------------------------------------------
    def _seq(self, seq_id, name="seq_id"):
        try:
            known = seq_id in self._tables
        except TypeError:
            known = False
        if not known:
            raise ValueError(f"{name}: no sequence {seq_id!r} in the cache")
        return seq_id

    def _new(self, seq_id, name):
        try:
            hash(seq_id)
        except TypeError:
            raise ValueError(f"{name}: a sequence id must be hashable, was given {type(seq_id).__name__}") from None
        if seq_id in self._tables:
            raise ValueError(f"{name}: sequence {seq_id!r} is already in the cache")

    def add_sequence(self, seq_id) -> None:
        self._new(seq_id, "seq_id")
        self._tables[seq_id] = []
        self._lens[seq_id] = 0

    def seq_len(self, seq_id) -> int:
        return self._lens[self._seq(seq_id)]

    def block_table(self, seq_id) -> list[int]:
        return list(self._tables[self._seq(seq_id)])

    def reserve(self, seq_id, n_tokens: int) -> torch.Tensor:
        self._seq(seq_id)
        if not _int(n_tokens) or n_tokens < 0:
            raise ValueError(f"n_tokens: needs an int >= 0, was given {n_tokens!r}")
        P = self.block_size
        table, length = self._tables[seq_id], self._lens[seq_id]
        copy_last = (n_tokens > 0 and length % P != 0 and self.allocator.refcount(table[-1]) > 1)
        fresh = -(-(length + n_tokens) // P) - len(table)
        if fresh + copy_last > self.allocator.num_free:
            raise OutOfBlocksError(f"seq_id {seq_id!r}: {n_tokens} tokens need {fresh + copy_last} free blocks, "
                                   f"{self.allocator.num_free} are free")
        if copy_last:
            old = table[-1]
            new = self.allocator.allocate()
            for layer in range(self.n_layers):
                self.k_pages[layer][new].copy_(self.k_pages[layer][old])
                self.v_pages[layer][new].copy_(self.v_pages[layer][old])
            self.allocator.decref(old)
            table[-1] = new
        for _ in range(fresh):
            table.append(self.allocator.allocate())
        slots = []
        for p in range(length, length + n_tokens):
            slots.append(table[p // P] * P + p % P)
        self._lens[seq_id] = length + n_tokens
        return torch.tensor(slots, dtype=torch.long)

    def _layer(self, layer) -> int:
        if not _int(layer) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer: needs an int in 0 … {self.n_layers - 1}, was given {layer!r}")
        return layer

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        layer = self._layer(layer)
        if (not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.is_floating_point()
                or slots.is_complex() or slots.dtype == torch.bool):
            desc = (f"a {slots.dim()}-D {slots.dtype} tensor" if isinstance(slots, torch.Tensor)
                    else type(slots).__name__)
            raise ValueError(f"slots: needs a 1-D integer tensor, was given {desc}")
        n = slots.shape[0]
        limit = self.num_blocks * self.block_size
        flat = slots.tolist()
        for s in flat:
            if not 0 <= s < limit:
                raise ValueError(f"slots: every slot must lie in 0 … {limit - 1}, was given {s}")
        for name, x in (("k", k), ("v", v)):
            want = (self.n_kv_heads, n, self.head_dim)
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != want:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name}: needs shape (n_kv_heads, n_tokens, head_dim) = {want}, was given {got}")
        k = k.to(device=self.device, dtype=self.dtype)
        v = v.to(device=self.device, dtype=self.dtype)
        P = self.block_size
        for t, s in enumerate(flat):
            self.k_pages[layer][s // P, :, s % P] = k[:, t]
            self.v_pages[layer][s // P, :, s % P] = v[:, t]

    def gather(self, seq_id, layer: int):
        self._seq(seq_id)
        layer = self._layer(layer)
        P, length = self.block_size, self._lens[seq_id]
        ks, vs = [], []
        for i, block in enumerate(self._tables[seq_id]):
            used = min(P, length - i * P)
            ks.append(self.k_pages[layer][block, :, :used])
            vs.append(self.v_pages[layer][block, :, :used])
        if not ks:
            empty = torch.zeros(self.n_kv_heads, 0, self.head_dim, dtype=self.dtype, device=self.device)
            return empty, empty.clone()
        return torch.cat(ks, dim=1), torch.cat(vs, dim=1)  # cat copies: the caller's tensors

    def fork(self, parent_id, child_id) -> None:
        self._seq(parent_id, "parent_id")
        self._new(child_id, "child_id")
        table = list(self._tables[parent_id])
        for block in table:
            self.allocator.incref(block)
        self._tables[child_id] = table
        self._lens[child_id] = self._lens[parent_id]

    def free(self, seq_id) -> None:
        self._seq(seq_id)
        for block in self._tables.pop(seq_id):
            self.allocator.decref(block)
        del self._lens[seq_id]
