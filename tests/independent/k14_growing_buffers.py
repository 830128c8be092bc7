"""Kata 14 written from the README alone: host copies in preallocated buffers that double when full
(the new tokens copied into place with copy_), host_keys as views of them; the swap done through the
paged cache's public API only (gather out, reserve + write back in), the pool a dict of block tensors."""
from __future__ import annotations

import torch

from grader.paged import OutOfBlocksError, PagedKVCache


def _as_device(x, what):
    try:
        return torch.device(x)
    except Exception:
        raise ValueError(f"{what} must be something torch.device accepts; got {x!r}") from None


def _pinning(flag) -> bool:
    if flag not in (None, True, False) or isinstance(flag, int) and not isinstance(flag, bool):
        raise ValueError(f"pin_memory should be None, True or False, not {flag!r}")
    if flag is True and not torch.cuda.is_available():
        raise ValueError("pin_memory=True asks for page-locked memory, which needs CUDA; none is present")
    return torch.cuda.is_available() if flag is None else flag


class OffloadedKVCache:
    def __init__(self, n_layers, device=None, *, offload_device="cpu", pin_memory=None):
        if type(n_layers) is not int or n_layers <= 0:
            raise ValueError(f"n_layers should be a positive int, got {n_layers!r}")
        self.L = n_layers
        self.dev = None if device is None else _as_device(device, "device")
        self.host = _as_device(offload_device, "offload_device")
        self.pin = _pinning(pin_memory)
        self._buf = [None] * n_layers  # per layer: [kbuf, vbuf, length]
        self._counts = dict(h2d_bytes=0, d2h_bytes=0, misses=0)
        self._slots = []  # [(layer, K, V, prefetched?)], at most two
        self._side = None

    @property
    def host_keys(self):
        return [None if b is None else b[0][:, :, :b[2]] for b in self._buf]

    @property
    def host_values(self):
        return [None if b is None else b[1][:, :, :b[2]] for b in self._buf]

    @property
    def stats(self):
        return {**self._counts}

    def seq_len(self, layer=0):
        self._layer_ok(layer)
        return 0 if self._buf[layer] is None else self._buf[layer][2]

    def resident(self):
        return sorted({slot[0] for slot in self._slots})

    def _layer_ok(self, layer):
        if type(layer) is not int or layer < 0 or layer >= self.L:
            raise ValueError(f"layer must be an int in [0, {self.L}), got {layer!r}")

    def _inputs_ok(self, layer, k, v):
        if not torch.is_tensor(k) or k.ndim != 4:
            raise ValueError("k must be a 4-D tensor (B, Hkv, T, D)")
        if not torch.is_tensor(v) or v.ndim != 4:
            raise ValueError("v must be a 4-D tensor (B, Hkv, T, D)")
        if v.shape != k.shape or v.dtype != k.dtype or v.device != k.device:
            raise ValueError(f"v {tuple(v.shape)} {v.dtype} does not match k {tuple(k.shape)} {k.dtype}")
        if self.dev is not None and k.device != self.dev:
            raise ValueError(f"k is on {k.device}, the cache computes on {self.dev}")
        b = self._buf[layer]
        if b is not None:
            kb = b[0]
            if (kb.shape[0], kb.shape[1], kb.shape[3], kb.dtype) != (k.shape[0], k.shape[1], k.shape[3], k.dtype):
                raise ValueError(f"k {tuple(k.shape)} {k.dtype} does not fit layer {layer}: {tuple(kb.shape)} {kb.dtype}")

    def _to_device(self, layer):
        kb, vb, n = self._buf[layer]
        hk, hv = kb[:, :, :n], vb[:, :, :n]
        self._counts["h2d_bytes"] += 2 * hk.numel() * hk.element_size()
        if self._side is None:
            return hk.to(self.dev), hv.to(self.dev)
        default = torch.cuda.current_stream(self.dev)
        self._side.wait_stream(default)
        with torch.cuda.stream(self._side):
            dk, dv = hk.to(self.dev, non_blocking=True), hv.to(self.dev, non_blocking=True)
        dk.record_stream(default)
        dv.record_stream(default)
        return dk, dv

    def _append_host(self, layer, k, v):
        B, H, T, D = k.shape
        if self._buf[layer] is None:
            kb = torch.empty(B, H, max(T, 4), D, dtype=k.dtype, device=self.host, pin_memory=self.pin)
            self._buf[layer] = [kb, torch.empty_like(kb, pin_memory=self.pin), 0]
        kb, vb, n = self._buf[layer]
        if n + T > kb.shape[2]:
            cap = max(2 * kb.shape[2], n + T)
            bigger = [torch.empty(B, H, cap, D, dtype=k.dtype, device=self.host, pin_memory=self.pin) for _ in "kv"]
            bigger[0][:, :, :n].copy_(kb[:, :, :n])
            bigger[1][:, :, :n].copy_(vb[:, :, :n])
            kb, vb = bigger
        kb[:, :, n:n + T].copy_(k)
        vb[:, :, n:n + T].copy_(v)
        self._counts["d2h_bytes"] += 2 * k.numel() * k.element_size()
        self._buf[layer] = [kb, vb, n + T]

    def update(self, layer, k, v):
        self._layer_ok(layer)
        self._inputs_ok(layer, k, v)
        if self.dev is None:
            self.dev = k.device
        if self.dev.type == "cuda" and self._side is None:
            self._side = torch.cuda.Stream(self.dev)
        ready = [s for s in self._slots if s[0] == layer and s[3]]
        self._slots = []
        if ready:
            old_k, old_v = ready[0][1], ready[0][2]
            if self._side is not None:
                torch.cuda.current_stream(self.dev).wait_stream(self._side)
        elif self._buf[layer] is not None:
            self._counts["misses"] += 1
            old_k, old_v = self._to_device(layer)
        else:
            old_k = old_v = None
        K = k if old_k is None else torch.cat((old_k, k), 2)
        V = v if old_v is None else torch.cat((old_v, v), 2)
        self._append_host(layer, k, v)
        self._slots.append((layer, K, V, False))
        nxt = layer + 1 if layer + 1 < self.L else 0
        if self._buf[nxt] is not None:
            dk, dv = self._to_device(nxt)
            self._slots = [s for s in self._slots if s[0] != nxt] + [(nxt, dk, dv, True)]
        return K, V


