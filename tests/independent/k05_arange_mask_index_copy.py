"""Kata 05, written from its README: masks from arange comparisons, writes with index_copy_, positions in a Python list.

Shapes: B batch, H KV heads, T new tokens, L max_len, D head width. Buffers (B, H, L, D).
"""
from __future__ import annotations

import torch


class CacheFullError(ValueError):
    """An update would write past ``max_len``; nothing was written."""


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class StaticKVCache:
    def __init__(self, n_layers: int, batch: int, max_len: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        for name, val in (("n_layers", n_layers), ("batch", batch), ("max_len", max_len),
                          ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
            if not _is_int(val) or val <= 0:
                raise ValueError(f"{name} must be a positive int, but it is {val!r}")
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype must be a torch.dtype, but it is {dtype!r}")
        self.n_layers, self.batch, self.max_len = n_layers, batch, max_len
        self.n_kv_heads, self.head_dim, self.dtype = n_kv_heads, head_dim, dtype
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(n_layers)]
        self.device = self.keys[0].device  # "cuda" -> "cuda:0"
        self._filled = [0 for _ in range(n_layers)]

    def _layer(self, layer) -> int:
        if not _is_int(layer) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be an int from 0 to {self.n_layers - 1}, but it is {layer!r}")
        return layer

    def _check(self, name: str, t) -> None:
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor (batch, n_kv_heads, T, head_dim), but it is {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, n_kv_heads, T, head_dim), but it has shape {tuple(t.shape)}")
        want = (self.batch, self.n_kv_heads, self.head_dim)
        have = (t.shape[0], t.shape[1], t.shape[3])
        if have != want:
            raise ValueError(f"{name} must have batch, n_kv_heads, head_dim = {want}, but has {have} "
                             f"(shape {tuple(t.shape)})")

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor):
        layer = self._layer(layer)
        self._check("k_new", k_new)
        self._check("v_new", v_new)
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new must have the shape of k_new {tuple(k_new.shape)}, but has {tuple(v_new.shape)}")
        start, T = self._filled[layer], k_new.shape[2]
        if start + T > self.max_len:
            raise CacheFullError(f"k_new brings {T} tokens to layer {layer}, which holds {start} of max_len="
                                 f"{self.max_len}: {start + T} would not fit")
        K, V = self.keys[layer], self.values[layer]
        if T:
            idx = torch.arange(start, start + T, device=self.device)
            K.index_copy_(2, idx, k_new.to(device=self.device, dtype=self.dtype))
            V.index_copy_(2, idx, v_new.to(device=self.device, dtype=self.dtype))
        self._filled[layer] = start + T
        return K, V

    def seq_len(self, layer: int = 0) -> int:
        return self._filled[self._layer(layer)]

    def attention_mask(self, new_len: int, layer: int = 0) -> torch.Tensor:
        layer = self._layer(layer)
        filled = self._filled[layer]
        if not _is_int(new_len) or new_len < 0 or new_len > filled:
            raise ValueError(f"new_len must be an int from 0 to seq_len({layer}) = {filled}, but it is {new_len!r}")
        own = torch.arange(filled - new_len, filled, device=self.device)  # slot of each new token
        cols = torch.arange(self.max_len, device=self.device)
        return cols.unsqueeze(0) <= own.unsqueeze(1)  # a fresh (new_len, L) bool tensor

    def reset(self) -> None:
        for i in range(self.n_layers):
            self._filled[i] = 0
