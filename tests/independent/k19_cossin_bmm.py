"""Kata 19 written from its README: RoPE by explicit cos/sin on the even and odd lanes, heads folded into
the batch for bmm, a hand-written softmax, a cache that keeps every update as its own pair of copies."""
from __future__ import annotations

import torch
from torch import nn


def _size(name, value, low=1):
    if type(value) is not int or value < low:
        raise ValueError(f"{name}={value!r}: expected an int >= {low}")
    return value


def mla_cache_bytes(n_layers, seq_len, kv_lora_rank, qk_rope_dim, dtype_bytes=2, batch=1):
    elements = _size("n_layers", n_layers) * _size("seq_len", seq_len, 0) * _size("batch", batch) \
        * (_size("kv_lora_rank", kv_lora_rank) + _size("qk_rope_dim", qk_rope_dim))
    if type(dtype_bytes) not in (int, float) or not dtype_bytes > 0:
        raise ValueError(f"dtype_bytes={dtype_bytes!r}: expected a positive number")
    return elements * dtype_bytes


def gqa_groups(kv_lora_rank, qk_rope_dim, head_dim):
    stored = _size("kv_lora_rank", kv_lora_rank) + _size("qk_rope_dim", qk_rope_dim)
    return stored / (2 * _size("head_dim", head_dim))


class LatentKVCache:
    def __init__(self):
        self.pieces = {}

    def update(self, layer, c_kv, k_pe):
        _size("layer", layer, 0)
        if not isinstance(c_kv, torch.Tensor) or c_kv.dim() != 3:
            raise ValueError("c_kv: expected (B, T, C)")
        if not isinstance(k_pe, torch.Tensor) or k_pe.dim() != 3:
            raise ValueError("k_pe: expected (B, T, R)")
        if (k_pe.shape[0], k_pe.shape[1], k_pe.dtype) != (c_kv.shape[0], c_kv.shape[1], c_kv.dtype):
            raise ValueError("k_pe: batch, tokens and dtype must be c_kv's")
        pieces = self.pieces.get(layer, [])
        if pieces:
            c0, k0 = pieces[0]
            if (c0.shape[0], c0.shape[2], c0.dtype) != (c_kv.shape[0], c_kv.shape[2], c_kv.dtype):
                raise ValueError("c_kv: not the batch, width and dtype this layer holds")
            if k0.shape[2] != k_pe.shape[2]:
                raise ValueError("k_pe: not the width this layer holds")
        self.pieces[layer] = pieces + [(c_kv.detach().clone(), k_pe.detach().clone())]
        return (torch.cat([p[0] for p in self.pieces[layer]], dim=1),
                torch.cat([p[1] for p in self.pieces[layer]], dim=1))

    def seq_len(self, layer=0):
        return sum(p[0].shape[1] for p in self.pieces.get(layer, []))

    def nbytes(self):
        return sum(t.numel() * t.element_size() for pieces in self.pieces.values() for p in pieces for t in p)


def split_kv_b(weight, n_heads, qk_nope_dim, v_head_dim):
    H, N, V = _size("n_heads", n_heads), _size("qk_nope_dim", qk_nope_dim), _size("v_head_dim", v_head_dim)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != H * (N + V):
        raise ValueError(f"weight: expected {H * (N + V)} rows, 2-D")
    w = weight.reshape(H, N + V, -1)
    return w[:, :N], w[:, N:]


def decode_flops(seq_len, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim, *, absorbed):
    S, H = _size("seq_len", seq_len), _size("n_heads", n_heads)
    C, N = _size("kv_lora_rank", kv_lora_rank), _size("qk_nope_dim", qk_nope_dim)
    R, V = _size("qk_rope_dim", qk_rope_dim), _size("v_head_dim", v_head_dim)
    if type(absorbed) is not bool:
        raise ValueError(f"absorbed={absorbed!r}: expected a bool")
    if absorbed:
        return 2 * H * N * C + 2 * H * S * (C + R) + 2 * H * S * C + 2 * H * C * V
    return 2 * H * S * C * (N + V) + 2 * H * S * (N + R) + 2 * H * S * V


def _rope(x, positions, base):
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    R = x.shape[-1]
    inv = (base ** (-torch.arange(0, R, 2, dtype=torch.float64, device=x.device) / R)).to(work)
    ang = positions.to(work)[:, None, :, None] * inv  # (B, 1, T, R/2)
    cos, sin = ang.cos(), ang.sin()
    even, odd = x[..., 0::2].to(work), x[..., 1::2].to(work)
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2).to(x.dtype)


