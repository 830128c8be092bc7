"""Kata 05, written from its README: masks sliced (and cloned) from a tril made once, writes by slice assignment, positions kept in a LongTensor, inputs of another dtype refused.

Shapes: B batch, H KV heads, T new tokens, L max_len, D head width. Buffers (B, H, L, D).
"""
from __future__ import annotations

import operator

import torch


class CacheFullError(ValueError):
    """Raised before anything is written when an update does not fit in ``max_len``."""


def _index(name: str, value, low: int, high: int | None = None) -> int:
    """``value`` as an int in [low, high], else ValueError naming ``name``."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected an int, got the bool {value}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected an int, got {type(value).__name__} {value!r}") from None
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low} … {high}"
        raise ValueError(f"{name}: expected an int {bound}, got {value}")
    return value


class StaticKVCache:
    def __init__(self, n_layers: int, batch: int, max_len: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        self.n_layers = _index("n_layers", n_layers, 1)
        self.batch = _index("batch", batch, 1)
        self.max_len = _index("max_len", max_len, 1)
        self.n_kv_heads = _index("n_kv_heads", n_kv_heads, 1)
        self.head_dim = _index("head_dim", head_dim, 1)
        self.dtype = dtype
        self.keys, self.values = [], []
        for _ in range(self.n_layers):
            self.keys.append(torch.zeros(self.batch, self.n_kv_heads, self.max_len, self.head_dim,
                                         dtype=dtype, device=device))
            self.values.append(torch.zeros_like(self.keys[-1]))
        self.device = self.keys[0].device
        self._pos = torch.zeros(self.n_layers, dtype=torch.long)  # filled slots per layer, on the CPU
        # Row s: slot s may attend to slots 0 … s. Kept private; masks handed out are copies of its rows.
        self._tril = torch.ones(self.max_len, self.max_len, dtype=torch.bool, device=self.device).tril()

    def _check_kv(self, name: str, x) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name}: expected a 4-D tensor (batch={self.batch}, n_kv_heads={self.n_kv_heads}, "
                             f"T, head_dim={self.head_dim}), got {got}")
        b, h, _, d = x.shape
        if (b, h, d) != (self.batch, self.n_kv_heads, self.head_dim):
            raise ValueError(f"{name}: expected (batch={self.batch}, n_kv_heads={self.n_kv_heads}, T, "
                             f"head_dim={self.head_dim}), got shape {tuple(x.shape)}")
        if x.dtype != self.dtype:
            raise ValueError(f"{name}: expected dtype {self.dtype} (the buffers'), got {x.dtype}")

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor):
        layer = _index("layer", layer, 0, self.n_layers - 1)
        self._check_kv("k_new", k_new)
        self._check_kv("v_new", v_new)
        if tuple(v_new.shape) != tuple(k_new.shape):
            raise ValueError(f"v_new: expected the shape of k_new, {tuple(k_new.shape)}, got {tuple(v_new.shape)}")
        start = int(self._pos[layer])
        stop = start + k_new.shape[2]
        if stop > self.max_len:
            raise CacheFullError(f"max_len: layer {layer} holds {start} tokens, k_new adds {k_new.shape[2]}, "
                                 f"and {stop} exceeds max_len = {self.max_len}")
        self.keys[layer][:, :, start:stop] = k_new.to(self.device)
        self.values[layer][:, :, start:stop] = v_new.to(self.device)
        self._pos[layer] = stop
        return self.keys[layer], self.values[layer]

    def seq_len(self, layer: int = 0) -> int:
        return int(self._pos[_index("layer", layer, 0, self.n_layers - 1)])

    def attention_mask(self, new_len: int, layer: int = 0) -> torch.Tensor:
        filled = self.seq_len(layer)
        new_len = _index("new_len", new_len, 0, filled)
        return self._tril[filled - new_len:filled].clone()

    def reset(self) -> None:
        self._pos.zero_()
