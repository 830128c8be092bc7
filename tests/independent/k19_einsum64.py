"""Kata 19 written from its README: einsum throughout, float64 inside, a cache of chunk lists."""
from __future__ import annotations

import torch
from torch import nn

from grader.nn import apply_rope


def _need(name, value, low=1):
    if type(value) is not int or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def mla_cache_bytes(n_layers, seq_len, kv_lora_rank, qk_rope_dim, dtype_bytes=2, batch=1):
    for name, value in (("n_layers", n_layers), ("kv_lora_rank", kv_lora_rank), ("qk_rope_dim", qk_rope_dim),
                        ("batch", batch)):
        _need(name, value)
    _need("seq_len", seq_len, 0)
    if type(dtype_bytes) not in (int, float) or dtype_bytes <= 0:
        raise ValueError(f"dtype_bytes must be positive, got {dtype_bytes!r}")
    per_token = (kv_lora_rank + qk_rope_dim) * dtype_bytes
    return per_token * seq_len * batch * n_layers


def gqa_groups(kv_lora_rank, qk_rope_dim, head_dim):
    for name, value in (("kv_lora_rank", kv_lora_rank), ("qk_rope_dim", qk_rope_dim), ("head_dim", head_dim)):
        _need(name, value)
    return (kv_lora_rank + qk_rope_dim) / 2 / head_dim


class LatentKVCache:
    def __init__(self):
        self.chunks = {}

    def update(self, layer, c_kv, k_pe):
        _need("layer", layer, 0)
        for name, t in (("c_kv", c_kv), ("k_pe", k_pe)):
            if not torch.is_tensor(t) or t.ndim != 3:
                raise ValueError(f"{name} must be a 3-D tensor")
        if k_pe.shape[0] != c_kv.shape[0] or k_pe.shape[1] != c_kv.shape[1] or k_pe.dtype != c_kv.dtype:
            raise ValueError("k_pe must share c_kv's batch, tokens and dtype")
        held = self.chunks.setdefault(layer, [])
        if held:
            c0, k0 = held[0]
            if c0.shape[0] != c_kv.shape[0] or c0.shape[2] != c_kv.shape[2] or c0.dtype != c_kv.dtype:
                raise ValueError("c_kv does not match what this layer holds")
            if k0.shape[2] != k_pe.shape[2]:
                raise ValueError("k_pe does not match what this layer holds")
        held.append((c_kv.clone(), k_pe.clone()))
        return torch.cat([c for c, _ in held], 1), torch.cat([k for _, k in held], 1)

    def seq_len(self, layer=0):
        return sum(c.shape[1] for c, _ in self.chunks.get(layer, []))

    def nbytes(self):
        return sum(t.nelement() * t.element_size() for held in self.chunks.values() for pair in held for t in pair)


def split_kv_b(weight, n_heads, qk_nope_dim, v_head_dim):
    for name, value in (("n_heads", n_heads), ("qk_nope_dim", qk_nope_dim), ("v_head_dim", v_head_dim)):
        _need(name, value)
    if not torch.is_tensor(weight) or weight.ndim != 2 or weight.shape[0] != n_heads * (qk_nope_dim + v_head_dim):
        raise ValueError("weight must be (n_heads * (qk_nope_dim + v_head_dim), kv_lora_rank)")
    w = weight.unflatten(0, (n_heads, qk_nope_dim + v_head_dim))
    return w.narrow(1, 0, qk_nope_dim), w.narrow(1, qk_nope_dim, v_head_dim)


def decode_flops(seq_len, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim, *, absorbed):
    for name, value in (("seq_len", seq_len), ("n_heads", n_heads), ("kv_lora_rank", kv_lora_rank),
                        ("qk_nope_dim", qk_nope_dim), ("qk_rope_dim", qk_rope_dim), ("v_head_dim", v_head_dim)):
        _need(name, value)
    if absorbed is not True and absorbed is not False:
        raise ValueError("absorbed must be a bool")
    s, h, c, n, r, v = seq_len, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim
    macs = h * n * c + h * s * (c + r) + h * s * c + h * c * v if absorbed else h * s * c * (n + v) + h * s * (n + r + v)
    return 2 * macs


