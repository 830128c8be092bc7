"""Kata 07, written from its README: rotated keys re-rotated on eviction (the README's second way).

Shapes: B batch, H heads, T new tokens, n kept tokens (sinks + window), D head width.
Cache tensors are (B, H, n, D); hidden states are (B, T, d_model).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from grader.nn import apply_rope


def _count(name: str, value, least: int) -> None:
    """A size the README bounds below: an int (not a bool) of at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int of at least {least}; {value!r} was given")


def _expect_sizes(n_sink, window) -> None:
    _count("n_sink", n_sink, 0)
    _count("window", window, 1)


def kept_positions(seq_len: int, n_sink: int, window: int) -> list[int]:
    """Every index below n_sink, and every index of the last window: one pass over 0 … seq_len - 1."""
    _expect_sizes(n_sink, window)
    _count("seq_len", seq_len, 0)
    return [i for i in range(seq_len) if i < n_sink or i >= seq_len - window]


def _expect_kv(name: str, x) -> None:
    if not (isinstance(x, torch.Tensor) and x.ndim == 4):
        raise ValueError(f"{name} must be a 4-D tensor (batch, heads, tokens, head_dim); {x!r:.60} was given")


class SinkKVCache:
    """The README's second way: keys stored rotated at their slots (in float32 at least), and the
    window re-rotated by minus one slot each time a token is evicted."""

    def __init__(self, n_sink: int, window: int, rope_base: float = 10000.0):
        _expect_sizes(n_sink, window)
        self.n_sink, self.window, self.rope_base = n_sink, window, rope_base
        self.tokens_seen = 0
        self._k: torch.Tensor | None = None  # rotated at slots 0 … n-1, in a dtype at least as wide as float32
        self._v: torch.Tensor | None = None

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _expect_kv("k_new", k_new)
        _expect_kv("v_new", v_new)
        if k_new.shape != v_new.shape:
            raise ValueError(f"v_new: expected the shape of k_new {tuple(k_new.shape)}, got {tuple(v_new.shape)}")
        if self._v is not None and (k_new.shape[:2] != self._v.shape[:2] or k_new.shape[3] != self._v.shape[3]):
            raise ValueError(f"k_new: expected (batch, heads, *, head_dim) like the cache, got {tuple(k_new.shape)}")
        T, held = k_new.shape[2], len(self)
        if T > 1 and held + T > self.n_sink + self.window:
            raise ValueError(f"k_new: {T} tokens at once would evict; add one token at a time once full")
        wide = torch.promote_types(k_new.dtype, torch.float32)
        if held + T > self.n_sink + self.window:  # one token in, the oldest window token out
            s = self.n_sink
            shifted = apply_rope(self._k[:, :, s + 1:], torch.full((held - s - 1,), -1, device=k_new.device),
                                 self.rope_base)
            self._k = torch.cat([self._k[:, :, :s], shifted], dim=2)
            self._v = torch.cat([self._v[:, :, :s], self._v[:, :, s + 1:]], dim=2)
            held -= 1
        slots = torch.arange(held, held + T, device=k_new.device)
        k_rot = apply_rope(k_new.to(wide), slots, self.rope_base)
        self._k = k_rot if self._k is None else torch.cat([self._k, k_rot], dim=2)
        self._v = v_new.clone() if self._v is None else torch.cat([self._v, v_new], dim=2)
        self.tokens_seen += T
        return self._k.to(k_new.dtype), self._v

    def __len__(self) -> int:
        return 0 if self._v is None else self._v.shape[2]


class SinkAttention(nn.Module):
    """Multi-head attention over a SinkKVCache, RoPE at positions inside the cache."""

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
        """x (B, T, d_model) -> (B, T, d_model), through torch's fused attention with a boolean mask."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: expected (batch, seq, {self.d_model}), got {got}")
        if not isinstance(cache, SinkKVCache):
            raise ValueError(f"cache: expected a SinkKVCache, got {type(cache).__name__}")
        B, T, _ = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(B, T, self.n_heads, self.head_dim).permute(0, 2, 1, 3)  # (B, H, T, D)

        K, V = cache.update(split(self.wk(x)), split(self.wv(x)))  # (B, H, n, D)
        n = K.shape[2]
        where = torch.arange(n - T, n, device=x.device)  # the new tokens' places in the cache
        q = apply_rope(split(self.wq(x)), where, self.rope_base)  # (B, H, T, D)
        allowed = torch.arange(n, device=x.device)[None, :] <= where[:, None]  # (T, n), True: may attend
        out = F.scaled_dot_product_attention(q, K, V, attn_mask=allowed)  # (B, H, T, D)
        return self.wo(out.permute(0, 2, 1, 3).reshape(B, T, self.d_model))  # (B, T, d_model)
