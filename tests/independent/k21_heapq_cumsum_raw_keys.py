"""Kata 21, written from its README: selections with heapq.nlargest on (score, -index) pairs; SnapKV's
softmax through logsumexp in float64, one group at a time, the pooling by differences of a cumulative
sum; the cache stores raw keys and their positions as tensors, and rotates them head by head on read
with apply_rope's per-row positions.

Shapes: B batch, Hq query heads, Hkv KV heads, S tokens, W window queries, n held, D head width.
"""
from __future__ import annotations

import heapq
import math

import torch

from grader.nn import apply_rope


class _Bad(ValueError):
    pass


def _count(name, value, least):
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"{name} should be an int, got {type(value).__name__}")
    if value < least:
        raise _Bad(f"{name} should be at least {least}, got {value}")


def _select(scores: torch.Tensor, how_many: int, front: int, tail: int) -> torch.Tensor:
    """Per row: the ``how_many`` best of the first ``front`` scores, and the ``tail`` indices after them."""
    B, H = scores.shape[:2]
    flat = scores[..., :front].reshape(B * H, front).tolist()
    rows = []
    for row in flat:
        best = heapq.nlargest(how_many, ((v, -i) for i, v in enumerate(row)))
        rows.append(sorted(-i for _, i in best) + list(range(front, front + tail)))
    return torch.tensor(rows, dtype=torch.long).reshape(B, H, how_many + tail).to(scores.device)


def _scores_ok(scores):
    if not (isinstance(scores, torch.Tensor) and scores.ndim == 3 and scores.dtype.is_floating_point):
        raise _Bad("scores should be a float tensor (batch, kv_heads, seq)")


def h2o_keep(scores, budget, recent):
    _scores_ok(scores)
    _count("budget", budget, 1)
    _count("recent", recent, 0)
    if recent > budget:
        raise _Bad(f"recent={recent} is larger than budget={budget}")
    S = scores.shape[-1]
    if S <= budget:
        return _select(scores, 0, 0, S)
    return _select(scores, budget - recent, S - recent, recent)


def snapkv_scores(q_window, keys, kernel_size=5):
    for name, x in (("q_window", q_window), ("keys", keys)):
        if not (isinstance(x, torch.Tensor) and x.ndim == 4 and x.dtype.is_floating_point):
            raise _Bad(f"{name} should be a 4-D float tensor")
    _count("kernel_size", kernel_size, 1)
    if kernel_size % 2 != 1:
        raise _Bad(f"kernel_size should be odd, got {kernel_size}")
    B, Hq, W, D = q_window.shape
    if W == 0:
        raise _Bad("q_window has no query in its window")
    if keys.shape[0] != B or keys.shape[3] != D or keys.shape[1] == 0 or Hq % keys.shape[1] or keys.shape[2] < W:
        raise _Bad(f"keys {tuple(keys.shape)} cannot be read by q_window {tuple(q_window.shape)}")
    Hkv, S = keys.shape[1], keys.shape[2]
    G, P, r = Hq // Hkv, S - W, kernel_size // 2
    total = torch.zeros(B, Hkv, P, dtype=torch.float64, device=keys.device)
    pos_q = torch.arange(P, S, device=keys.device)[:, None]
    hidden = torch.arange(S, device=keys.device)[None, :] > pos_q  # (W, S): keys after the query
    for g in range(G):
        q = q_window[:, [h * G + g for h in range(Hkv)]].double()  # member g of every group
        logits = (q @ keys.double().transpose(-1, -2)) / math.sqrt(D)  # (B, Hkv, W, S)
        logits = logits.masked_fill(hidden, -math.inf)
        probs = (logits - logits.logsumexp(-1, keepdim=True)).exp()[..., :P]
        votes = probs.mean(dim=2)  # (B, Hkv, P)
        padded = torch.nn.functional.pad(votes, (r + 1, r))  # a zero in front for the differences
        c = padded.cumsum(-1)
        total += (c[..., kernel_size:] - c[..., :-kernel_size]) / kernel_size
    return (total / G).to(q_window.dtype)


def snapkv_keep(scores, budget, window):
    _scores_ok(scores)
    _count("window", window, 1)
    _count("budget", budget, window + 1)
    P = scores.shape[-1]
    return _select(scores, min(P, budget - window), P, window)