def _softmax(scores):
    scores = scores - scores.amax(-1, keepdim=True)
    e = scores.exp()
    return e / e.sum(-1, keepdim=True)


class MLAttention(nn.Module):
    def __init__(self, hidden_size, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim,
                 q_lora_rank=None, rope_base=10000.0, eps=1e-6):
        super().__init__()
        if _size("qk_rope_dim", qk_rope_dim) % 2:
            raise ValueError("qk_rope_dim: must be even")
        self.H, self.C = _size("n_heads", n_heads), _size("kv_lora_rank", kv_lora_rank)
        self.N, self.R, self.V = _size("qk_nope_dim", qk_nope_dim), qk_rope_dim, _size("v_head_dim", v_head_dim)
        self.D = _size("hidden_size", hidden_size)
        if not rope_base > 0:
            raise ValueError("rope_base: must be positive")
        self.base, self.two_step = rope_base, q_lora_rank is not None
        if self.two_step:
            self.q_a_proj = nn.Linear(hidden_size, _size("q_lora_rank", q_lora_rank), bias=False)
            self.q_a_layernorm = nn.RMSNorm(q_lora_rank, eps=eps)
            self.q_b_proj = nn.Linear(q_lora_rank, n_heads * (qk_nope_dim + qk_rope_dim), bias=False)
        else:
            self.q_proj = nn.Linear(hidden_size, n_heads * (qk_nope_dim + qk_rope_dim), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_dim, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(kv_lora_rank, eps=eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, n_heads * (qk_nope_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(n_heads * v_head_dim, hidden_size, bias=False)

    def forward(self, x, positions, cache=None, layer=0, *, absorbed=True):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[2] != self.D:
            raise ValueError("x: expected (B, T, hidden_size)")
        if not isinstance(positions, torch.Tensor) or positions.is_floating_point() or positions.dtype == torch.bool \
                or positions.shape != x.shape[:2]:
            raise ValueError("positions: expected an integer (B, T) tensor")
        B, T, _ = x.shape
        H, C, N, R, V = self.H, self.C, self.N, self.R, self.V
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.two_step else self.q_proj(x)
        q = q.reshape(B, T, H, N + R).permute(0, 2, 1, 3)  # (B, H, T, N + R)
        q_nope, q_pe = q[..., :N], _rope(q[..., N:], positions, self.base)
        latent, rot = self.kv_a_proj_with_mqa(x).split([C, R], -1)
        latent = self.kv_a_layernorm(latent)
        rot = _rope(rot[:, None], positions, self.base)[:, 0]
        if cache is not None:
            latent, rot = cache.update(layer, latent, rot)
        S = latent.shape[1]
        future = torch.arange(S, device=x.device)[None, :] > torch.arange(S - T, S, device=x.device)[:, None]
        if absorbed:
            w_uk, w_uv = split_kv_b(self.kv_b_proj.weight, H, N, V)
            q_lat = torch.bmm(q_nope.transpose(0, 1).reshape(H, B * T, N), w_uk)  # (H, B*T, C)
            q_lat = q_lat.reshape(H, B, T, C).transpose(0, 1).reshape(B, H * T, C)
            scores = torch.bmm(q_lat, latent.transpose(1, 2)) + torch.bmm(q_pe.reshape(B, H * T, R), rot.transpose(1, 2))
            p = _softmax((scores.reshape(B, H, T, S) / (N + R) ** 0.5).masked_fill(future, float("-inf")))
            summed = torch.bmm(p.reshape(B, H * T, S), latent).reshape(B, H, T, C)
            out = torch.bmm(summed.transpose(0, 1).reshape(H, B * T, C), w_uv.transpose(1, 2))  # (H, B*T, V)
            out = out.reshape(H, B, T, V).permute(1, 2, 0, 3)  # (B, T, H, V)
        else:
            up = self.kv_b_proj(latent).reshape(B, S, H, N + V).permute(0, 2, 1, 3)  # (B, H, S, N + V)
            k = torch.cat([up[..., :N], rot[:, None].expand(B, H, S, R)], -1).reshape(B * H, S, N + R)
            scores = torch.bmm(torch.cat([q_nope, q_pe], -1).reshape(B * H, T, N + R), k.transpose(1, 2))
            p = _softmax((scores.reshape(B, H, T, S) / (N + R) ** 0.5).masked_fill(future, float("-inf")))
            out = torch.bmm(p.reshape(B * H, T, S), up[..., N:].reshape(B * H, S, V)).reshape(B, H, T, V)
            out = out.transpose(1, 2)  # (B, T, H, V)
        return self.o_proj(out.reshape(B, T, H * V))
