"""Kata 19 — multi-head latent attention (reference solution).

Shapes: B batch, H heads, T new tokens, P cached tokens, S = P + T, C the latent width (kv_lora_rank),
R the shared rotary width (qk_rope_dim), N the no-rotation part of a query/key head (qk_nope_dim),
V the value head width (v_head_dim). The cache holds per token one latent (C) and one rotary key (R):
no head axis anywhere.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from grader.nn import apply_rope


def _count(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: expected an int of at least {low}, got {value!r}")
    return value


def mla_cache_bytes(n_layers, seq_len, kv_lora_rank, qk_rope_dim, dtype_bytes=2, batch=1):
    """Bytes of a latent cache: per layer, sequence and token one latent (kv_lora_rank) and one rotary key."""
    for name, value in (("n_layers", n_layers), ("kv_lora_rank", kv_lora_rank), ("qk_rope_dim", qk_rope_dim),
                        ("batch", batch)):
        _count(name, value)
    _count("seq_len", seq_len, 0)
    if isinstance(dtype_bytes, bool) or not isinstance(dtype_bytes, (int, float)) or not dtype_bytes > 0:
        raise ValueError(f"dtype_bytes: expected a positive number of bytes per element, got {dtype_bytes!r}")
    # Why no factor 2: the latent stands for both K and V; the rotary key is the only other thing stored.
    return n_layers * batch * seq_len * (kv_lora_rank + qk_rope_dim) * dtype_bytes


def gqa_groups(kv_lora_rank, qk_rope_dim, head_dim) -> float:
    """The number of KV heads of width head_dim (K and V each) that hold as many bytes per token as MLA."""
    for name, value in (("kv_lora_rank", kv_lora_rank), ("qk_rope_dim", qk_rope_dim), ("head_dim", head_dim)):
        _count(name, value)
    return (kv_lora_rank + qk_rope_dim) / (2 * head_dim)


class LatentKVCache:
    """Per layer, the latents (B, S, C) and the shared rotary keys (B, S, R) of every token seen."""

    def __init__(self):
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, layer: int, c_kv: torch.Tensor, k_pe: torch.Tensor):
        """Append T tokens' (B, T, C) latents and (B, T, R) rotary keys; return all (B, S, C), (B, S, R)."""
        _count("layer", layer, 0)
        for name, t in (("c_kv", c_kv), ("k_pe", k_pe)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name}: expected a 3-D tensor (batch, new_tokens, width), got {got}")
        if c_kv.shape[:2] != k_pe.shape[:2] or c_kv.dtype != k_pe.dtype:
            raise ValueError(f"k_pe: expected the batch, tokens and dtype of c_kv {tuple(c_kv.shape[:2])} {c_kv.dtype}, "
                             f"got {tuple(k_pe.shape[:2])} {k_pe.dtype}")
        if layer in self.layers:
            C, K = self.layers[layer]
            for name, old, new in (("c_kv", C, c_kv), ("k_pe", K, k_pe)):
                if (old.shape[0], old.shape[2], old.dtype) != (new.shape[0], new.shape[2], new.dtype):
                    raise ValueError(f"{name}: layer {layer} holds batch {old.shape[0]}, width {old.shape[2]}, "
                                     f"{old.dtype}; got {new.shape[0]}, {new.shape[2]}, {new.dtype}")
            c_kv, k_pe = torch.cat([C, c_kv], dim=1), torch.cat([K, k_pe], dim=1)  # (B, S, C), (B, S, R)
        else:
            c_kv, k_pe = c_kv.clone(), k_pe.clone()  # the caller's tensors stay the caller's
        self.layers[layer] = (c_kv, k_pe)
        return c_kv, k_pe

    def seq_len(self, layer: int = 0) -> int:
        return self.layers[layer][0].shape[1] if layer in self.layers else 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.layers.values() for t in pair)


