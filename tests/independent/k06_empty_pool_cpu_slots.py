"""Kata 06 written from its README alone, in choices the README leaves open: ``num_blocks=0`` is an
empty pool, ``reserve`` returns its slots on the CPU, free blocks are handed out highest id first."""
from __future__ import annotations

import torch


class OutOfBlocksError(RuntimeError):
    pass


def _count(value, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}: expected an int >= {least}, got {value!r}")
    return value


class BlockAllocator:
    def __init__(self, num_blocks):
        self._n = _count(num_blocks, "num_blocks", 0)
        self._refs = [0] * self._n

    def _known(self, block) -> int:
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < self._n:
            raise ValueError(f"block: expected a block id in 0 .. {self._n - 1}, got {block!r}")
        return block

    def _held(self, block, what: str) -> int:
        if self._refs[self._known(block)] == 0:
            raise ValueError(f"block: {what} of block {block}, which is free")
        return block

    def allocate(self) -> int:
        for block in range(self._n - 1, -1, -1):
            if self._refs[block] == 0:
                self._refs[block] = 1
                return block
        raise OutOfBlocksError(f"all {self._n} blocks are in use")

    def incref(self, block) -> None:
        self._refs[self._held(block, "incref")] += 1

    def decref(self, block) -> None:
        self._refs[self._held(block, "decref")] -= 1

    def refcount(self, block) -> int:
        return self._refs[self._known(block)]

    @property
    def num_free(self) -> int:
        return self._refs.count(0)


class PagedKVCache:
    def __init__(self, num_blocks, block_size, n_layers, n_kv_heads, head_dim, dtype=torch.float32, device=None):
        for name, value in (("block_size", block_size), ("n_layers", n_layers), ("n_kv_heads", n_kv_heads),
                            ("head_dim", head_dim)):
            _count(value, name, 1)
        self.allocator = BlockAllocator(num_blocks)
        self.block_size, self.n_layers, self.n_kv_heads, self.head_dim = block_size, n_layers, n_kv_heads, head_dim
        shape = (num_blocks, n_kv_heads, block_size, head_dim)
        self.k_pages = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v_pages = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self._seqs: dict = {}  # seq_id -> [length, table]

    def _seq(self, seq_id, name: str = "seq_id"):
        if seq_id not in self._seqs:
            raise ValueError(f"{name}: no sequence {seq_id!r} in the cache")
        return self._seqs[seq_id]

    def _layer(self, layer) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer: expected 0 .. {self.n_layers - 1}, got {layer!r}")
        return layer

    def add_sequence(self, seq_id) -> None:
        if seq_id in self._seqs:
            raise ValueError(f"seq_id: sequence {seq_id!r} exists already")
        self._seqs[seq_id] = [0, []]

    def seq_len(self, seq_id) -> int:
        return self._seq(seq_id)[0]

    def block_table(self, seq_id) -> list:
        return list(self._seq(seq_id)[1])

    def reserve(self, seq_id, n_tokens) -> torch.Tensor:
        entry = self._seq(seq_id)
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 0:
            raise ValueError(f"n_tokens: expected an int >= 0, got {n_tokens!r}")
        length, table, P = entry[0], entry[1], self.block_size
        partial = length % P != 0
        copy = n_tokens > 0 and partial and self.allocator.refcount(table[-1]) > 1
        grow = -(-(length + n_tokens) // P) - len(table)
        if grow + copy > self.allocator.num_free:
            raise OutOfBlocksError(f"reserve needs {grow + copy} blocks, {self.allocator.num_free} are free")
        if copy:
            old, new = table[-1], self.allocator.allocate()
            for pages in (*self.k_pages, *self.v_pages):
                pages[new] = pages[old]
            self.allocator.decref(old)
            table[-1] = new
        table.extend(self.allocator.allocate() for _ in range(grow))
        entry[0] = length + n_tokens
        return torch.tensor([table[p // P] * P + p % P for p in range(length, length + n_tokens)], dtype=torch.int64)

    def write(self, layer, slots, k, v) -> None:
        layer = self._layer(layer)
        if not isinstance(slots, torch.Tensor) or slots.ndim != 1 or slots.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"slots: expected a 1-D int32 or int64 tensor, got {getattr(slots, 'shape', slots)}")
        n = len(slots)
        want = (self.n_kv_heads, n, self.head_dim)
        for name, x in (("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != want:
                raise ValueError(f"{name}: expected shape {want}, got {getattr(x, 'shape', x)}")
        flat = [int(s) for s in slots.tolist()]
        size = self.k_pages[layer].shape[0] * self.block_size
        if any(not 0 <= s < size for s in flat):
            raise ValueError(f"slots: expected slots in 0 .. {size - 1}, got {flat}")
        P = self.block_size
        for i, s in enumerate(flat):
            self.k_pages[layer][s // P, :, s % P] = k[:, i]
            self.v_pages[layer][s // P, :, s % P] = v[:, i]

    def gather(self, seq_id, layer):
        length, table = self._seq(seq_id)
        layer = self._layer(layer)
        parts_k = [self.k_pages[layer][b] for b in table]  # each (H, P, D)
        parts_v = [self.v_pages[layer][b] for b in table]
        if not parts_k:
            empty = self.k_pages[layer].new_zeros((self.n_kv_heads, 0, self.head_dim))
            return empty, empty.clone()
        K = torch.cat(parts_k, dim=1)[:, :length]
        V = torch.cat(parts_v, dim=1)[:, :length]
        return K.clone(), V.clone()

    def fork(self, parent_id, child_id) -> None:
        length, table = self._seq(parent_id, "parent_id")
        if child_id in self._seqs:
            raise ValueError(f"child_id: sequence {child_id!r} exists already")
        for block in table:
            self.allocator.incref(block)
        self._seqs[child_id] = [length, list(table)]

    def free(self, seq_id) -> None:
        _, table = self._seq(seq_id)
        del self._seqs[seq_id]
        for block in table:
            self.allocator.decref(block)
