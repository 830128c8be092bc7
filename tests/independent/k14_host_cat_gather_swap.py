"""Kata 14 written from the README alone, another way: each layer's host copy one tensor grown by
torch.cat at every write-back, the device copies kept in one dict {layer: (K, V)}; seq_len of a layer
the cache does not have is 0 (it holds nothing). The swap reads a sequence with gather and writes it
back with reserve + write; the host pool is one tensor of blocks with a sorted free list.
"""
from __future__ import annotations

import torch

from grader.paged import OutOfBlocksError


def _as_device(name, value):
    try:
        return value if isinstance(value, torch.device) else torch.device(value)
    except (RuntimeError, TypeError):
        raise ValueError(f"{name}={value!r} is not a device torch knows") from None


def _pinning(pin_memory):
    if pin_memory is not None and type(pin_memory) is not bool:
        raise ValueError(f"pin_memory must be None, True or False, got {pin_memory!r}")
    if pin_memory and not torch.cuda.is_available():
        raise ValueError("pin_memory=True needs CUDA, which is not available")
    return torch.cuda.is_available() if pin_memory is None else pin_memory


def _nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


class OffloadedKVCache:
    def __init__(self, n_layers, device=None, *, offload_device="cpu", pin_memory=None):
        if type(n_layers) is not int or n_layers < 1:
            raise ValueError(f"n_layers must be an int >= 1, got {n_layers!r}")
        self.L = n_layers
        self.device = None if device is None else _as_device("device", device)
        self.offload_device = _as_device("offload_device", offload_device)
        self.pin = _pinning(pin_memory)
        self.host_keys = [None] * n_layers
        self.host_values = [None] * n_layers
        self.on_device = {}  # layer -> (K, V) on self.device
        self.prefetched = None  # the layer the last update copied ahead, or None
        self.counts = {"h2d_bytes": 0, "d2h_bytes": 0, "misses": 0}
        self.side = None

    @property
    def stats(self):
        return dict(self.counts)

    def seq_len(self, layer=0):
        if type(layer) is not int:
            raise ValueError(f"layer must be an int, got {layer!r}")
        if not 0 <= layer < self.L or self.host_keys[layer] is None:
            return 0  # a layer the cache does not have holds nothing
        return self.host_keys[layer].shape[2]

    def resident(self):
        return sorted(self.on_device)

    def _fetch(self, layer):
        K, V = self.host_keys[layer], self.host_values[layer]
        self.counts["h2d_bytes"] += _nbytes(K, V)
        if self.side is None:
            return K.to(self.device, copy=True), V.to(self.device, copy=True)
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side):
            K, V = K.to(self.device, non_blocking=True), V.to(self.device, non_blocking=True)
        K.record_stream(torch.cuda.current_stream(self.device))
        V.record_stream(torch.cuda.current_stream(self.device))
        return K, V

    def _validate(self, layer, k, v):
        if type(layer) is not int or not 0 <= layer < self.L:
            raise ValueError(f"layer must be an int in [0, {self.L}), got {layer!r}")
        if not torch.is_tensor(k) or k.ndim != 4:
            raise ValueError("k must be a 4-D tensor (B, Hkv, T, D)")
        if not torch.is_tensor(v) or v.shape != k.shape or v.dtype != k.dtype or v.device != k.device:
            raise ValueError("v must be a tensor of k's shape, dtype and device")
        if self.device is not None and k.device != self.device:
            raise ValueError(f"k is on {k.device}, the cache's device is {self.device}")
        held = self.host_keys[layer]
        if held is not None and (held.dtype != k.dtype or held.shape[:2] != k.shape[:2] or held.shape[3] != k.shape[3]):
            raise ValueError(f"k {tuple(k.shape)} {k.dtype} does not fit layer {layer}: {tuple(held.shape)} {held.dtype}")

    def update(self, layer, k, v):
        self._validate(layer, k, v)
        if self.device is None:
            self.device = k.device
        if self.side is None and self.device.type == "cuda":
            self.side = torch.cuda.Stream(self.device)
        kept = self.on_device.get(layer) if self.prefetched == layer else None
        self.on_device, self.prefetched = {}, None  # rule 1: the layer before is done
        if kept is None and self.host_keys[layer] is not None:
            self.counts["misses"] += 1
            kept = self._fetch(layer)
        if kept is not None and self.side is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.side)
        K = k if kept is None else torch.cat([kept[0], k], dim=2)  # (B, Hkv, S + T, D)
        V = v if kept is None else torch.cat([kept[1], v], dim=2)
        new_k, new_v = k.to(self.offload_device, copy=True), v.to(self.offload_device, copy=True)
        self.counts["d2h_bytes"] += _nbytes(new_k, new_v)
        if self.host_keys[layer] is not None:
            new_k = torch.cat([self.host_keys[layer], new_k], dim=2)
            new_v = torch.cat([self.host_values[layer], new_v], dim=2)
        if self.pin:
            new_k, new_v = new_k.pin_memory(), new_v.pin_memory()
        self.host_keys[layer], self.host_values[layer] = new_k, new_v
        self.on_device[layer] = (K, V)
        ahead = (layer + 1) % self.L
        if self.host_keys[ahead] is not None:
            self.on_device[ahead] = self._fetch(ahead)  # with L = 1 this replaces the copy above
            self.prefetched = ahead
        return K, V


