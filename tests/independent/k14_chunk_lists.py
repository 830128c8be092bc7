"""Kata 14 written from the README alone, another way: each layer's host copy kept as a list of the
chunks written back (host_keys joins them on demand), a fetch copying chunk by chunk and joining on the
device; the swap moves one block at a time through the pages, the pool a stack of free host ids."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grader.paged import OutOfBlocksError, PagedKVCache


@dataclass
class _Layer:
    keys: list = field(default_factory=list)  # chunks (B, Hkv, T_i, D) on the host
    values: list = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(c.shape[2] for c in self.keys)


def _device_or_raise(name, value):
    if isinstance(value, torch.device):
        return value
    if not isinstance(value, str):
        raise ValueError(f"{name}: not a device: {value!r}")
    try:
        return torch.device(value)
    except RuntimeError:
        raise ValueError(f"{name}: not a device: {value!r}") from None


def _pin_flag(pin_memory):
    if pin_memory is None:
        return torch.cuda.is_available()
    if not isinstance(pin_memory, bool):
        raise ValueError(f"pin_memory: expected None or a bool, got {pin_memory!r}")
    if pin_memory and not torch.cuda.is_available():
        raise ValueError("pin_memory: True but CUDA is not available")
    return pin_memory


class OffloadedKVCache:
    def __init__(self, n_layers, device=None, *, offload_device="cpu", pin_memory=None):
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(f"n_layers: expected >= 1, got {n_layers!r}")
        self.n = n_layers
        self.device = device if device is None else _device_or_raise("device", device)
        self.offload = _device_or_raise("offload_device", offload_device)
        self.pinned = _pin_flag(pin_memory)
        self.layers = [_Layer() for _ in range(n_layers)]
        self.h2d = self.d2h = self.miss = 0
        self.current = None  # (layer, K, V) computed now
        self.ahead = None  # (layer, K, V) prefetched for the next update
        self.stream = None

    @property
    def host_keys(self):
        return [torch.cat(l.keys, 2) if l.keys else None for l in self.layers]

    @property
    def host_values(self):
        return [torch.cat(l.values, 2) if l.values else None for l in self.layers]

    @property
    def stats(self):
        return {"h2d_bytes": self.h2d, "d2h_bytes": self.d2h, "misses": self.miss}

    def seq_len(self, layer=0):
        self._check_layer(layer)
        return self.layers[layer].tokens

    def resident(self):
        return sorted({x[0] for x in (self.current, self.ahead) if x is not None})

    def _check_layer(self, layer):
        if isinstance(layer, bool) or not isinstance(layer, int) or not (0 <= layer < self.n):
            raise ValueError(f"layer: {layer!r} is not one of 0..{self.n - 1}")

    def _bring(self, i):
        lay = self.layers[i]
        parts_k, parts_v = [], []
        for ck, cv in zip(lay.keys, lay.values):
            self.h2d += ck.nbytes + cv.nbytes
            if self.stream is not None:
                with torch.cuda.stream(self.stream):
                    parts_k.append(ck.to(self.device, non_blocking=True))
                    parts_v.append(cv.to(self.device, non_blocking=True))
            else:
                parts_k.append(ck.to(self.device))
                parts_v.append(cv.to(self.device))
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                K, V = torch.cat(parts_k, 2), torch.cat(parts_v, 2)
            K.record_stream(torch.cuda.current_stream(self.device))
            V.record_stream(torch.cuda.current_stream(self.device))
            return K, V
        return torch.cat(parts_k, 2), torch.cat(parts_v, 2)

    def update(self, layer, k, v):
        self._check_layer(layer)
        if not isinstance(k, torch.Tensor) or k.dim() != 4:
            raise ValueError("k: expected a (B, Hkv, T, D) tensor")
        if not isinstance(v, torch.Tensor) or v.dim() != 4 or v.shape != k.shape or v.dtype != k.dtype \
                or v.device != k.device:
            raise ValueError("v: expected a tensor like k (same shape, dtype, device)")
        if self.device is not None and k.device != torch.device(self.device):
            raise ValueError(f"k: on {k.device}, expected {self.device}")
        lay = self.layers[layer]
        if lay.keys:
            first = lay.keys[0]
            if first.dtype != k.dtype or first.shape[:2] != k.shape[:2] or first.shape[3] != k.shape[3]:
                raise ValueError(f"k: {tuple(k.shape)} {k.dtype} does not match layer {layer}")
        if self.device is None:
            self.device = k.device
        if self.stream is None and self.device.type == "cuda":
            self.stream = torch.cuda.Stream(self.device)
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        got = self.ahead if self.ahead is not None and self.ahead[0] == layer else None
        self.current = self.ahead = None
        if got is None and lay.keys:
            self.miss += 1
            got = (layer, *self._bring(layer))
        if got is not None and self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
        K = k if got is None else torch.cat([got[1], k], dim=2)
        V = v if got is None else torch.cat([got[2], v], dim=2)
        new_k, new_v = k.to(self.offload).contiguous(), v.to(self.offload).contiguous()
        if self.pinned:
            new_k, new_v = new_k.pin_memory(), new_v.pin_memory()
        lay.keys.append(new_k)
        lay.values.append(new_v)
        self.d2h += new_k.nbytes + new_v.nbytes
        self.current = (layer, K, V)
        following = (layer + 1) % self.n
        if self.layers[following].keys:
            if self.stream is not None:
                self.stream.wait_stream(torch.cuda.current_stream(self.device))
            self.ahead = (following, *self._bring(following))
            if following == layer:
                self.current = None
        return K, V


class OutOfHostBlocksError(RuntimeError):
    pass


class HostBlockPool:
    def __init__(self, num_blocks, block_size, n_layers, n_kv_heads, head_dim, dtype=torch.float32, pin_memory=None):
        sizes = [("num_blocks", num_blocks), ("block_size", block_size), ("n_layers", n_layers),
                 ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)]
        for name, x in sizes:
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise ValueError(f"{name}: expected a positive int, got {x!r}")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"dtype: expected a floating dtype, got {dtype!r}")
        pin = _pin_flag(pin_memory)
        self.shape = (block_size, n_layers, n_kv_heads, head_dim, dtype)
        self.k = torch.zeros(n_layers, num_blocks, n_kv_heads, block_size, head_dim, dtype=dtype, pin_memory=pin)
        self.v = torch.zeros_like(self.k, pin_memory=pin)
        self.stack = list(range(num_blocks - 1, -1, -1))
        self.where = {}

    @property
    def num_free(self):
        return len(self.stack)


def is_swapped(pool, seq_id):
    return seq_id in pool.where


def _check_pool(cache, pool):
    want = (cache.block_size, cache.n_layers, cache.n_kv_heads, cache.head_dim, cache.v_pages[0].dtype)
    if pool.shape != want:
        raise ValueError(f"pool: {pool.shape} does not match the cache {want}")


def _resident(cache, seq_id):
    try:
        cache.seq_len(seq_id)
    except ValueError:
        return False
    return True


def swap_out(cache, pool, seq_id):
    _check_pool(cache, pool)
    if not _resident(cache, seq_id):
        raise ValueError(f"seq_id: {seq_id!r} is not in the cache")
    if is_swapped(pool, seq_id):
        raise ValueError(f"seq_id: {seq_id!r} is swapped out already")
    table = cache.block_table(seq_id)
    if pool.num_free < len(table):
        raise OutOfHostBlocksError(f"need {len(table)} host blocks, have {pool.num_free}")
    taken = []
    for block in table:
        h = pool.stack.pop()
        taken.append(h)
        for layer in range(cache.n_layers):
            pool.k[layer, h] = cache.k_pages[layer][block].cpu()
            pool.v[layer, h] = cache.v_pages[layer][block].cpu()
    pool.where[seq_id] = (taken, cache.seq_len(seq_id))
    cache.free(seq_id)


def swap_in(cache, pool, seq_id):
    _check_pool(cache, pool)
    if not is_swapped(pool, seq_id):
        raise ValueError(f"seq_id: {seq_id!r} is not swapped out")
    if _resident(cache, seq_id):
        raise ValueError(f"seq_id: {seq_id!r} is in the cache")
    taken, length = pool.where[seq_id]
    if cache.allocator.num_free < len(taken):
        raise OutOfBlocksError(f"need {len(taken)} device blocks, have {cache.allocator.num_free}")
    cache.add_sequence(seq_id)
    cache.reserve(seq_id, length)
    for block, h in zip(cache.block_table(seq_id), taken):
        for layer in range(cache.n_layers):
            cache.k_pages[layer][block] = pool.k[layer, h].to(cache.k_pages[layer].device)
            cache.v_pages[layer][block] = pool.v[layer, h].to(cache.v_pages[layer].device)
    for h in reversed(taken):
        pool.stack.append(h)
    del pool.where[seq_id]