def _rope(x, positions, base):
    d = x.shape[-1]
    perm = list(range(0, d, 2)) + list(range(1, d, 2))
    back = [0] * d
    for i, p in enumerate(perm):
        back[p] = i
    return apply_rope(x[..., perm], positions, base)[..., back]


class MLAttention(nn.Module):
    def __init__(self, hidden_size, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim,
                 q_lora_rank=None, rope_base=10000.0, eps=1e-6):
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("n_heads", n_heads), ("kv_lora_rank", kv_lora_rank),
                            ("qk_nope_dim", qk_nope_dim), ("qk_rope_dim", qk_rope_dim), ("v_head_dim", v_head_dim)):
            _need(name, value)
        if qk_rope_dim % 2:
            raise ValueError("qk_rope_dim must be even")
        if q_lora_rank is not None:
            _need("q_lora_rank", q_lora_rank)
        if rope_base <= 0:
            raise ValueError("rope_base must be positive")
        self.h, self.c, self.n, self.r, self.v = n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim
        self.hidden, self.base, self.q_lora_rank = hidden_size, rope_base, q_lora_rank
        width = n_heads * (qk_nope_dim + qk_rope_dim)
        if q_lora_rank is None:
            self.q_proj = nn.Linear(hidden_size, width, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden_size, q_lora_rank, bias=False)
            self.q_a_layernorm = nn.RMSNorm(q_lora_rank, eps=eps)
            self.q_b_proj = nn.Linear(q_lora_rank, width, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_dim, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(kv_lora_rank, eps=eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, n_heads * (qk_nope_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(n_heads * v_head_dim, hidden_size, bias=False)

    def forward(self, x, positions, cache=None, layer=0, *, absorbed=True):
        if not torch.is_tensor(x) or x.ndim != 3 or x.shape[2] != self.hidden:
            raise ValueError("x must be (batch, seq, hidden_size)")
        if not torch.is_tensor(positions) or positions.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8) \
                or tuple(positions.shape) != tuple(x.shape[:2]):
            raise ValueError("positions must be integers of shape (batch, seq)")
        b, t, _ = x.shape
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.unflatten(-1, (self.h, self.n + self.r)).permute(0, 2, 1, 3)
        q_pe = _rope(q[..., self.n:], positions, self.base)
        kv = self.kv_a_proj_with_mqa(x)
        latent = self.kv_a_layernorm(kv[..., :self.c])
        k_pe = _rope(kv[..., self.c:].unsqueeze(1), positions, self.base).squeeze(1)
        if cache is not None:
            latent, k_pe = cache.update(layer, latent, k_pe)
        s = latent.shape[1]
        dt = x.dtype
        qn, qp, lat, kp = (z.double() for z in (q[..., :self.n], q_pe, latent, k_pe))
        allowed = torch.arange(s, device=x.device)[None, :] <= torch.arange(s - t, s, device=x.device)[:, None]
        if absorbed:
            w_uk, w_uv = split_kv_b(self.kv_b_proj.weight, self.h, self.n, self.v)
            folded = torch.einsum("bhtn,hnc->bhtc", qn, w_uk.double())
            scores = torch.einsum("bhtc,bsc->bhts", folded, lat) + torch.einsum("bhtr,bsr->bhts", qp, kp)
            probs = (scores / (self.n + self.r) ** 0.5).masked_fill(~allowed, float("-inf")).softmax(-1)
            out = torch.einsum("hvc,bhtc->bhtv", w_uv.double(), torch.einsum("bhts,bsc->bhtc", probs, lat))
        else:
            up = self.kv_b_proj(latent).unflatten(-1, (self.h, self.n + self.v)).double()
            scores = torch.einsum("bhtn,bshn->bhts", qn, up[..., :self.n]) + torch.einsum("bhtr,bsr->bhts", qp, kp)
            probs = (scores / (self.n + self.r) ** 0.5).masked_fill(~allowed, float("-inf")).softmax(-1)
            out = torch.einsum("bhts,bshv->bhtv", probs, up[..., self.n:])
        return self.o_proj(out.permute(0, 2, 1, 3).reshape(b, t, self.h * self.v).to(dt))
