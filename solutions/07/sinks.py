"""Kata 07 — a sink-preserving sliding window (reference solution).

Shapes: B batch, H heads, T new tokens, n kept tokens (sinks + window), D head width.
Cache tensors are (B, H, n, D); hidden states are (B, T, d_model).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from grader.nn import apply_rope


def _expect_sizes(n_sink, window) -> None:
    if not isinstance(n_sink, int) or n_sink < 0:
        raise ValueError(f"n_sink: expected an int >= 0, got {n_sink!r}")
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window: expected an int >= 1, got {window!r}")


def kept_positions(seq_len: int, n_sink: int, window: int) -> list[int]:
    """Original indices of the tokens a sink cache holds after ``seq_len`` tokens.

    The first ``n_sink`` tokens plus the last ``window`` tokens (the window does not count the
    sinks); every token while ``seq_len <= n_sink + window``. Sorted ascending. Negative
    ``seq_len`` or ``n_sink``, or ``window < 1``, raise ValueError naming the argument.
    """
    _expect_sizes(n_sink, window)
    if not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"seq_len: expected an int >= 0, got {seq_len!r}")
    if seq_len <= n_sink + window:
        return list(range(seq_len))
    return list(range(n_sink)) + list(range(seq_len - window, seq_len))


def _expect_kv(name: str, x) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name}: expected a tensor (batch, heads, seq, head_dim), got {got}")


class SinkKVCache:
    """The first ``n_sink`` tokens plus the last ``window`` tokens, keys rotated at their slots."""

    def __init__(self, n_sink: int, window: int, rope_base: float = 10000.0):
        """Empty cache: ``len(cache) == 0``, ``tokens_seen == 0``. Bad sizes raise ValueError."""
        _expect_sizes(n_sink, window)
        self.n_sink, self.window, self.rope_base = n_sink, window, rope_base
        self.tokens_seen = 0
        # Raw (unrotated) keys: a token's rotation depends on its slot, and slots shift.
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add unrotated ``k_new``, ``v_new`` (B, H, T, D); return the kept (keys, values), each
        (B, H, n, D), keys rotated at slots 0 … n-1.

        Evicts the oldest non-sink token once more than ``n_sink + window`` are held. T > 1 is
        allowed only while nothing must be evicted, else ValueError (and nothing changes).
        Never modify the inputs in place.
        """
        _expect_kv("k_new", k_new)
        _expect_kv("v_new", v_new)
        if k_new.shape != v_new.shape:
            raise ValueError(f"v_new: expected the shape of k_new {tuple(k_new.shape)}, got {tuple(v_new.shape)}")
        if self._k is not None and (k_new.shape[:2] != self._k.shape[:2] or k_new.shape[3] != self._k.shape[3]):
            raise ValueError(f"k_new: expected (batch, heads, *, head_dim) like the cache {tuple(self._k.shape)}, "
                             f"got {tuple(k_new.shape)}")
        T = k_new.shape[2]
        if T > 1 and len(self) + T > self.n_sink + self.window:
            raise ValueError(f"k_new: {T} tokens at once would evict from a cache holding {len(self)} of "
                             f"{self.n_sink + self.window}; add one token at a time once it is full")
        K = k_new if self._k is None else torch.cat([self._k, k_new], dim=2)  # (B, H, n + T, D)
        V = v_new if self._v is None else torch.cat([self._v, v_new], dim=2)  # (B, H, n + T, D)
        if K.shape[2] > self.n_sink + self.window:
            # Evict the oldest window token; the sinks never leave.
            K = torch.cat([K[:, :, :self.n_sink], K[:, :, -self.window:]], dim=2)  # (B, H, n, D)
            V = torch.cat([V[:, :, :self.n_sink], V[:, :, -self.window:]], dim=2)  # (B, H, n, D)
        self._k, self._v = K, V
        self.tokens_seen += T
        slots = torch.arange(K.shape[2], device=K.device)  # positions inside the cache, never past n-1
        return apply_rope(K, slots, self.rope_base), V

    def __len__(self) -> int:
        """Tokens kept now (at most n_sink + window)."""
        return 0 if self._k is None else self._k.shape[2]


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

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def forward(self, x: torch.Tensor, cache: SinkKVCache) -> torch.Tensor:
        """x (B, T, d_model) -> out (B, T, d_model); ``cache`` is updated with the new tokens.

        New token i sits at slot n - T + i of the cache after the update (n = len(cache)); its
        query is rotated there, and it attends to slots 0 … n - T + i. A 2-D x, or one of the
        wrong width, raises ValueError naming x; a ``cache`` that is not a SinkKVCache, naming cache.
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: expected (batch, seq, {self.d_model}), got {got}")
        if not isinstance(cache, SinkKVCache):
            raise ValueError(f"cache: expected a SinkKVCache, got {type(cache).__name__}")
        B, T, _ = x.shape
        K, V = cache.update(self._heads(self.wk(x)), self._heads(self.wv(x)))  # (B, H, n, D), keys rotated
        n = K.shape[2]
        slots = torch.arange(n - T, n, device=x.device)  # the new tokens' slots, the last T of the cache
        q = apply_rope(self._heads(self.wq(x)), slots, self.rope_base)  # (B, H, T, D)
        scores = q @ K.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, n)
        cols = torch.arange(n, device=x.device)[None, :]
        scores = scores.masked_fill(cols > slots[:, None], float("-inf"))  # causal within a prefill chunk
        out = torch.softmax(scores, dim=-1) @ V  # (B, H, T, D)
        return self.wo(out.transpose(1, 2).reshape(B, T, self.d_model))  # (B, T, d_model)