class OutOfHostBlocksError(RuntimeError):
    pass


class HostBlockPool:
    def __init__(self, num_blocks, block_size, n_layers, n_kv_heads, head_dim, dtype=torch.float32, pin_memory=None):
        for name, x in dict(num_blocks=num_blocks, block_size=block_size, n_layers=n_layers, n_kv_heads=n_kv_heads,
                            head_dim=head_dim).items():
            if type(x) is not int or x < 1:
                raise ValueError(f"{name} should be an int of at least 1, got {x!r}")
        if not isinstance(dtype, torch.dtype) or not torch.empty(0, dtype=dtype).is_floating_point():
            raise ValueError(f"dtype should be a floating point torch.dtype, got {dtype!r}")
        self.pin = _pinning(pin_memory)
        self.P, self.L, self.H, self.D, self.dtype = block_size, n_layers, n_kv_heads, head_dim, dtype
        self.capacity = num_blocks
        self.blocks = {}  # host block id -> (k, v) of shape (L, H, P, D)
        self.free_ids = set(range(num_blocks))
        self.out = {}  # seq_id -> (host block ids, tokens)

    @property
    def num_free(self):
        return len(self.free_ids)


def is_swapped(pool, seq_id):
    return seq_id in pool.out


def _matches(cache, pool):
    theirs = (cache.block_size, cache.n_layers, cache.n_kv_heads, cache.head_dim, cache.k_pages[0].dtype)
    if theirs != (pool.P, pool.L, pool.H, pool.D, pool.dtype):
        raise ValueError(f"pool geometry {(pool.P, pool.L, pool.H, pool.D, pool.dtype)} differs from the cache's {theirs}")


def _known(cache, seq_id):
    try:
        cache.block_table(seq_id)
        return True
    except ValueError:
        return False


def swap_out(cache, pool, seq_id):
    _matches(cache, pool)
    if seq_id in pool.out or not _known(cache, seq_id):
        raise ValueError(f"seq_id {seq_id!r} is not a resident sequence of the cache")
    n_blocks, S = len(cache.block_table(seq_id)), cache.seq_len(seq_id)
    if n_blocks > len(pool.free_ids):
        raise OutOfHostBlocksError(f"{n_blocks} host blocks needed, {len(pool.free_ids)} free")
    ids = sorted(pool.free_ids)[:n_blocks]
    pad = n_blocks * pool.P - S
    per_layer = []
    for layer in range(pool.L):
        K, V = (x.to("cpu") for x in cache.gather(seq_id, layer))  # (H, S, D)
        K = torch.nn.functional.pad(K, (0, 0, 0, pad)).reshape(pool.H, n_blocks, pool.P, pool.D)
        V = torch.nn.functional.pad(V, (0, 0, 0, pad)).reshape(pool.H, n_blocks, pool.P, pool.D)
        per_layer.append((K, V))
    for j, i in enumerate(ids):
        pool.blocks[i] = (torch.stack([k[:, j] for k, _ in per_layer]), torch.stack([v[:, j] for _, v in per_layer]))
        pool.free_ids.discard(i)
    pool.out[seq_id] = (ids, S)
    cache.free(seq_id)


def swap_in(cache, pool, seq_id):
    _matches(cache, pool)
    if seq_id not in pool.out or _known(cache, seq_id):
        raise ValueError(f"seq_id {seq_id!r} is not a swapped-out sequence, or is in the cache again")
    ids, S = pool.out[seq_id]
    if len(ids) > cache.allocator.num_free:
        raise OutOfBlocksError(f"{len(ids)} device blocks needed, {cache.allocator.num_free} free")
    cache.add_sequence(seq_id)
    slots = cache.reserve(seq_id, S)
    dev = cache.k_pages[0].device
    for layer in range(pool.L):
        K = torch.cat([pool.blocks[i][0][layer] for i in ids], 1)[:, :S] if ids else None  # (H, S, D)
        V = torch.cat([pool.blocks[i][1][layer] for i in ids], 1)[:, :S] if ids else None
        if K is not None:
            cache.write(layer, slots, K.to(dev), V.to(dev))
    for i in ids:
        del pool.blocks[i]
        pool.free_ids.add(i)
    del pool.out[seq_id]
