"""Kata 07, written from its README: keys stored already rotated, in float64 (the wider dtype the README allows), the shifted window re-rotated by minus one position on each eviction; tensors cut with slicing and torch.cat; attention with SDPA and a boolean mask.

Shapes: B batch, H heads, T new tokens, n kept tokens, D head width.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from grader.nn import apply_rope


def _size(name, value, low):
    if type(value) is not int or value < low:
        raise ValueError(f"{name} must be an int of at least {low}; got {value!r}")
    return value


def kept_positions(seq_len: int, n_sink: int, window: int) -> list[int]:
    seq_len, n_sink, window = _size("seq_len", seq_len, 0), _size("n_sink", n_sink, 0), _size("window", window, 1)
    sinks = set(range(min(n_sink, seq_len)))
    recent = set(range(max(0, seq_len - window), seq_len))
    return sorted(sinks | recent)


class SinkKVCache:
    def __init__(self, n_sink: int, window: int, rope_base: float = 10000.0):
        self.n_sink = _size("n_sink", n_sink, 0)
        self.window = _size("window", window, 1)
        try:
            ok = float(rope_base) > 0
        except (TypeError, ValueError):
            ok = False
        if not ok or isinstance(rope_base, bool):
            raise ValueError(f"rope_base must be a positive number; got {rope_base!r}")
        self.rope_base = rope_base
        self._k = None  # (B, H, n, D) float64, rotated at slots 0 … n-1
        self._v = None  # (B, H, n, D) in the inputs' dtype
        self.tokens_seen = 0

    def __len__(self) -> int:
        return 0 if self._k is None else self._k.shape[2]

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor):
        if not isinstance(k_new, torch.Tensor) or k_new.ndim != 4:
            raise ValueError(f"k_new must be a 4-D tensor (batch, heads, T, head_dim); got "
                             f"{tuple(k_new.shape) if isinstance(k_new, torch.Tensor) else type(k_new).__name__}")
        if not isinstance(v_new, torch.Tensor) or v_new.shape != k_new.shape:
            raise ValueError(f"v_new must be a tensor shaped like k_new {tuple(k_new.shape)}; got "
                             f"{tuple(v_new.shape) if isinstance(v_new, torch.Tensor) else type(v_new).__name__}")
        if v_new.dtype != k_new.dtype:
            raise ValueError(f"v_new must have k_new's dtype {k_new.dtype}; got {v_new.dtype}")
        if self._v is not None:
            want = (self._v.shape[0], self._v.shape[1], self._v.shape[3])
            got = (k_new.shape[0], k_new.shape[1], k_new.shape[3])
            if got != want or k_new.dtype != self._v.dtype or k_new.device != self._v.device:
                raise ValueError(f"k_new must match the cached tokens' (batch, heads, head_dim) {want}, "
                                 f"{self._v.dtype} on {self._v.device}; got {got}, {k_new.dtype} on {k_new.device}")
        n, T = len(self), k_new.shape[2]
        cap = self.n_sink + self.window
        if T > 1 and n + T > cap:
            raise ValueError(f"k_new must hold a single token once the cache would evict: {n} held + {T} new "
                             f"> {cap} = n_sink + window")
        raw = k_new.to(torch.float64)
        if self._k is None:
            B, H, _, D = k_new.shape
            self._k = raw.new_zeros(B, H, 0, D)
            self._v = v_new.new_zeros(B, H, 0, D)
        if n + T <= cap:
            rotated = apply_rope(raw, torch.arange(n, n + T, device=raw.device), self.rope_base)
            self._k = torch.cat([self._k, rotated], dim=2)
            self._v = torch.cat([self._v, v_new], dim=2)
        else:  # T == 1, the cache is full: slot n_sink leaves, the window behind it shifts one slot left
            s = self.n_sink
            shifted = self._k[:, :, s + 1:]
            back = torch.full((shifted.shape[2],), -1, dtype=torch.long, device=raw.device)
            shifted = apply_rope(shifted, back, self.rope_base)  # turning by -theta(1): slot p -> p - 1
            newest = apply_rope(raw, torch.tensor([cap - 1], device=raw.device), self.rope_base)
            self._k = torch.cat([self._k[:, :, :s], shifted, newest], dim=2)
            self._v = torch.cat([self._v[:, :, :s], self._v[:, :, s + 1:], v_new], dim=2)
        self.tokens_seen += T
        return self._k.to(k_new.dtype, copy=True), self._v.clone()  # the caller's copies


class SinkAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, n_sink: int, window: int, rope_base: float = 10000.0):
        super().__init__()
        if n_heads <= 0 or d_model <= 0 or d_model % n_heads or (d_model // n_heads) % 2:
            raise ValueError(f"n_heads: expected a divisor of d_model={d_model} leaving an even head width, "
                             f"got {n_heads}")
        if n_sink < 0:
            raise ValueError(f"n_sink: expected an int >= 0, got {n_sink!r}")
        if window < 1:
            raise ValueError(f"window: expected an int >= 1, got {window!r}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.n_sink, self.window, self.rope_base = n_sink, window, rope_base
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, cache: SinkKVCache) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[2] != self.d_model:
            raise ValueError(f"x must be (batch, T, {self.d_model}); got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if not isinstance(cache, SinkKVCache):
            raise ValueError(f"cache must be a SinkKVCache; got {type(cache).__name__}")
        B, T, _ = x.shape
        split = lambda t: t.unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.wq(x)), split(self.wk(x)), split(self.wv(x))  # (B, H, T, D)
        keys, values = cache.update(k, v)
        n = keys.shape[2]
        q = apply_rope(q, torch.arange(n - T, n, device=x.device), self.rope_base)
        mask = torch.ones(T, n, dtype=torch.bool, device=x.device).tril(n - T)  # row i sees slots <= n - T + i
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # (B, H, T, D)
        return self.wo(out.transpose(1, 2).reshape(B, T, self.d_model))