def split_kv_b(weight: torch.Tensor, n_heads: int, qk_nope_dim: int, v_head_dim: int):
    """kv_b_proj.weight (H * (N + V), C) -> (W_UK (H, N, C), W_UV (H, V, C)); head h owns rows h*(N+V) …"""
    for name, value in (("n_heads", n_heads), ("qk_nope_dim", qk_nope_dim), ("v_head_dim", v_head_dim)):
        _count(name, value)
    rows = n_heads * (qk_nope_dim + v_head_dim)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != rows:
        got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight: expected ({rows}, kv_lora_rank) = (n_heads * (qk_nope_dim + v_head_dim), C), got {got}")
    per_head = weight.view(n_heads, qk_nope_dim + v_head_dim, weight.shape[1])  # (H, N + V, C)
    return per_head[:, :qk_nope_dim], per_head[:, qk_nope_dim:]  # (H, N, C), (H, V, C)


def decode_flops(seq_len, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim, *, absorbed) -> int:
    """FLOPs (2 per multiply-add) of one decode step, one sequence, one layer, from the latents to the
    heads' outputs: what naive and absorbed decode do differently (projections of the new token left out)."""
    S, H, C = _count("seq_len", seq_len), _count("n_heads", n_heads), _count("kv_lora_rank", kv_lora_rank)
    N, R, V = _count("qk_nope_dim", qk_nope_dim), _count("qk_rope_dim", qk_rope_dim), _count("v_head_dim", v_head_dim)
    if not isinstance(absorbed, bool):
        raise ValueError(f"absorbed: expected True or False, got {absorbed!r}")
    if absorbed:  # fold W_UK into the query, score C + R wide, sum latents, W_UV once per head
        return 2 * H * (N * C + S * (C + R) + S * C + C * V)
    return 2 * H * (S * C * (N + V) + S * (N + R) + S * V)  # up-project S latents, then plain attention


