"""Kata 05, written from its README: every layer's buffers are views of one slab allocated once, writes with scatter_, positions in a dict, masks from tril(diagonal=past) of a fresh ones tensor.

Shapes: B batch, H KV heads, T new tokens, L max_len, D head width. Buffers (B, H, L, D).
"""
from __future__ import annotations

import torch


class CacheFullError(ValueError):
    """The tokens given do not fit in the slots left; the cache is unchanged."""


def _positive(name, value):
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} should be a positive int; received {value!r}")
    return value


class StaticKVCache:
    def __init__(self, n_layers: int, batch: int, max_len: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        dims = [_positive(n, v) for n, v in (("n_layers", n_layers), ("batch", batch), ("max_len", max_len),
                                               ("n_kv_heads", n_kv_heads), ("head_dim", head_dim))]
        self.n_layers, self.batch, self.max_len, self.n_kv_heads, self.head_dim = dims
        self.dtype = dtype
        # One allocation: [0] keys, [1] values, then one (B, H, L, D) block per layer.
        self._slab = torch.zeros(2, n_layers, batch, n_kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.device = self._slab.device
        self.keys = [self._slab[0, i] for i in range(n_layers)]
        self.values = [self._slab[1, i] for i in range(n_layers)]
        self._len = {i: 0 for i in range(n_layers)}

    def _get_layer(self, layer):
        if type(layer) is not int or layer not in self._len:
            raise ValueError(f"layer should be an int in range({self.n_layers}); received {layer!r}")
        return layer

    def _validate(self, name, x, like=None):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} should be a torch.Tensor; received {type(x).__name__}")
        if like is not None:
            if x.shape != like.shape:
                raise ValueError(f"{name} should be shaped like k_new {tuple(like.shape)}; received {tuple(x.shape)}")
            return
        if x.ndim != 4 or x.shape[0] != self.batch or x.shape[1] != self.n_kv_heads or x.shape[3] != self.head_dim:
            raise ValueError(f"{name} should be ({self.batch}, {self.n_kv_heads}, T, {self.head_dim}) "
                             f"(batch, n_kv_heads, T, head_dim); received {tuple(x.shape)}")

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor):
        layer = self._get_layer(layer)
        self._validate("k_new", k_new)
        self._validate("v_new", v_new)
        self._validate("v_new", v_new, like=k_new)
        past, T = self._len[layer], k_new.shape[2]
        if past + T > self.max_len:
            raise CacheFullError(f"k_new: {T} new tokens on top of {past} in layer {layer} "
                                 f"need {past + T} slots; max_len is {self.max_len}")
        K, V = self.keys[layer], self.values[layer]
        if T > 0:
            index = torch.arange(past, past + T, device=self.device).view(1, 1, T, 1)
            index = index.expand(self.batch, self.n_kv_heads, T, self.head_dim)
            K.scatter_(2, index, k_new.to(device=self.device, dtype=self.dtype))
            V.scatter_(2, index, v_new.to(device=self.device, dtype=self.dtype))
        self._len[layer] = past + T
        return K, V

    def seq_len(self, layer: int = 0) -> int:
        return self._len[self._get_layer(layer)]

    def attention_mask(self, new_len: int, layer: int = 0) -> torch.Tensor:
        filled = self.seq_len(layer)
        if type(new_len) is not int or not 0 <= new_len <= filled:
            raise ValueError(f"new_len should be an int between 0 and seq_len={filled}; received {new_len!r}")
        past = filled - new_len  # row i is slot past + i: it sees columns 0 … past + i
        return torch.ones(new_len, self.max_len, dtype=torch.bool, device=self.device).tril(diagonal=past)

    def reset(self) -> None:
        self._len = dict.fromkeys(self._len, 0)
