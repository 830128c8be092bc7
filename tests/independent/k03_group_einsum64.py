"""Kata 03, written from its README: repeat_kv by expand + reshape (copied, never a view of the input), attention as an einsum over groups without repeating (queries viewed as (B, n_kv, n_rep, T, D)) with scores and softmax in float64, sizes checked lazily on the first call.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from grader.nn import apply_rope


def repeat_kv(x, n_rep):
    if not torch.is_tensor(x):
        raise ValueError(f"x should be a 4-D tensor (B, n_kv, S, D); it is a {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"x should be a 4-D tensor (B, n_kv, S, D); it has shape {tuple(x.shape)}")
    if type(n_rep) is not int or n_rep < 1:
        raise ValueError(f"n_rep should be an int >= 1; it is {n_rep!r}")
    B, H, S, D = x.shape
    out = x.unsqueeze(2).expand(B, H, n_rep, S, D).reshape(B, H * n_rep, S, D)
    if out.numel() and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        out = out.clone()  # n_rep == 1 gives a view: hand back a copy the caller owns
    return out


class GQAttention(nn.Module):
    def __init__(self, d_model, n_q_heads, n_kv_heads, head_dim=None, rope_base=10000.0):
        super().__init__()
        for name, value in (("d_model", d_model), ("n_q_heads", n_q_heads), ("n_kv_heads", n_kv_heads)):
            if type(value) is not int or value <= 0:
                raise ValueError(f"{name} should be a positive int; it is {value!r}")
        if n_q_heads % n_kv_heads != 0:
            raise ValueError(f"n_kv_heads should divide n_q_heads = {n_q_heads}; it is {n_kv_heads}")
        hd = d_model // n_q_heads if head_dim is None else head_dim
        if type(hd) is not int or hd <= 0 or hd % 2 == 1:
            raise ValueError(f"head_dim should be a positive even int; it is {hd!r}"
                             + (f" (d_model // n_q_heads = {d_model} // {n_q_heads})" if head_dim is None else ""))
        self.d_model, self.n_q_heads, self.n_kv_heads, self.head_dim = d_model, n_q_heads, n_kv_heads, hd
        self.rope_base = rope_base
        self.wq = nn.Linear(d_model, n_q_heads * hd, bias=False)
        self.wk = nn.Linear(d_model, n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(d_model, n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(n_q_heads * hd, d_model, bias=False)

    def forward(self, x, cache=None):
        base = self.rope_base
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not (base > 0) or math.isinf(base):
            raise ValueError(f"rope_base should be a positive finite number; it is {base!r}")
        if not torch.is_tensor(x) or x.ndim != 3 or x.shape[2] != self.d_model or x.shape[1] == 0:
            got = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
            raise ValueError(f"x should be (batch, seq >= 1, {self.d_model}); it is {got}")
        B, T, _ = x.shape
        G, R, D = self.n_kv_heads, self.n_q_heads // self.n_kv_heads, self.head_dim
        past = 0
        if cache is not None:
            if not isinstance(cache, (tuple, list)) or len(cache) != 2 or not all(torch.is_tensor(c) for c in cache):
                raise ValueError(f"cache should be None or a pair of tensors (K, V); it is {type(cache).__name__}")
            K0, V0 = cache
            expect = (B, G, D)
            for nm, c in (("K", K0), ("V", V0)):
                if c.ndim != 4 or (c.shape[0], c.shape[1], c.shape[3]) != expect:
                    raise ValueError(f"cache {nm} should be ({B}, {G}, S, {D}); it is {tuple(c.shape)}")
                if c.dtype != x.dtype:
                    raise ValueError(f"cache {nm} should be {x.dtype} like x; it is {c.dtype}")
                if c.device != x.device:
                    raise ValueError(f"cache {nm} should be on {x.device} like x; it is on {c.device}")
            if K0.shape[2] != V0.shape[2]:
                raise ValueError(f"cache K and V should hold the same length; they hold {K0.shape[2]} and {V0.shape[2]}")
            past = K0.shape[2]
        positions = past + torch.arange(T, device=x.device)
        q = self.wq(x).reshape(B, T, G * R, D).transpose(1, 2)
        k = self.wk(x).reshape(B, T, G, D).transpose(1, 2)
        v = self.wv(x).reshape(B, T, G, D).transpose(1, 2)
        q = apply_rope(q, positions, base)
        k = apply_rope(k, positions, base)
        K = k.contiguous() if cache is None else torch.cat((cache[0], k), dim=2)
        V = v.contiguous() if cache is None else torch.cat((cache[1], v), dim=2)
        S = K.shape[2]
        qg = q.reshape(B, G, R, T, D).double()  # query heads g*R ... g*R + R - 1 read KV head g
        scores = torch.einsum("bgrtd,bgsd->bgrts", qg, K.double()) / math.sqrt(D)
        visible = torch.arange(S, device=x.device).unsqueeze(0) <= positions.unsqueeze(1)  # (T, S)
        scores = torch.where(visible, scores, torch.tensor(float("-inf"), dtype=scores.dtype, device=x.device))
        w = torch.softmax(scores, dim=-1)
        ctx = torch.einsum("bgrts,bgsd->btgrd", w, V.double()).reshape(B, T, G * R * D).to(x.dtype)
        return self.wo(ctx), (K, V)
