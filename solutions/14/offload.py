"""Kata 14 — an offloaded cache with layer-ahead prefetch, then block swap (reference solution).

Shapes: L layers, B batch, Hkv KV heads, T new tokens, S tokens held, D head width; N host blocks,
P block size. Keys and values are (B, Hkv, S, D) as in every kata; a block of the paged cache
(``grader.paged.PagedKVCache``, kata 06's API) holds (Hkv, P, D) of one layer.
"""
from __future__ import annotations

import torch

from grader.paged import OutOfBlocksError, PagedKVCache


def _device(value, name: str) -> torch.device:
    try:
        return torch.device(value)
    except (TypeError, RuntimeError) as exc:
        raise ValueError(f"{name}: expected a device ('cpu', 'cuda', torch.device), got {value!r}") from exc


def _pin(pin_memory, name: str = "pin_memory") -> bool:
    """The pin_memory argument: None pins when CUDA is present; True needs CUDA."""
    if pin_memory is not None and not isinstance(pin_memory, bool):
        raise ValueError(f"{name}: expected None, True or False, got {pin_memory!r}")
    if pin_memory and not torch.cuda.is_available():
        raise ValueError(f"{name}: True needs CUDA (pinned memory is page-locked for the GPU), and there is none")
    return torch.cuda.is_available() if pin_memory is None else pin_memory


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class OffloadedKVCache:
    """Every layer's keys and values live in host memory; only the layer being computed, and the
    next one on its way, are on the device."""

    def __init__(self, n_layers: int, device=None, *, offload_device="cpu", pin_memory: bool | None = None):
        """``device`` None: the device of the first ``k``. ``pin_memory`` None: pin when CUDA is present."""
        if not isinstance(n_layers, int) or isinstance(n_layers, bool) or n_layers < 1:
            raise ValueError(f"n_layers: expected an int >= 1, got {n_layers!r}")
        self.n_layers = n_layers
        self.device = None if device is None else _device(device, "device")
        self.offload_device = _device(offload_device, "offload_device")
        self.pin_memory = _pin(pin_memory)
        self.host_keys: list = [None] * n_layers  # (B, Hkv, S, D) on offload_device, the authoritative copy
        self.host_values: list = [None] * n_layers
        self._on_device: dict = {}  # layer -> (K, V) on the device: the layer computed now, the next one
        self._ahead = None  # the layer prefetched by the last update
        self._stats = {"h2d_bytes": 0, "d2h_bytes": 0, "misses": 0}
        self._stream = None  # the side stream of the prefetches (CUDA only)

    @property
    def stats(self) -> dict:
        """Cumulative ``h2d_bytes``, ``d2h_bytes`` and ``misses`` (a copy)."""
        return dict(self._stats)

    def seq_len(self, layer: int = 0) -> int:
        """Tokens held for ``layer``; 0 before its first update."""
        self._expect_layer(layer)
        keys = self.host_keys[layer]
        return 0 if keys is None else keys.shape[2]

    def resident(self) -> list[int]:
        """The layers whose keys and values the cache holds on the device now, sorted."""
        return sorted(self._on_device)

    def _expect_layer(self, layer) -> None:
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer: expected an int from 0 to {self.n_layers - 1}, got {layer!r}")

    def _expect_kv(self, layer: int, k, v) -> None:
        for name, x in (("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor) or x.dim() != 4:
                raise ValueError(f"{name}: expected a 4-D tensor (B, Hkv, T, D), got {x!r:.80}")
        if k.shape != v.shape or k.dtype != v.dtype or k.device != v.device:
            raise ValueError(f"v: expected the shape, dtype and device of k {tuple(k.shape)} {k.dtype} {k.device}, "
                             f"got {tuple(v.shape)} {v.dtype} {v.device}")
        if self.device is not None and k.device != self.device:
            raise ValueError(f"k: expected a tensor on the cache's device {self.device}, got one on {k.device}")
        held = self.host_keys[layer]
        if held is not None and (held.shape[:2] != k.shape[:2] or held.shape[3] != k.shape[3] or held.dtype != k.dtype):
            raise ValueError(f"k: layer {layer} holds (B, Hkv, S, D) = {tuple(held.shape)} of {held.dtype}; "
                             f"got {tuple(k.shape)} of {k.dtype}")

    def _fetch(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy ``layer`` from the host to the device (on CUDA: on the side stream, without waiting)."""
        K, V = self.host_keys[layer], self.host_values[layer]
        self._stats["h2d_bytes"] += _nbytes(K, V)
        if self._stream is None:
            return K.to(self.device), V.to(self.device)
        main = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(main)  # what the default stream queued so far (writes included) comes first
        with torch.cuda.stream(self._stream):
            K, V = K.to(self.device, non_blocking=True), V.to(self.device, non_blocking=True)
        K.record_stream(main)  # made on the side stream, used on the default one: keep it until that use is done
        V.record_stream(main)
        return K, V

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k``, ``v`` (B, Hkv, T, D) to ``layer``; return its whole (K, V) (B, Hkv, S + T, D) on the
        device, valid until the next update. Writes only the new tokens back to the host; starts the copy
        of layer (layer + 1) % L to the device."""
        self._expect_layer(layer)
        self._expect_kv(layer, k, v)
        if self.device is None:
            self.device = k.device
        if self._stream is None and self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device)
        mine = self._on_device.get(layer) if self._ahead == layer else None  # prefetched by the update before
        self._on_device.clear()  # the layer before is done: drop its device copy
        self._ahead = None
        if mine is None and self.host_keys[layer] is not None:
            self._stats["misses"] += 1  # not prefetched in time: fetch it now and wait
            mine = self._fetch(layer)
        if mine is not None and self._stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._stream)  # the prefetch has landed
        K = k if mine is None else torch.cat([mine[0], k], dim=2)  # (B, Hkv, S + T, D)
        V = v if mine is None else torch.cat([mine[1], v], dim=2)
        self._write_back(layer, k, v)
        self._on_device[layer] = (K, V)
        nxt = (layer + 1) % self.n_layers  # after the last layer comes the first one of the next forward
        if self.host_keys[nxt] is not None:
            self._on_device[nxt], self._ahead = self._fetch(nxt), nxt  # with L = 1 it replaces step 5's copy
        return K, V

    def _write_back(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append the new tokens to the host copy: only they cross to the host (a blocking copy, so the
        host copy is complete before anything reads it)."""
        new_k = k.to(self.offload_device)  # (B, Hkv, T, D)
        new_v = v.to(self.offload_device)
        self._stats["d2h_bytes"] += _nbytes(new_k, new_v)
        if self.host_keys[layer] is not None:
            new_k = torch.cat([self.host_keys[layer], new_k], dim=2)  # (B, Hkv, S + T, D)
            new_v = torch.cat([self.host_values[layer], new_v], dim=2)
        if self.pin_memory:
            new_k, new_v = new_k.pin_memory(), new_v.pin_memory()
        self.host_keys[layer], self.host_values[layer] = new_k, new_v


class OutOfHostBlocksError(RuntimeError):
    """The host pool has too few free blocks for a swap-out. Nothing was changed."""


class HostBlockPool:
    """Host blocks the blocks of swapped-out sequences wait in: per layer (N, Hkv, P, D), like the pages."""

    def __init__(self, num_blocks: int, block_size: int, n_layers: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, pin_memory: bool | None = None):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size), ("n_layers", n_layers),
                            ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
        pin = _pin(pin_memory)
        self.geometry = (block_size, n_layers, n_kv_heads, head_dim, dtype)
        shape = (num_blocks, n_kv_heads, block_size, head_dim)  # (N, Hkv, P, D)
        self.k_blocks = [torch.zeros(shape, dtype=dtype, pin_memory=pin) for _ in range(n_layers)]
        self.v_blocks = [torch.zeros(shape, dtype=dtype, pin_memory=pin) for _ in range(n_layers)]
        self._free = list(range(num_blocks))
        self._swapped: dict = {}  # seq_id -> (host block ids, tokens)

    @property
    def num_free(self) -> int:
        """Host blocks not holding a swapped-out block."""
        return len(self._free)


def is_swapped(pool: HostBlockPool, seq_id) -> bool:
    """Whether ``seq_id``'s blocks wait in ``pool``."""
    return seq_id in pool._swapped


def _in_cache(cache: PagedKVCache, seq_id) -> bool:
    try:
        cache.seq_len(seq_id)
    except ValueError:
        return False
    return True


def _expect_fits(cache: PagedKVCache, pool: HostBlockPool) -> None:
    pages = cache.k_pages[0]
    mine = (cache.block_size, cache.n_layers, cache.n_kv_heads, cache.head_dim, pages.dtype)
    if pool.geometry != mine:
        raise ValueError(f"pool: expected (block_size, n_layers, n_kv_heads, head_dim, dtype) = {mine} like the "
                         f"cache, got {pool.geometry}")


def swap_out(cache: PagedKVCache, pool: HostBlockPool, seq_id) -> None:
    """Copy every layer of ``seq_id``'s blocks to host blocks, then drop the sequence from the cache (a block
    a fork still uses stays there). OutOfHostBlocksError, changing nothing, when the pool has too few."""
    _expect_fits(cache, pool)
    if not _in_cache(cache, seq_id) or is_swapped(pool, seq_id):
        raise ValueError(f"seq_id: expected a sequence in the cache and not swapped out, got {seq_id!r}")
    table = cache.block_table(seq_id)
    if len(table) > pool.num_free:  # check before act
        raise OutOfHostBlocksError(f"swap_out: sequence {seq_id!r} holds {len(table)} block(s), "
                                   f"{pool.num_free} host block(s) free")
    host = [pool._free.pop() for _ in table]
    src = torch.tensor(table, dtype=torch.long, device=cache.k_pages[0].device)  # (n,)
    dst = torch.tensor(host, dtype=torch.long)  # (n,)
    for layer in range(cache.n_layers):  # every block, shared or not: the host copy must be whole
        pool.k_blocks[layer][dst] = cache.k_pages[layer][src].to(pool.k_blocks[layer].device)  # (n, Hkv, P, D)
        pool.v_blocks[layer][dst] = cache.v_pages[layer][src].to(pool.v_blocks[layer].device)
    pool._swapped[seq_id] = (host, cache.seq_len(seq_id))
    cache.free(seq_id)  # decref: a block another sequence holds stays on the device


def swap_in(cache: PagedKVCache, pool: HostBlockPool, seq_id) -> None:
    """Bring ``seq_id`` back into fresh device blocks and free its host blocks. OutOfBlocksError,
    changing nothing, when the cache has too few free blocks."""
    _expect_fits(cache, pool)
    if not is_swapped(pool, seq_id) or _in_cache(cache, seq_id):
        raise ValueError(f"seq_id: expected a swapped-out sequence not in the cache, got {seq_id!r}")
    host, length = pool._swapped[seq_id]
    if len(host) > cache.allocator.num_free:  # check before act
        raise OutOfBlocksError(f"swap_in: sequence {seq_id!r} needs {len(host)} block(s), "
                               f"{cache.allocator.num_free} free")
    cache.add_sequence(seq_id)
    cache.reserve(seq_id, length)  # fresh blocks, never the ones it held before
    device = cache.k_pages[0].device
    dst = torch.tensor(cache.block_table(seq_id), dtype=torch.long, device=device)  # (n,)
    src = torch.tensor(host, dtype=torch.long)  # (n,)
    for layer in range(cache.n_layers):
        cache.k_pages[layer][dst] = pool.k_blocks[layer][src].to(device)  # (n, Hkv, P, D)
        cache.v_pages[layer][dst] = pool.v_blocks[layer][src].to(device)
    del pool._swapped[seq_id]
    pool._free.extend(reversed(host))
