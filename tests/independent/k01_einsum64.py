"""Kata 01, written from its README: append into a freshly allocated buffer by slice copies, a cache that keeps per-layer lists of chunks and concatenates on read, einsum attention with scores and softmax in float64 and an explicit boolean mask (cast back at the end); a cached call of several tokens is handled with an offset mask.
"""
from __future__ import annotations

import torch
from torch import nn


def _what(t):
    if isinstance(t, torch.Tensor):
        return f"a {t.dim()}-D tensor of shape {tuple(t.shape)} ({t.dtype})"
    return f"a {type(t).__name__}"


def _pair(cache, name="cache"):
    if not (isinstance(cache, tuple) or isinstance(cache, list)):
        raise ValueError(f"{name} should be None or a pair (K, V) of 4-D tensors; it is {_what(cache)}")
    if len(cache) != 2:
        raise ValueError(f"{name} should be a pair (K, V); it has {len(cache)} items")
    K, V = cache
    for label, t in (("K", K), ("V", V)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: {label} should be a 4-D tensor (B, H, S, D); it is {_what(t)}")
    if K.shape != V.shape:
        raise ValueError(f"{name}: K and V should have one shape; K is {tuple(K.shape)}, V is {tuple(V.shape)}")
    if K.dtype != V.dtype:
        raise ValueError(f"{name}: K and V should have one dtype; K is {K.dtype}, V is {V.dtype}")
    if K.device != V.device:
        raise ValueError(f"{name}: K and V should live on one device; K on {K.device}, V on {V.device}")
    return K, V


def append_kv(cache, k_new, v_new):
    for label, t in (("k_new", k_new), ("v_new", v_new)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{label} should be a 4-D tensor (B, H, T, D); it is {_what(t)}")
    if tuple(v_new.shape) != tuple(k_new.shape):
        raise ValueError(f"v_new should have the shape of k_new {tuple(k_new.shape)}; it has {tuple(v_new.shape)}")
    if v_new.dtype != k_new.dtype:
        raise ValueError(f"v_new should have the dtype of k_new ({k_new.dtype}); it has {v_new.dtype}")
    if v_new.device != k_new.device:
        raise ValueError(f"v_new should be on the device of k_new ({k_new.device}); it is on {v_new.device}")
    if cache is None:
        B, H, S, D = k_new.shape
        past = 0
        K = V = None
    else:
        K, V = _pair(cache)
        B, H, past, D = K.shape
        if (k_new.shape[0], k_new.shape[1], k_new.shape[3]) != (B, H, D):
            raise ValueError(f"k_new should match the cache in batch, heads and head width (B={B}, H={H}, D={D}); "
                             f"it has shape {tuple(k_new.shape)}")
        if k_new.dtype != K.dtype:
            raise ValueError(f"k_new should have the cache's dtype {K.dtype}; it has {k_new.dtype}")
        if k_new.device != K.device:
            raise ValueError(f"k_new should be on the cache's device {K.device}; it is on {k_new.device}")
    T = k_new.shape[2]
    K2 = k_new.new_empty((B, H, past + T, D))
    V2 = v_new.new_empty((B, H, past + T, D))
    if past:
        K2[:, :, :past].copy_(K)
        V2[:, :, :past].copy_(V)
    K2[:, :, past:].copy_(k_new)
    V2[:, :, past:].copy_(v_new)
    return K2, V2


class DynamicKVCache:
    """Keeps every chunk it was given, per layer; the whole cache is concatenated when asked for."""

    def __init__(self):
        self._chunks: list[list[tuple[torch.Tensor, torch.Tensor]] | None] = []

    def _index(self, layer):
        if type(layer) is not int or layer < 0:
            raise ValueError(f"layer should be a non-negative int; it is {layer!r}")
        return layer

    def update(self, layer, k_new, v_new):
        layer = self._index(layer)
        chunks = self._chunks[layer] if layer < len(self._chunks) else None
        if chunks:
            head_k = chunks[0][0]
            whole = (head_k[:, :, :0], chunks[0][1][:, :, :0])  # an empty cache with the layer's layout
            append_kv(whole, k_new, v_new)  # validates k_new, v_new against the layer
        else:
            append_kv(None, k_new, v_new)
        while len(self._chunks) <= layer:
            self._chunks.append(None)
        if self._chunks[layer] is None:
            self._chunks[layer] = []
        self._chunks[layer].append((k_new.clone(), v_new.clone()))
        ks = [k for k, _ in self._chunks[layer]]
        vs = [v for _, v in self._chunks[layer]]
        return torch.cat(ks, dim=2), torch.cat(vs, dim=2)

    def seq_len(self, layer=0):
        layer = self._index(layer)
        if layer >= len(self._chunks) or not self._chunks[layer]:
            return 0
        return sum(k.shape[2] for k, _ in self._chunks[layer])

    def __len__(self):
        return sum(1 for c in self._chunks if c)


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

    def forward(self, x, cache=None):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"x should be (batch, seq, d_model={self.d_model}); it is {_what(x)}")
        B, T, C = x.shape
        if C != self.d_model or T == 0:
            raise ValueError(f"x should be (batch, seq >= 1, d_model={self.d_model}); it is {tuple(x.shape)}")
        H, D = self.n_heads, self.head_dim
        if cache is not None:
            K, V = _pair(cache)
            if K.shape[0] != B or K.shape[1] != H or K.shape[3] != D or K.shape[2] == 0:
                raise ValueError(f"cache should hold (K, V) each ({B}, {H}, S >= 1, {D}); K is {tuple(K.shape)}")
            if K.dtype != x.dtype:
                raise ValueError(f"cache should have the dtype of x ({x.dtype}); it has {K.dtype}")
            if K.device != x.device:
                raise ValueError(f"cache should be on the device of x ({x.device}); it is on {K.device}")
        q = self.wq(x).reshape(B, T, H, D)
        k = self.wk(x).reshape(B, T, H, D).permute(0, 2, 1, 3)
        v = self.wv(x).reshape(B, T, H, D).permute(0, 2, 1, 3)
        K, V = append_kv(cache, k, v)
        S = K.shape[2]
        past = S - T
        scores = torch.einsum("bthd,bhsd->bhts", q.double(), K.double()) / (D ** 0.5)
        allowed = torch.arange(S, device=x.device)[None, :] <= (past + torch.arange(T, device=x.device))[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        ctx = torch.einsum("bhts,bhsd->bthd", weights, V.double()).to(x.dtype).reshape(B, T, H * D)
        return self.wo(ctx), (K, V)
