"""Kata 07, written from its README: raw (unrotated) keys kept token by token in a sinks list and a window deque, rotated on read; attention as an explicit loop over heads in float64, cast back at the end.

Shapes: B batch, H heads, T new tokens, n kept tokens, D head width.
"""
from __future__ import annotations

import math
from collections import deque

import torch
from torch import nn

from grader.nn import apply_rope


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} = {value!r}: an int >= {minimum} was expected")
    if value < minimum:
        raise ValueError(f"{name} = {value}: an int >= {minimum} was expected")
    return value


def kept_positions(seq_len: int, n_sink: int, window: int) -> list[int]:
    seq_len = _check_int("seq_len", seq_len, 0)
    n_sink = _check_int("n_sink", n_sink, 0)
    window = _check_int("window", window, 1)
    if seq_len <= n_sink + window:
        return list(range(seq_len))
    return list(range(n_sink)) + list(range(seq_len - window, seq_len))


class SinkKVCache:
    def __init__(self, n_sink: int, window: int, rope_base: float = 10000.0):
        self.n_sink = _check_int("n_sink", n_sink, 0)
        self.window = _check_int("window", window, 1)
        if not isinstance(rope_base, (int, float)) or isinstance(rope_base, bool) or not rope_base > 0:
            raise ValueError(f"rope_base = {rope_base!r}: a positive number was expected")
        self.rope_base = float(rope_base)
        # Each entry is one token: (raw key, value), each (B, H, 1, D), owned by the cache.
        self._sinks: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._recent: deque[tuple[torch.Tensor, torch.Tensor]] = deque()
        self._like = None  # (B, H, D, dtype, device) of the first tokens
        self.tokens_seen = 0

    def __len__(self) -> int:
        return len(self._sinks) + len(self._recent)

    def _validate(self, k_new, v_new) -> None:
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if not isinstance(x, torch.Tensor) or x.dim() != 4:
                got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name}: a 4-D tensor (batch, heads, T, head_dim) was expected, got {got}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"v_new: the shape of k_new {tuple(k_new.shape)} was expected, got {tuple(v_new.shape)}")
        if k_new.dtype != v_new.dtype or k_new.device != v_new.device:
            raise ValueError(f"v_new: k_new's dtype and device ({k_new.dtype}, {k_new.device}) were expected, "
                             f"got ({v_new.dtype}, {v_new.device})")
        if self._like is not None:
            B, H, D, dtype, device = self._like
            b, h, _, d = k_new.shape
            if (b, h, d) != (B, H, D) or k_new.dtype != dtype or k_new.device != device:
                raise ValueError(f"k_new: (batch, heads, head_dim) = {(B, H, D)} in {dtype} on {device} was "
                                 f"expected, like the tokens already cached; got {(b, h, d)} in {k_new.dtype} "
                                 f"on {k_new.device}")

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor):
        self._validate(k_new, v_new)
        T = k_new.shape[2]
        capacity = self.n_sink + self.window
        if T > 1 and len(self) + T > capacity:
            raise ValueError(f"k_new: {T} tokens at once would need evictions ({len(self)} held, room for "
                             f"{capacity}); once the cache must evict, tokens come one at a time")
        if self._like is None:
            self._like = (k_new.shape[0], k_new.shape[1], k_new.shape[3], k_new.dtype, k_new.device)
        for t in range(T):
            token = (k_new[:, :, t:t + 1].clone(), v_new[:, :, t:t + 1].clone())
            if len(self._sinks) < self.n_sink:
                self._sinks.append(token)
            else:
                self._recent.append(token)
                if len(self._recent) > self.window:
                    self._recent.popleft()  # the oldest non-sink token leaves
        self.tokens_seen += T
        return self._read(k_new)

    def _read(self, like: torch.Tensor):
        tokens = self._sinks + list(self._recent)
        if not tokens:
            B, H, _, D = like.shape
            empty = like.new_zeros(B, H, 0, D)
            return empty, empty.clone()
        raw_k = torch.cat([k for k, _ in tokens], dim=2)
        values = torch.cat([v for _, v in tokens], dim=2)
        slots = torch.arange(raw_k.shape[2], device=raw_k.device)
        return apply_rope(raw_k, slots, base=self.rope_base), values


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
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: (batch, T, d_model={self.d_model}) was expected, got {got}")
        if not isinstance(cache, SinkKVCache):
            raise ValueError(f"cache: a SinkKVCache was expected, got {type(cache).__name__}")
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        q = self.wq(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = self.wk(x).view(B, T, H, D).transpose(1, 2)
        v = self.wv(x).view(B, T, H, D).transpose(1, 2)
        keys, values = cache.update(k, v)  # (B, H, n, D), keys rotated at 0 … n-1
        n = keys.shape[2]
        q = apply_rope(q, torch.arange(n - T, n, device=x.device), base=self.rope_base)
        # query i (slot n - T + i) may see slots 0 … n - T + i
        visible = torch.arange(n, device=x.device)[None, :] <= torch.arange(n - T, n, device=x.device)[:, None]
        scale = 1.0 / math.sqrt(D)
        heads = []
        for h in range(H):
            qh = q[:, h].double()  # (B, T, D)
            kh, vh = keys[:, h].double(), values[:, h].double()  # (B, n, D)
            scores = (qh @ kh.transpose(1, 2)) * scale  # (B, T, n)
            scores = scores.masked_fill(~visible, float("-inf"))
            heads.append(torch.softmax(scores, dim=-1) @ vh)  # (B, T, D)
        out = torch.stack(heads, dim=2).reshape(B, T, H * D).to(x.dtype)  # (B, T, d_model)
        return self.wo(out)
