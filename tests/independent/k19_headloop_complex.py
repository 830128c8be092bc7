"""Kata 19 written from its README: a loop over heads, RoPE as complex multiplication, one fused
(B, S, C + R) tensor per layer as vLLM stores it, float32 or float64 as the inputs come."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _positive(**sizes):
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"bad {name}: {value!r}")


def mla_cache_bytes(n_layers, seq_len, kv_lora_rank, qk_rope_dim, dtype_bytes=2, batch=1):
    _positive(n_layers=n_layers, kv_lora_rank=kv_lora_rank, qk_rope_dim=qk_rope_dim, batch=batch)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"bad seq_len: {seq_len!r}")
    if isinstance(dtype_bytes, (bool, str)) or not (isinstance(dtype_bytes, (int, float)) and dtype_bytes > 0):
        raise ValueError(f"bad dtype_bytes: {dtype_bytes!r}")
    return batch * seq_len * n_layers * (kv_lora_rank + qk_rope_dim) * dtype_bytes


def gqa_groups(kv_lora_rank, qk_rope_dim, head_dim):
    _positive(kv_lora_rank=kv_lora_rank, qk_rope_dim=qk_rope_dim, head_dim=head_dim)
    return (kv_lora_rank + qk_rope_dim) / (head_dim + head_dim)


class LatentKVCache:
    def __init__(self):
        self.fused = {}  # layer -> (B, S, C + R)
        self.width = {}  # layer -> C

    def update(self, layer, c_kv, k_pe):
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise ValueError(f"bad layer: {layer!r}")
        if not isinstance(c_kv, torch.Tensor) or c_kv.dim() != 3:
            raise ValueError("bad c_kv: expected (B, T, C)")
        if not isinstance(k_pe, torch.Tensor) or k_pe.dim() != 3 or k_pe.shape[:2] != c_kv.shape[:2] \
                or k_pe.dtype != c_kv.dtype:
            raise ValueError("bad k_pe: expected (B, T, R) matching c_kv")
        new = torch.cat([c_kv, k_pe], dim=-1)
        if layer in self.fused:
            old = self.fused[layer]
            if self.width[layer] != c_kv.shape[2]:
                raise ValueError("bad c_kv width for this layer")
            if old.shape[2] - self.width[layer] != k_pe.shape[2]:
                raise ValueError("bad k_pe width for this layer")
            if old.shape[0] != c_kv.shape[0] or old.dtype != c_kv.dtype:
                raise ValueError("bad c_kv batch or dtype for this layer (k_pe likewise)")
            new = torch.cat([old, new], dim=1)
        self.fused[layer], self.width[layer] = new, c_kv.shape[2]
        return new[..., :c_kv.shape[2]], new[..., c_kv.shape[2]:]

    def seq_len(self, layer=0):
        return self.fused[layer].shape[1] if layer in self.fused else 0

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.fused.values())


def split_kv_b(weight, n_heads, qk_nope_dim, v_head_dim):
    _positive(n_heads=n_heads, qk_nope_dim=qk_nope_dim, v_head_dim=v_head_dim)
    per = qk_nope_dim + v_head_dim
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != n_heads * per:
        raise ValueError("bad weight: expected n_heads * (qk_nope_dim + v_head_dim) rows")
    uk = torch.stack([weight[h * per:h * per + qk_nope_dim] for h in range(n_heads)])
    uv = torch.stack([weight[h * per + qk_nope_dim:(h + 1) * per] for h in range(n_heads)])
    return uk, uv


def decode_flops(seq_len, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim, *, absorbed):
    _positive(seq_len=seq_len, n_heads=n_heads, kv_lora_rank=kv_lora_rank, qk_nope_dim=qk_nope_dim,
              qk_rope_dim=qk_rope_dim, v_head_dim=v_head_dim)
    if not isinstance(absorbed, bool):
        raise ValueError(f"bad absorbed: {absorbed!r}")
    per_head = 0
    if absorbed:
        per_head += qk_nope_dim * kv_lora_rank  # fold W_UK
        per_head += seq_len * (kv_lora_rank + qk_rope_dim)  # scores
        per_head += seq_len * kv_lora_rank  # weighted latents
        per_head += kv_lora_rank * v_head_dim  # W_UV
    else:
        per_head += seq_len * kv_lora_rank * (qk_nope_dim + v_head_dim)
        per_head += seq_len * (qk_nope_dim + qk_rope_dim) + seq_len * v_head_dim
    return 2 * n_heads * per_head


def _rotate(x, positions, base):
    """Interleaved pairs as complex numbers, turned by position * base ** (-2i / R)."""
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    d = x.shape[-1]
    freq = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float64) / d)
    angle = positions.to(work)[..., None] * freq.to(work)  # (B, T, R/2)
    while angle.dim() < x.dim():
        angle = angle.unsqueeze(1)
    z = torch.view_as_complex(x.to(work).reshape(*x.shape[:-1], d // 2, 2).clone())
    turned = torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle)).flatten(-2)
    return turned.to(x.dtype)


class MLAttention(nn.Module):
    def __init__(self, hidden_size, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim,
                 q_lora_rank=None, rope_base=10000.0, eps=1e-6):
        super().__init__()
        _positive(hidden_size=hidden_size, n_heads=n_heads, kv_lora_rank=kv_lora_rank, qk_nope_dim=qk_nope_dim,
                  qk_rope_dim=qk_rope_dim, v_head_dim=v_head_dim)
        if qk_rope_dim % 2:
            raise ValueError(f"bad qk_rope_dim: {qk_rope_dim} is odd")
        if q_lora_rank is not None:
            _positive(q_lora_rank=q_lora_rank)
        if not rope_base > 0:
            raise ValueError(f"bad rope_base: {rope_base}")
        self.sizes = (n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim)
        self.hidden_size, self.rope_base, self.lora = hidden_size, rope_base, q_lora_rank
        if q_lora_rank is None:
            self.q_proj = nn.Linear(hidden_size, n_heads * (qk_nope_dim + qk_rope_dim), bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden_size, q_lora_rank, bias=False)
            self.q_a_layernorm = nn.RMSNorm(q_lora_rank, eps=eps)
            self.q_b_proj = nn.Linear(q_lora_rank, n_heads * (qk_nope_dim + qk_rope_dim), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_dim, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(kv_lora_rank, eps=eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, n_heads * (qk_nope_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(n_heads * v_head_dim, hidden_size, bias=False)

    def forward(self, x, positions, cache=None, layer=0, *, absorbed=True):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError("bad x: expected (batch, seq, hidden_size)")
        if not isinstance(positions, torch.Tensor) or positions.shape != x.shape[:2] \
                or positions.dtype.is_floating_point or positions.dtype == torch.bool:
            raise ValueError("bad positions: expected integers (batch, seq)")
        H, C, N, R, V = self.sizes
        B, T, _ = x.shape
        q = self.q_proj(x) if self.lora is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, H, N + R)
        kv = self.kv_a_proj_with_mqa(x)
        c_kv = self.kv_a_layernorm(kv[..., :C])
        k_pe = _rotate(kv[..., C:], positions, self.rope_base)
        if cache is not None:
            c_kv, k_pe = cache.update(layer, c_kv, k_pe)
        S = c_kv.shape[1]
        mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
        if absorbed:
            w_uk, w_uv = split_kv_b(self.kv_b_proj.weight, H, N, V)
        else:
            up = self.kv_b_proj(c_kv).view(B, S, H, N + V)
        heads = []
        for h in range(H):
            q_nope, q_pe = q[:, :, h, :N], _rotate(q[:, :, h, N:], positions, self.rope_base)  # (B, T, N), (B, T, R)
            if absorbed:
                keys = torch.cat([c_kv, k_pe], -1)  # (B, S, C + R)
                query = torch.cat([q_nope @ w_uk[h], q_pe], -1)  # (B, T, C + R)
                summed = F.scaled_dot_product_attention(query, keys, c_kv, attn_mask=mask, scale=1 / math.sqrt(N + R))
                heads.append(summed @ w_uv[h].T)  # (B, T, V)
            else:
                keys = torch.cat([up[:, :, h, :N], k_pe], -1)  # (B, S, N + R)
                query = torch.cat([q_nope, q_pe], -1)
                heads.append(F.scaled_dot_product_attention(query, keys, up[:, :, h, N:], attn_mask=mask))
        return self.o_proj(torch.cat(heads, -1))
