"""Kata 01, WRONG on purpose: the head loop of k01_headloop.py with a softmax that exponentiates the raw scores (no row maximum subtracted), so large scores overflow to inf and give NaN.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def _desc(t):
    return f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else f"type {type(t).__name__}"


def _validate_new(k_new, v_new):
    if not torch.is_tensor(k_new) or k_new.ndim != 4:
        raise ValueError(f"k_new: need a 4-D tensor (batch, heads, new tokens, head_dim), got {_desc(k_new)}")
    if not torch.is_tensor(v_new) or v_new.ndim != 4:
        raise ValueError(f"v_new: need a 4-D tensor (batch, heads, new tokens, head_dim), got {_desc(v_new)}")
    if k_new.shape != v_new.shape:
        raise ValueError(f"v_new: need k_new's shape {tuple(k_new.shape)}, got {tuple(v_new.shape)}")
    if k_new.dtype != v_new.dtype:
        raise ValueError(f"v_new: need k_new's dtype {k_new.dtype}, got {v_new.dtype}")
    if k_new.device != v_new.device:
        raise ValueError(f"v_new: need k_new's device {k_new.device}, got {v_new.device}")


def _validate_cache(cache):
    if type(cache) not in (tuple, list) or len(cache) != 2:
        raise ValueError(f"cache: need None or (K, V), got {_desc(cache)}")
    K, V = cache
    if not torch.is_tensor(K) or not torch.is_tensor(V) or K.ndim != 4 or K.shape != V.shape:
        raise ValueError(f"cache: need (K, V), two 4-D tensors of one shape, got K {_desc(K)} and V {_desc(V)}")
    if K.dtype != V.dtype or K.device != V.device:
        raise ValueError(f"cache: need K and V of one dtype and device, got {K.dtype}@{K.device} and {V.dtype}@{V.device}")
    return K, V


def _compatible(K, k_new):
    b, h, _, d = K.shape
    if k_new.shape[0] != b:
        raise ValueError(f"k_new: need batch {b} as in the cache, got {k_new.shape[0]}")
    if k_new.shape[1] != h:
        raise ValueError(f"k_new: need {h} heads as in the cache, got {k_new.shape[1]}")
    if k_new.shape[3] != d:
        raise ValueError(f"k_new: need head_dim {d} as in the cache, got {k_new.shape[3]}")
    if k_new.dtype != K.dtype:
        raise ValueError(f"k_new: need dtype {K.dtype} as in the cache, got {k_new.dtype}")
    if k_new.device != K.device:
        raise ValueError(f"k_new: need device {K.device} as in the cache, got {k_new.device}")


def append_kv(cache, k_new, v_new):
    _validate_new(k_new, v_new)
    if cache is None:
        return k_new.clone(), v_new.clone()
    K, V = _validate_cache(cache)
    _compatible(K, k_new)
    return torch.cat((K, k_new), -2), torch.cat((V, v_new), -2)


class DynamicKVCache:
    """Per layer a (K, V) buffer with spare room on the sequence axis, doubled when full."""

    def __init__(self):
        self._buf: list = []  # per layer: None or [K_buf, V_buf, used]

    @staticmethod
    def _check_layer(layer):
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise ValueError(f"layer: need a non-negative int, got {type(layer).__name__} {layer!r}")
        if layer < 0:
            raise ValueError(f"layer: need a non-negative int, got {layer}")

    def update(self, layer, k_new, v_new):
        self._check_layer(layer)
        _validate_new(k_new, v_new)
        while len(self._buf) <= layer:
            self._buf.append(None)
        slot = self._buf[layer]
        T = k_new.shape[2]
        if slot is None:
            b, h, _, d = k_new.shape
            cap = max(T, 1)
            slot = [k_new.new_empty((b, h, cap, d)), v_new.new_empty((b, h, cap, d)), 0]
            self._buf[layer] = slot
        else:
            _compatible(slot[0], k_new)
        Kb, Vb, used = slot
        if used + T > Kb.shape[2]:
            cap = max(2 * Kb.shape[2], used + T)
            b, h, _, d = Kb.shape
            nk, nv = Kb.new_empty((b, h, cap, d)), Vb.new_empty((b, h, cap, d))
            nk[:, :, :used] = Kb[:, :, :used]
            nv[:, :, :used] = Vb[:, :, :used]
            slot[0], slot[1] = Kb, Vb = nk, nv
        Kb[:, :, used:used + T] = k_new
        Vb[:, :, used:used + T] = v_new
        slot[2] = used + T
        return Kb[:, :, :used + T], Vb[:, :, :used + T]

    def seq_len(self, layer=0):
        self._check_layer(layer)
        if layer >= len(self._buf) or self._buf[layer] is None:
            return 0
        return self._buf[layer][2]

    def __len__(self):
        return sum(s is not None for s in self._buf)


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
        if not torch.is_tensor(x) or x.ndim != 3 or x.shape[2] != self.d_model or x.shape[1] == 0:
            raise ValueError(f"x: need (batch, seq >= 1, {self.d_model}), got {_desc(x)}")
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        if cache is not None:
            K0, _ = _validate_cache(cache)
            if tuple(K0.shape[:2]) != (B, H) or K0.shape[3] != D or K0.shape[2] == 0:
                raise ValueError(f"cache: need tensors ({B}, {H}, S >= 1, {D}) for this layer and x, got {tuple(K0.shape)}")
            if K0.dtype != x.dtype or K0.device != x.device:
                raise ValueError(f"cache: need {x.dtype} on {x.device} like x, got {K0.dtype} on {K0.device}")
            if T != 1:
                raise ValueError(f"x: with a cache, need one new token (a decode step), got {T}")
        split = lambda t: t.reshape(B, T, H, D).transpose(1, 2)
        q, k, v = split(self.wq(x)), split(self.wk(x)), split(self.wv(x))
        K, V = append_kv(cache, k, v)
        S = K.shape[2]
        hide = torch.ones(T, S, dtype=torch.bool, device=x.device).triu(diagonal=S - T + 1)
        scale = 1.0 / math.sqrt(D)
        outs = []
        for h in range(H):
            s = torch.matmul(q[:, h], K[:, h].transpose(-1, -2)) * scale  # (B, T, S)
            s = s.masked_fill(hide, float("-inf"))
            e = s.exp()
            p = e / e.sum(dim=-1, keepdim=True)
            outs.append(torch.matmul(p, V[:, h]))  # (B, T, D)
        ctx = torch.stack(outs, dim=2).reshape(B, T, H * D)
        return self.wo(ctx), (K, V)
