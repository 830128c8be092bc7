"""Kata 01, written from its README: torch.cat append, a dict cache that concatenates on write, SDPA with is_causal for the prefill and no mask for a decode step.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _shape(t):
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def _check_new(k_new, v_new):
    if not isinstance(k_new, torch.Tensor) or k_new.dim() != 4:
        raise ValueError(f"k_new: expected a 4-D tensor (B, H, T, D), got {_shape(k_new)}")
    if not isinstance(v_new, torch.Tensor) or v_new.dim() != 4:
        raise ValueError(f"v_new: expected a 4-D tensor (B, H, T, D), got {_shape(v_new)}")
    if v_new.shape != k_new.shape:
        raise ValueError(f"v_new: expected the shape of k_new {tuple(k_new.shape)}, got {tuple(v_new.shape)}")
    if v_new.dtype != k_new.dtype:
        raise ValueError(f"v_new: expected the dtype of k_new {k_new.dtype}, got {v_new.dtype}")
    if v_new.device != k_new.device:
        raise ValueError(f"v_new: expected the device of k_new {k_new.device}, got {v_new.device}")


def _check_cache(cache):
    if not isinstance(cache, (tuple, list)) or len(cache) != 2:
        raise ValueError(f"cache: expected None or a pair (K, V), got {type(cache).__name__}"
                         + (f" of length {len(cache)}" if isinstance(cache, (tuple, list)) else ""))
    K, V = cache
    if not isinstance(K, torch.Tensor) or K.dim() != 4:
        raise ValueError(f"cache: expected K to be a 4-D tensor (B, H, S, D), got {_shape(K)}")
    if not isinstance(V, torch.Tensor) or V.shape != K.shape:
        raise ValueError(f"cache: expected V shaped like K {tuple(K.shape)}, got {_shape(V)}")
    if V.dtype != K.dtype or V.device != K.device:
        raise ValueError(f"cache: expected V of K's dtype/device {K.dtype}/{K.device}, got {V.dtype}/{V.device}")
    return K, V


def append_kv(cache, k_new, v_new):
    _check_new(k_new, v_new)
    if cache is None:
        return k_new.clone(), v_new.clone()
    K, V = _check_cache(cache)
    for axis, label in ((0, "batch"), (1, "heads"), (3, "head_dim")):
        if K.shape[axis] != k_new.shape[axis]:
            raise ValueError(f"k_new: expected {label} {K.shape[axis]} like the cache {tuple(K.shape)}, "
                             f"got {k_new.shape[axis]} in {tuple(k_new.shape)}")
    if K.dtype != k_new.dtype:
        raise ValueError(f"k_new: expected the cache dtype {K.dtype}, got {k_new.dtype}")
    if K.device != k_new.device:
        raise ValueError(f"k_new: expected the cache device {K.device}, got {k_new.device}")
    return torch.cat([K, k_new], dim=2), torch.cat([V, v_new], dim=2)


class DynamicKVCache:
    def __init__(self):
        self._layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @staticmethod
    def _layer(layer):
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise ValueError(f"layer: expected an int >= 0, got {layer!r}")
        return layer

    def update(self, layer, k_new, v_new):
        layer = self._layer(layer)
        grown = append_kv(self._layers.get(layer), k_new, v_new)
        self._layers[layer] = grown
        return grown

    def seq_len(self, layer=0):
        layer = self._layer(layer)
        kv = self._layers.get(layer)
        return 0 if kv is None else kv[0].shape[2]

    def __len__(self):
        return len(self._layers)


class CachedAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if n_heads <= 0 or d_model <= 0 or d_model % n_heads:
            raise ValueError(f"n_heads: expected a positive divisor of d_model={d_model}, got {n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def _heads(self, t, B, T):
        return t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x, cache=None):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model or x.shape[1] < 1:
            raise ValueError(f"x: expected a tensor (batch, seq >= 1, {self.d_model}), got {_shape(x)}")
        B, T, _ = x.shape
        if cache is not None:
            K, V = _check_cache(cache)
            want = (B, self.n_heads, self.head_dim)
            got = (K.shape[0], K.shape[1], K.shape[3])
            if got != want or K.shape[2] < 1:
                raise ValueError(f"cache: expected (K, V) of shape ({B}, {self.n_heads}, S >= 1, {self.head_dim}), "
                                 f"got {tuple(K.shape)}")
            if K.dtype != x.dtype or K.device != x.device:
                raise ValueError(f"cache: expected the dtype/device of x {x.dtype}/{x.device}, got {K.dtype}/{K.device}")
            if T != 1:
                raise ValueError(f"x: a decode step with a cache takes one new token, got seq {T}")
        q = self._heads(self.wq(x), B, T)
        k = self._heads(self.wk(x), B, T)
        v = self._heads(self.wv(x), B, T)
        K, V = append_kv(cache, k, v) if cache is not None else (k, v)
        out = F.scaled_dot_product_attention(q, K, V, is_causal=cache is None and T > 1)
        out = out.transpose(1, 2).reshape(B, T, self.d_model)
        return self.wo(out), (K, V)
