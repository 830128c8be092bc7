"""Kata 21, written from its README: selections as Python sorts with (score, index) keys row by row;
SnapKV's votes in float64 with explicit loops over heads and a hand-written pooling; the cache keeps raw
(unrotated) keys per head as Python lists of tokens and rotates each at its true position when read.

Shapes: B batch, Hq query heads, Hkv KV heads, S tokens, W window queries, n held, D head width.
"""
from __future__ import annotations

import math

import torch

from grader.nn import apply_rope


def _int(name, value, least):
    if type(value) is not int or value < least:
        raise ValueError(f"{name} must be an int >= {least}; got {value!r}")
    return value


def _float_tensor(name, x, dims):
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != dims:
        raise ValueError(f"{name} must be a {dims}-D float tensor; got {x!r:.60}")


def _best_first(row: list[float], count: int) -> list[int]:
    """The ``count`` best indices of ``row``; equal values: the lower index first."""
    return sorted(range(len(row)), key=lambda i: (-row[i], i))[:count]


def _rows(scores, pick):
    B, H, _ = scores.shape
    rows = [[sorted(pick(scores[b, h].tolist())) for h in range(H)] for b in range(B)]
    return torch.tensor(rows, dtype=torch.long, device=scores.device).view(B, H, -1)


def h2o_keep(scores, budget, recent):
    _float_tensor("scores", scores, 3)
    _int("budget", budget, 1)
    _int("recent", recent, 0)
    if recent > budget:
        raise ValueError(f"recent ({recent}) may not exceed budget ({budget})")
    S = scores.shape[2]
    if S <= budget:
        return _rows(scores, lambda row: list(range(S)))
    return _rows(scores, lambda row: _best_first(row[:S - recent], budget - recent) + list(range(S - recent, S)))


def snapkv_scores(q_window, keys, kernel_size=5):
    _float_tensor("q_window", q_window, 4)
    _float_tensor("keys", keys, 4)
    if type(kernel_size) is not int or kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be an odd int >= 1; got {kernel_size!r}")
    B, Hq, W, D = q_window.shape
    Bk, Hkv, S, Dk = keys.shape
    if W < 1:
        raise ValueError("q_window holds no query")
    if Bk != B or Dk != D or Hkv < 1 or Hq % Hkv or W > S:
        raise ValueError(f"keys {tuple(keys.shape)} do not fit q_window {tuple(q_window.shape)}")
    G, P, half = Hq // Hkv, S - W, kernel_size // 2
    out = torch.zeros(B, Hkv, P, dtype=torch.float64, device=keys.device)
    for b in range(B):
        for hq in range(Hq):
            q, k = q_window[b, hq].double(), keys[b, hq // G].double()
            votes = torch.zeros(P, dtype=torch.float64, device=keys.device)
            for i in range(W):
                logits = (k[:P + i + 1] @ q[i]) / math.sqrt(D)  # query i sees keys 0 … P + i
                votes += torch.softmax(logits, dim=0)[:P] / W
            for j in range(P):
                lo, hi = max(0, j - half), min(P, j + half + 1)
                out[b, hq // G, j] += votes[lo:hi].sum() / kernel_size / G
    return out.to(device=q_window.device, dtype=q_window.dtype)


def snapkv_keep(scores, budget, window):
    _float_tensor("scores", scores, 3)
    _int("window", window, 1)
    _int("budget", budget, 1)
    if budget <= window:
        raise ValueError(f"budget ({budget}) must exceed window ({window})")
    P = scores.shape[2]
    return _rows(scores, lambda row: _best_first(row, budget - window) + list(range(P, P + window)))


class ScoredKVCache:
    def __init__(self, budget, recent, rope_base=10000.0):
        _int("budget", budget, 1)
        _int("recent", recent, 0)
        if recent > budget:
            raise ValueError(f"recent ({recent}) may not exceed budget ({budget})")
        self.budget, self.recent, self.rope_base = budget, recent, rope_base
        self.reset()

    def reset(self):
        self.tokens_seen = 0
        self.heads = None  # heads[b][h]: list of [position, raw key, value, score]

    def __len__(self):
        return 0 if self.heads is None else len(self.heads[0][0])

    def _read(self):
        keys = torch.stack([torch.stack([apply_rope(torch.stack([t[1] for t in head]),
                                                    torch.tensor([t[0] for t in head]), self.rope_base)
                                         for head in row]) for row in self.heads])
        values = torch.stack([torch.stack([torch.stack([t[2] for t in head]) for head in row]) for row in self.heads])
        return keys, values

    def update(self, k_new, v_new):
        _float_tensor("k_new", k_new, 4)
        _float_tensor("v_new", v_new, 4)
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new {tuple(v_new.shape)} must match k_new {tuple(k_new.shape)}")
        B, H, T, D = k_new.shape
        if T == 0 or (self.heads is not None and (B, H, D) != (len(self.heads), len(self.heads[0]),
                                                              self.heads[0][0][0][1].shape[0])):
            raise ValueError(f"k_new {tuple(k_new.shape)} does not fit this cache")
        if self.heads is None:
            self.heads = [[[] for _ in range(H)] for _ in range(B)]
        for b in range(B):
            for h in range(H):
                for t in range(T):
                    self.heads[b][h].append([self.tokens_seen + t, k_new[b, h, t].clone(), v_new[b, h, t].clone(), 0.0])
        self.tokens_seen += T
        return self._read()

    def observe(self, probs):
        _float_tensor("probs", probs, 4)
        n = len(self)
        if n == 0 or probs.shape[0] != len(self.heads) or probs.shape[1] % len(self.heads[0]) \
                or probs.shape[2] == 0 or probs.shape[3] != n:
            raise ValueError(f"probs {tuple(probs.shape)} do not fit {n} held tokens")
        G = probs.shape[1] // len(self.heads[0])
        paid = probs.double().sum(dim=2).cpu()  # (B, Hq, n)
        for b, row in enumerate(self.heads):
            for h, head in enumerate(row):
                for g in range(G):
                    for j, token in enumerate(head):
                        token[3] += float(paid[b, h * G + g, j])
        if n > self.budget:
            for row in self.heads:
                for h, head in enumerate(row):
                    front = _best_first([t[3] for t in head[:n - self.recent]], self.budget - self.recent)
                    row[h] = [head[i] for i in sorted(front)] + head[n - self.recent:]

    def compress(self, keep):
        n = len(self)
        ok = isinstance(keep, torch.Tensor) and keep.dtype == torch.long and keep.dim() == 3 and n > 0
        if not ok or keep.shape[0] != len(self.heads) or keep.shape[1] != len(self.heads[0]) or keep.shape[2] < 1:
            raise ValueError("keep must be a long (batch, kv_heads, m >= 1) tensor")
        rows = keep.tolist()
        for r in (r for row in rows for r in row):
            if len(set(r)) != len(r) or min(r) < 0 or max(r) >= n:
                raise ValueError(f"keep must hold distinct indices in 0 … {n - 1}; got {r}")
        for b, row in enumerate(self.heads):
            for h, head in enumerate(row):
                row[h] = [head[i] for i in sorted(rows[b][h])]

    def positions(self):
        if not len(self):
            raise ValueError("positions of an empty cache")
        device = self.heads[0][0][0][1].device
        return torch.tensor([[[t[0] for t in head] for head in row] for row in self.heads], device=device)

    def scores(self):
        if not len(self):
            raise ValueError("scores of an empty cache")
        device = self.heads[0][0][0][1].device
        return torch.tensor([[[t[3] for t in head] for head in row] for row in self.heads], dtype=torch.float64,
                            device=device)
