"""Kata 03, written from its README: repeat_kv by index_select with head index h // n_rep, attention as a Python loop over KV groups (each group's query heads against its one cached head) with a hand-written max-subtracted softmax in the input dtype, the cache grown into a new buffer by slice copies.
"""
from __future__ import annotations

import math
import operator

import torch
from torch import nn

from grader.nn import apply_rope


def _as_count(value, name, minimum=1):
    if isinstance(value, bool):
        raise ValueError(f"{name}: need an int >= {minimum}, not a bool")
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: need an int >= {minimum}, got {value!r}") from None
    if n < minimum:
        raise ValueError(f"{name}: need an int >= {minimum}, got {n}")
    return n


def repeat_kv(x, n_rep):
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x: need a 4-D tensor (B, n_kv, S, D), got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"x: need a 4-D tensor (B, n_kv, S, D), got {x.dim()}-D shape {tuple(x.shape)}")
    n_rep = _as_count(n_rep, "n_rep")
    index = torch.arange(x.shape[1] * n_rep, device=x.device) // n_rep  # 0 0 0 1 1 1 ...
    return torch.index_select(x, 1, index)


class GQAttention(nn.Module):
    def __init__(self, d_model, n_q_heads, n_kv_heads, head_dim=None, rope_base=10000.0):
        super().__init__()
        d_model = _as_count(d_model, "d_model")
        n_q_heads = _as_count(n_q_heads, "n_q_heads")
        n_kv_heads = _as_count(n_kv_heads, "n_kv_heads")
        if n_q_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads: {n_kv_heads} does not divide n_q_heads={n_q_heads}; "
                             f"need a divisor such as {[h for h in range(1, n_q_heads + 1) if n_q_heads % h == 0]}")
        if head_dim is None:
            head_dim = d_model // n_q_heads
            if head_dim == 0:
                raise ValueError(f"head_dim: d_model // n_q_heads = {d_model} // {n_q_heads} is 0; need an even width >= 2")
        head_dim = _as_count(head_dim, "head_dim", 2)
        if head_dim % 2:
            raise ValueError(f"head_dim: need an even width (RoPE rotates pairs), got {head_dim}")
        try:
            base_ok = float(rope_base) > 0 and math.isfinite(float(rope_base))
        except (TypeError, ValueError):
            base_ok = False
        if not base_ok or isinstance(rope_base, bool):
            raise ValueError(f"rope_base: need a positive finite number, got {rope_base!r}")
        self.d_model, self.n_q_heads, self.n_kv_heads = d_model, n_q_heads, n_kv_heads
        self.head_dim, self.rope_base = head_dim, rope_base
        self.wq = nn.Linear(d_model, n_q_heads * head_dim, bias=False)
        self.wk = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_q_heads * head_dim, d_model, bias=False)

    def _checked(self, x, cache):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: need (batch, seq, {self.d_model}), got {got}")
        if x.shape[2] != self.d_model:
            raise ValueError(f"x: need last dim d_model={self.d_model}, got {tuple(x.shape)}")
        if x.shape[1] < 1:
            raise ValueError(f"x: need at least one new token, got {tuple(x.shape)}")
        if cache is None:
            return None
        if not isinstance(cache, (tuple, list)) or len(cache) != 2:
            raise ValueError(f"cache: need None or (K, V), got {type(cache).__name__}")
        K, V = cache
        for nm, t in (("K", K), ("V", V)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"cache: {nm} must be a tensor, got {type(t).__name__}")
            if t.dim() != 4 or t.shape[0] != x.shape[0] or t.shape[1] != self.n_kv_heads or t.shape[3] != self.head_dim:
                raise ValueError(f"cache: {nm} must be ({x.shape[0]}, {self.n_kv_heads}, S, {self.head_dim}), "
                                 f"got {tuple(t.shape)}")
            if t.dtype != x.dtype or t.device != x.device:
                raise ValueError(f"cache: {nm} must be {x.dtype} on {x.device}, got {t.dtype} on {t.device}")
        if K.shape != V.shape:
            raise ValueError(f"cache: K {tuple(K.shape)} and V {tuple(V.shape)} must have one shape")
        return K, V

    def forward(self, x, cache=None):
        old = self._checked(x, cache)
        B, T, _ = x.shape
        Hq, Hkv, D = self.n_q_heads, self.n_kv_heads, self.head_dim
        rep = Hq // Hkv
        P = 0 if old is None else old[0].shape[2]
        pos = torch.arange(P, P + T, device=x.device, dtype=torch.long)
        q = apply_rope(self.wq(x).view(B, T, Hq, D).permute(0, 2, 1, 3), pos, self.rope_base)
        k = apply_rope(self.wk(x).view(B, T, Hkv, D).permute(0, 2, 1, 3), pos, self.rope_base)
        v = self.wv(x).view(B, T, Hkv, D).permute(0, 2, 1, 3)
        K = k.new_empty((B, Hkv, P + T, D))
        V = v.new_empty((B, Hkv, P + T, D))
        if old is not None:
            K[:, :, :P] = old[0]
            V[:, :, :P] = old[1]
        K[:, :, P:] = k
        V[:, :, P:] = v
        hidden = torch.arange(P + T, device=x.device)[None, :] > pos[:, None]  # (T, S), True = masked out
        scale = 1.0 / math.sqrt(D)
        groups = []
        for g in range(Hkv):
            qg = q[:, g * rep:(g + 1) * rep]  # (B, rep, T, D)
            s = qg @ K[:, g:g + 1].transpose(-1, -2) * scale  # (B, rep, T, S), the KV head broadcast
            s = s.masked_fill(hidden, float("-inf"))
            s = s - s.amax(-1, keepdim=True)
            p = s.exp()
            p = p / p.sum(-1, keepdim=True)
            groups.append(p @ V[:, g:g + 1])  # (B, rep, T, D)
        ctx = torch.cat(groups, dim=1).permute(0, 2, 1, 3).reshape(B, T, Hq * D)
        return self.wo(ctx), (K, V)