def _rope_interleaved(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x (B, H, T, R) by positions (B, T); the layout stays interleaved."""
    halves = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)  # (B, H, T, R): evens, then odds
    turned = apply_rope(halves, positions, base)  # rotate-half pairs i and i + R/2: the original pairs
    half = x.shape[-1] // 2
    return torch.stack([turned[..., :half], turned[..., half:]], dim=-1).flatten(-2)  # (B, H, T, R)


class MLAttention(nn.Module):
    """Multi-head latent attention with DeepSeek's parameter names; caches one latent and one rotary key a token."""

    def __init__(self, hidden_size: int, n_heads: int, kv_lora_rank: int, qk_nope_dim: int, qk_rope_dim: int,
                 v_head_dim: int, q_lora_rank: int | None = None, rope_base: float = 10000.0, eps: float = 1e-6):
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("n_heads", n_heads), ("kv_lora_rank", kv_lora_rank),
                            ("qk_nope_dim", qk_nope_dim), ("v_head_dim", v_head_dim)):
            _count(name, value)
        if _count("qk_rope_dim", qk_rope_dim) % 2:
            raise ValueError(f"qk_rope_dim: expected an even width (RoPE turns pairs), got {qk_rope_dim}")
        if not rope_base > 0:
            raise ValueError(f"rope_base: expected a positive base, got {rope_base!r}")
        self.hidden_size, self.n_heads, self.kv_lora_rank = hidden_size, n_heads, kv_lora_rank
        self.qk_nope_dim, self.qk_rope_dim, self.v_head_dim = qk_nope_dim, qk_rope_dim, v_head_dim
        self.q_lora_rank, self.rope_base = q_lora_rank, rope_base
        q_width = n_heads * (qk_nope_dim + qk_rope_dim)
        if q_lora_rank is None:
            self.q_proj = nn.Linear(hidden_size, q_width, bias=False)
        else:
            _count("q_lora_rank", q_lora_rank)
            self.q_a_proj = nn.Linear(hidden_size, q_lora_rank, bias=False)
            self.q_a_layernorm = nn.RMSNorm(q_lora_rank, eps=eps)
            self.q_b_proj = nn.Linear(q_lora_rank, q_width, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_dim, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(kv_lora_rank, eps=eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, n_heads * (qk_nope_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(n_heads * v_head_dim, hidden_size, bias=False)

    def _check(self, x, positions) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.hidden_size:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: expected (batch, seq, {self.hidden_size}), got {got}")
        ok = isinstance(positions, torch.Tensor) and positions.shape == x.shape[:2] \
            and not positions.is_floating_point() and not positions.is_complex() and positions.dtype != torch.bool
        if not ok:
            got = (f"{tuple(positions.shape)} {positions.dtype}" if isinstance(positions, torch.Tensor)
                   else type(positions).__name__)
            raise ValueError(f"positions: expected integer positions of shape {tuple(x.shape[:2])} (batch, seq), got {got}")

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None, layer: int = 0, *, absorbed: bool = True):
        """x (B, T, hidden), positions (B, T) -> (B, T, hidden). ``cache``: None (attend to these tokens only)
        or an object whose update(layer, c_kv, k_pe) stores them and returns every token's (B, S, C), (B, S, R)."""
        self._check(x, positions)
        B, T, _ = x.shape
        H, N, R = self.n_heads, self.qk_nope_dim, self.qk_rope_dim
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, H, N + R).transpose(1, 2)  # (B, H, T, N + R)
        q_nope, q_pe = q[..., :N], _rope_interleaved(q[..., N:], positions, self.rope_base)  # (B,H,T,N), (B,H,T,R)
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, R], dim=-1)  # (B, T, C), (B, T, R)
        # Why the norm before the cache and RoPE on k_pe only: the latent must stay position-free to absorb W_UK.
        c_kv = self.kv_a_layernorm(c_kv)  # (B, T, C)
        k_pe = _rope_interleaved(k_pe[:, None], positions, self.rope_base)[:, 0]  # (B, T, R)
        if cache is not None:
            c_kv, k_pe = cache.update(layer, c_kv, k_pe)  # (B, S, C), (B, S, R)
        S = c_kv.shape[1]
        visible = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)  # (T, S): new token i sees 0 … S-T+i
        attend = self._absorbed if absorbed else self._naive
        out = attend(q_nope, q_pe, c_kv, k_pe, visible)  # (B, H, T, V)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * self.v_head_dim))  # (B, T, hidden)

    def _softmax(self, scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        scale = 1 / math.sqrt(self.qk_nope_dim + self.qk_rope_dim)  # the head's query-key width, absorbed or not
        return torch.softmax((scores * scale).masked_fill(~visible, float("-inf")), dim=-1)

    def _naive(self, q_nope, q_pe, c_kv, k_pe, visible):
        B, S, _ = c_kv.shape
        H, N = self.n_heads, self.qk_nope_dim
        kv = self.kv_b_proj(c_kv).view(B, S, H, N + self.v_head_dim).transpose(1, 2)  # (B, H, S, N + V)
        k_nope, v = kv[..., :N], kv[..., N:]  # (B, H, S, N), (B, H, S, V)
        scores = q_nope @ k_nope.transpose(-2, -1) + q_pe @ k_pe[:, None].transpose(-2, -1)  # (B, H, T, S)
        return self._softmax(scores, visible) @ v  # (B, H, T, V)

    def _absorbed(self, q_nope, q_pe, c_kv, k_pe, visible):
        B, H, T, _ = q_nope.shape
        w_uk, w_uv = split_kv_b(self.kv_b_proj.weight, H, self.qk_nope_dim, self.v_head_dim)  # (H,N,C), (H,V,C)
        q_lat = torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk).reshape(B, H * T, -1)  # (B, H*T, C)
        # Why one key head: every query head reads the same latents and rotary keys (MQA over C + R).
        scores = q_lat @ c_kv.transpose(1, 2) + q_pe.reshape(B, H * T, -1) @ k_pe.transpose(1, 2)  # (B, H*T, S)
        weights = self._softmax(scores.view(B, H, T, -1), visible)  # (B, H, T, S)
        o_lat = (weights.reshape(B, H * T, -1) @ c_kv).view(B, H, T, -1)  # (B, H, T, C)
        return torch.einsum("bhtc,hvc->bhtv", o_lat, w_uv)  # (B, H, T, V)
