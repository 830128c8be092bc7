"""Kata 21, written from its README: selections by a stable ascending argsort of the negated scores;
SnapKV with einsum over (KV head, group) without repeating the keys, the pooling as a conv1d of ones;
the cache in preallocated buffers that double when full, keys rotated once when written, eviction by
compacting the buffers in place with index_select.

Shapes: B batch, Hq query heads, Hkv KV heads, S tokens, W window queries, n held, D head width.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from grader.nn import apply_rope


def _need(ok: bool, name: str, why: str) -> None:
    if not ok:
        raise ValueError(f"{name}: {why}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _pick(scores: torch.Tensor, k: int, tail_from: int, tail: int) -> torch.Tensor:
    best = torch.argsort(-scores, dim=-1, stable=True)[..., :k]  # -x is exact: same order, ties by index
    rest = torch.arange(tail_from, tail_from + tail, device=scores.device)
    both = torch.cat([best, rest.expand(*scores.shape[:2], tail)], dim=-1)
    return both.sort(dim=-1).values


def h2o_keep(scores, budget, recent):
    _need(isinstance(scores, torch.Tensor) and scores.dim() == 3 and scores.is_floating_point(), "scores",
          "a float (batch, kv_heads, S) tensor is required")
    _need(_is_int(budget) and budget >= 1, "budget", f"an int >= 1 is required, not {budget!r}")
    _need(_is_int(recent) and 0 <= recent <= budget, "recent", f"an int in 0 … budget is required, not {recent!r}")
    S = scores.shape[-1]
    if S <= budget:
        return _pick(scores[..., :0], 0, 0, S)
    return _pick(scores[..., :S - recent], budget - recent, S - recent, recent)


def snapkv_scores(q_window, keys, kernel_size=5):
    for name, x in (("q_window", q_window), ("keys", keys)):
        _need(isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point(), name, "a 4-D float tensor")
    _need(_is_int(kernel_size) and kernel_size >= 1 and kernel_size % 2 == 1, "kernel_size", "an odd int >= 1")
    B, Hq, W, D = q_window.shape
    _need(W >= 1, "q_window", "at least one window query")
    _need(keys.shape[0] == B and keys.shape[3] == D and keys.shape[1] >= 1 and Hq % keys.shape[1] == 0
          and keys.shape[2] >= W, "keys", f"shape {tuple(keys.shape)} does not fit q_window {tuple(q_window.shape)}")
    Hkv, S = keys.shape[1], keys.shape[2]
    G, P = Hq // Hkv, S - W
    q = q_window.reshape(B, Hkv, G, W, D)  # contiguous groups: query head h*G + g reads KV head h
    logits = torch.einsum("bhgwd,bhsd->bhgws", q, keys) / math.sqrt(D)
    allowed = torch.ones(W, S, dtype=torch.bool, device=keys.device).tril(diagonal=P)  # query w sees 0 … P + w
    weights = logits.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    votes = weights[..., :P].sum(dim=3) / W  # (B, Hkv, G, P)
    ones = torch.ones(1, 1, kernel_size, dtype=votes.dtype, device=votes.device) / kernel_size
    if P == 0:  # nothing before the window: nothing to vote for
        return votes.sum(dim=2)
    pooled = F.conv1d(votes.reshape(B * Hkv * G, 1, P), ones, padding=kernel_size // 2).reshape(B, Hkv, G, P)
    return pooled.sum(dim=2) / G


def snapkv_keep(scores, budget, window):
    _need(isinstance(scores, torch.Tensor) and scores.dim() == 3 and scores.is_floating_point(), "scores",
          "a float (batch, kv_heads, P) tensor is required")
    _need(_is_int(window) and window >= 1, "window", f"an int >= 1 is required, not {window!r}")
    _need(_is_int(budget) and budget > window, "budget", f"an int above window={window} is required, not {budget!r}")
    P = scores.shape[-1]
    return _pick(scores, min(P, budget - window), P, window)


class ScoredKVCache:
    def __init__(self, budget, recent, rope_base=10000.0):
        _need(_is_int(budget) and budget >= 1, "budget", f"an int >= 1 is required, not {budget!r}")
        _need(_is_int(recent) and 0 <= recent <= budget, "recent", f"an int in 0 … budget, not {recent!r}")
        self.budget, self.recent, self.rope_base = budget, recent, rope_base
        self.reset()

    def reset(self):
        self.tokens_seen, self.n, self.buf = 0, 0, None  # buf: keys, values, positions, scores, capacity along 2

    def __len__(self):
        return self.n

    def _grow(self, k, v, need):
        B, H, _, D = k.shape
        cap = max(need, 8) if self.buf is None else max(need, 2 * self.buf[0].shape[2])
        fresh = (k.new_empty(B, H, cap, D), v.new_empty(B, H, cap, D),
                 torch.empty(B, H, cap, dtype=torch.long, device=k.device),
                 torch.empty(B, H, cap, dtype=torch.float64, device=k.device))
        if self.buf is not None:
            for new, old in zip(fresh, self.buf):
                new[:, :, :self.n] = old[:, :, :self.n]
        self.buf = fresh

    def update(self, k_new, v_new):
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            _need(isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point(), name, "a 4-D float tensor")
        _need(v_new.shape == k_new.shape, "v_new", f"shape {tuple(v_new.shape)} differs from k_new {tuple(k_new.shape)}")
        B, H, T, D = k_new.shape
        _need(T >= 1, "k_new", "at least one token")
        if self.buf is not None:
            k0 = self.buf[0]
            _need((B, H, D) == (k0.shape[0], k0.shape[1], k0.shape[3]), "k_new", "unlike the held tokens")
        if self.buf is None or self.n + T > self.buf[0].shape[2]:
            self._grow(k_new, v_new, self.n + T)
        at = torch.arange(self.tokens_seen, self.tokens_seen + T, device=k_new.device)
        keys, values, pos, score = self.buf
        keys[:, :, self.n:self.n + T] = apply_rope(k_new, at, self.rope_base)
        values[:, :, self.n:self.n + T] = v_new
        pos[:, :, self.n:self.n + T] = at
        score[:, :, self.n:self.n + T] = 0.0
        self.n += T
        self.tokens_seen += T
        return keys[:, :, :self.n], values[:, :, :self.n]

    def _keep(self, idx):
        for t in self.buf:
            view = t[:, :, :self.n]
            wide = idx if t.dim() == 3 else idx[..., None].expand(-1, -1, -1, t.shape[3])
            t[:, :, :idx.shape[2]] = view.gather(2, wide)  # gather copies first: safe in place
        self.n = idx.shape[2]

    def observe(self, probs):
        _need(isinstance(probs, torch.Tensor) and probs.dim() == 4 and probs.is_floating_point(), "probs",
              "a (batch, q_heads, T, n) float tensor")
        _need(self.n > 0 and probs.shape[0] == self.buf[0].shape[0] and probs.shape[1] % self.buf[0].shape[1] == 0
              and probs.shape[2] >= 1 and probs.shape[3] == self.n, "probs",
              f"shape {tuple(probs.shape)} does not fit {self.n} held tokens")
        B, Hq, T, n = probs.shape
        H = self.buf[0].shape[1]
        self.buf[3][:, :, :n] += probs.double().reshape(B, H, Hq // H, T, n).sum(dim=(2, 3))
        if n > self.budget:
            self._keep(h2o_keep(self.buf[3][:, :, :n], self.budget, self.recent))

    def compress(self, keep):
        _need(isinstance(keep, torch.Tensor) and keep.dtype == torch.long and keep.dim() == 3 and self.n > 0
              and tuple(keep.shape[:2]) == tuple(self.buf[0].shape[:2]) and keep.shape[2] >= 1, "keep",
              "a long (batch, kv_heads, m >= 1) tensor is required")
        s = keep.sort(dim=-1).values
        _need(bool((s >= 0).all() and (s < self.n).all() and (s[..., 1:] != s[..., :-1]).all()), "keep",
              f"distinct indices in 0 … {self.n - 1} are required")
        self._keep(s)

    def positions(self):
        _need(self.n > 0, "positions", "the cache is empty")
        return self.buf[2][:, :, :self.n].clone()

    def scores(self):
        _need(self.n > 0, "scores", "the cache is empty")
        return self.buf[3][:, :, :self.n].clone()