class OutOfHostBlocksError(RuntimeError):
    """The host pool has too few free blocks."""


class HostBlockPool:
    def __init__(self, num_blocks, block_size, n_layers, n_kv_heads, head_dim, dtype=torch.float32, pin_memory=None):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size), ("n_layers", n_layers),
                            ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.layout = (block_size, n_layers, n_kv_heads, head_dim, dtype)
        self.blocks = torch.zeros(num_blocks, n_layers, 2, n_kv_heads, block_size, head_dim, dtype=dtype,
                                  pin_memory=_pinning(pin_memory))
        self.free_ids = list(range(num_blocks))
        self.sequences = {}  # seq_id -> (host block ids, length)

    @property
    def num_free(self):
        return len(self.free_ids)


def is_swapped(pool, seq_id):
    return seq_id in pool.sequences


def _fits(cache, pool):
    mine = (cache.block_size, cache.n_layers, cache.n_kv_heads, cache.head_dim, cache.k_pages[0].dtype)
    if pool.layout != mine:
        raise ValueError(f"pool {pool.layout} does not match the cache {mine}")


def _in_cache(cache, seq_id):
    try:
        cache.block_table(seq_id)
    except (ValueError, KeyError):
        return False
    return True


def swap_out(cache, pool, seq_id):
    _fits(cache, pool)
    if not _in_cache(cache, seq_id) or is_swapped(pool, seq_id):
        raise ValueError(f"seq_id {seq_id!r} must be in the cache and not in the pool")
    need, length, size = len(cache.block_table(seq_id)), cache.seq_len(seq_id), cache.block_size
    if need > pool.num_free:
        raise OutOfHostBlocksError(f"{need} host blocks needed, {pool.num_free} free")
    taken, pool.free_ids = pool.free_ids[:need], pool.free_ids[need:]
    for layer in range(cache.n_layers):
        for part, whole in enumerate(cache.gather(seq_id, layer)):  # (Hkv, S, D)
            for j, block in enumerate(taken):
                chunk = whole[:, j * size:(j + 1) * size]
                pool.blocks[block, layer, part, :, :chunk.shape[1]] = chunk.to("cpu")
    pool.sequences[seq_id] = (taken, length)
    cache.free(seq_id)


def swap_in(cache, pool, seq_id):
    _fits(cache, pool)
    if not is_swapped(pool, seq_id) or _in_cache(cache, seq_id):
        raise ValueError(f"seq_id {seq_id!r} must be in the pool and not in the cache")
    taken, length = pool.sequences[seq_id]
    if cache.allocator.num_free < len(taken):
        raise OutOfBlocksError(f"{len(taken)} device blocks needed, {cache.allocator.num_free} free")
    cache.add_sequence(seq_id)
    if length:
        slots = cache.reserve(seq_id, length)
        device = cache.k_pages[0].device
        for layer in range(cache.n_layers):
            host = pool.blocks[taken, layer]  # (blocks, 2, Hkv, size, D)
            whole = host.permute(1, 2, 0, 3, 4).reshape(2, cache.n_kv_heads, -1, cache.head_dim)[:, :, :length]
            cache.write(layer, slots, whole[0].to(device), whole[1].to(device))
    pool.free_ids = sorted(pool.free_ids + taken)
    del pool.sequences[seq_id]