class ScoredKVCache:
    def __init__(self, budget, recent, rope_base=10000.0):
        _count("budget", budget, 1)
        _count("recent", recent, 0)
        if recent > budget:
            raise _Bad(f"recent={recent} is larger than budget={budget}")
        self.budget, self.recent, self.base = budget, recent, rope_base
        self.reset()

    def reset(self):
        self.tokens_seen = 0
        self.raw_k = self.v = self.pos = self.tot = None

    def __len__(self):
        return 0 if self.pos is None else self.pos.shape[-1]

    def _rotated(self):
        heads = [apply_rope(self.raw_k[:, h:h + 1], self.pos[:, h], self.base) for h in range(self.pos.shape[1])]
        return torch.cat(heads, dim=1)

    def update(self, k_new, v_new):
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if not (isinstance(x, torch.Tensor) and x.ndim == 4 and x.dtype.is_floating_point):
                raise _Bad(f"{name} should be a 4-D float tensor")
        if v_new.shape != k_new.shape:
            raise _Bad(f"v_new should have the shape of k_new {tuple(k_new.shape)}, got {tuple(v_new.shape)}")
        B, H, T, D = k_new.shape
        if T < 1:
            raise _Bad("k_new holds no token")
        if self.pos is not None and (B, H, D) != (self.raw_k.shape[0], self.raw_k.shape[1], self.raw_k.shape[3]):
            raise _Bad(f"k_new {tuple(k_new.shape)} does not match the cache {tuple(self.raw_k.shape)}")
        new_pos = (self.tokens_seen + torch.arange(T, device=k_new.device)).repeat(B, H, 1)
        zeros = torch.zeros(B, H, T, dtype=torch.float64, device=k_new.device)
        if self.pos is None:
            self.raw_k, self.v, self.pos, self.tot = k_new.clone(), v_new.clone(), new_pos, zeros
        else:
            self.raw_k = torch.cat((self.raw_k, k_new), 2)
            self.v = torch.cat((self.v, v_new), 2)
            self.pos = torch.cat((self.pos, new_pos), 2)
            self.tot = torch.cat((self.tot, zeros), 2)
        self.tokens_seen += T
        return self._rotated(), self.v.clone()

    def _take(self, idx):
        self.raw_k = torch.take_along_dim(self.raw_k, idx[..., None], dim=2)
        self.v = torch.take_along_dim(self.v, idx[..., None], dim=2)
        self.pos = torch.take_along_dim(self.pos, idx, dim=2)
        self.tot = torch.take_along_dim(self.tot, idx, dim=2)

    def observe(self, probs):
        n = len(self)
        if not (isinstance(probs, torch.Tensor) and probs.ndim == 4 and probs.dtype.is_floating_point) or n == 0 \
                or probs.shape[0] != self.pos.shape[0] or probs.shape[1] % self.pos.shape[1] \
                or probs.shape[2] < 1 or probs.shape[3] != n:
            raise _Bad(f"probs should be (batch, q_heads, T, {n}) weights over the held tokens")
        H = self.pos.shape[1]
        G = probs.shape[1] // H
        for h in range(H):
            self.tot[:, h] += probs[:, h * G:(h + 1) * G].double().sum(dim=(1, 2))
        if n > self.budget:
            self._take(h2o_keep(self.tot, self.budget, self.recent))

    def compress(self, keep):
        n = len(self)
        if not (isinstance(keep, torch.Tensor) and keep.dtype == torch.int64 and keep.ndim == 3) or n == 0 \
                or keep.shape[:2] != self.pos.shape[:2] or keep.shape[2] == 0:
            raise _Bad("keep should be an int64 tensor (batch, kv_heads, m) with m >= 1")
        s = keep.sort(-1).values
        if s.min() < 0 or s.max() >= n or bool((s.diff(dim=-1) == 0).any()):
            raise _Bad(f"keep should name distinct held tokens 0 … {n - 1}")
        self._take(s)

    def positions(self):
        if len(self) == 0:
            raise _Bad("positions: nothing is held")
        return self.pos.clone()

    def scores(self):
        if len(self) == 0:
            raise _Bad("scores: nothing is held")
        return self.tot.clone()
