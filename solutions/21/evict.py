"""Kata 21 — eviction by attention score (reference solution).

Shapes: B batch, Hq query heads, Hkv KV heads, S tokens, W window queries, T new tokens,
n tokens held, D head width. Cache tensors are (B, Hkv, n, D).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from grader.nn import apply_rope


def _expect_int(name: str, value, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}: expected an int >= {least}, got {value!r}")


def _expect_tensor(name: str, x, dims: int, what: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != dims or not x.is_floating_point():
        got = f"{x.dtype} shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name}: expected a float tensor {what}, got {got}")


def _top_then_rest(scores: torch.Tensor, k: int, rest: int) -> torch.Tensor:
    """Indices of the k best of ``scores`` (B, H, P) plus P … P + rest - 1, ascending per row."""
    P = scores.shape[-1]
    # A stable sort keeps equal scores in index order: on a tie the older token wins.
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]  # (B, H, k)
    tail = torch.arange(P, P + rest, device=scores.device).expand(*scores.shape[:-1], rest)  # (B, H, rest)
    return torch.sort(torch.cat([order, tail], dim=-1), dim=-1).values  # (B, H, k + rest)


def h2o_keep(scores: torch.Tensor, budget: int, recent: int) -> torch.Tensor:
    """scores (B, Hkv, S) -> long (B, Hkv, min(S, budget)): the last ``recent`` tokens plus the
    ``budget - recent`` best scored of the others, ascending; ties keep the older token."""
    _expect_tensor("scores", scores, 3, "(batch, kv_heads, seq)")
    _expect_int("budget", budget, 1)
    _expect_int("recent", recent, 0)
    if recent > budget:
        raise ValueError(f"recent: expected at most budget={budget}, got {recent}")
    S = scores.shape[-1]
    if S <= budget:
        return torch.arange(S, device=scores.device).expand(*scores.shape[:-1], S).clone()
    return _top_then_rest(scores[..., :S - recent], budget - recent, recent)


def snapkv_scores(q_window: torch.Tensor, keys: torch.Tensor, kernel_size: int = 5) -> torch.Tensor:
    """q_window (B, Hq, W, D), keys (B, Hkv, S, D), both rotated -> (B, Hkv, S - W): what the last W
    queries pay each earlier key, averaged over the window, pooled, averaged over the group."""
    _expect_tensor("q_window", q_window, 4, "(batch, q_heads, window, head_dim)")
    _expect_tensor("keys", keys, 4, "(batch, kv_heads, seq, head_dim)")
    _expect_int("kernel_size", kernel_size, 1)
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size: expected an odd int, got {kernel_size}")
    B, Hq, W, D = q_window.shape
    _, Hkv, S, _ = keys.shape
    if W == 0:
        raise ValueError(f"q_window: expected at least one window query, got shape {tuple(q_window.shape)}")
    if keys.shape[0] != B or keys.shape[3] != D or Hkv == 0 or Hq % Hkv or W > S:
        raise ValueError(f"keys: expected (batch={B}, a divisor of {Hq} heads, at least {W} tokens, head_dim={D}), "
                         f"got {tuple(keys.shape)}")
    G = Hq // Hkv
    K = keys.repeat_interleave(G, dim=1)  # (B, Hq, S, D): for the product only, never returned
    logits = q_window @ K.transpose(-2, -1) / math.sqrt(D)  # (B, Hq, W, S)
    rows = torch.arange(S - W, S, device=keys.device)[:, None]  # the window queries' positions
    cols = torch.arange(S, device=keys.device)[None, :]
    logits = logits.masked_fill(cols > rows, float("-inf"))  # causal inside the window
    probs = torch.softmax(logits, dim=-1)[..., :S - W]  # (B, Hq, W, S - W): over every key, then the prefix
    votes = probs.mean(dim=2)  # (B, Hq, S - W)
    # Average pooling: each key also gets its neighbours' votes, missing ones past the ends count as zero.
    pooled = F.avg_pool1d(votes.reshape(B * Hq, 1, S - W), kernel_size, stride=1, padding=kernel_size // 2,
                          count_include_pad=True) if S > W else votes.reshape(B * Hq, 1, 0)
    return pooled.reshape(B, Hkv, G, S - W).mean(dim=2)  # (B, Hkv, S - W): the group's mean


def snapkv_keep(scores: torch.Tensor, budget: int, window: int) -> torch.Tensor:
    """scores (B, Hkv, P) of the prefix -> long (B, Hkv, min(P + window, budget)): the ``budget - window``
    best scored prefix tokens plus the window P … P + window - 1, ascending; ties keep the older token."""
    _expect_tensor("scores", scores, 3, "(batch, kv_heads, prefix)")
    _expect_int("window", window, 1)
    _expect_int("budget", budget, 1)
    if budget <= window:
        raise ValueError(f"budget: expected more than window={window}, got {budget}")
    P = scores.shape[-1]
    return _top_then_rest(scores, min(P, budget - window), window)


class ScoredKVCache:
    """One layer's kept tokens per KV head, keys rotated at their true positions, with their scores."""

    def __init__(self, budget: int, recent: int, rope_base: float = 10000.0):
        """Empty cache. ``budget`` >= 1 tokens per head after ``observe``; ``recent`` <= budget never evicted."""
        _expect_int("budget", budget, 1)
        _expect_int("recent", recent, 0)
        if recent > budget:
            raise ValueError(f"recent: expected at most budget={budget}, got {recent}")
        self.budget, self.recent, self.rope_base = budget, recent, rope_base
        self.reset()

    def reset(self) -> None:
        """Forget every token: an empty cache, tokens_seen 0."""
        self.tokens_seen = 0
        self._k = self._v = self._pos = self._score = None

    def __len__(self) -> int:
        return 0 if self._k is None else self._k.shape[2]

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append unrotated k_new, v_new (B, Hkv, T, D), keys rotated at positions tokens_seen …; return
        the held (keys, values), each (B, Hkv, n, D)."""
        _expect_tensor("k_new", k_new, 4, "(batch, kv_heads, T, head_dim)")
        _expect_tensor("v_new", v_new, 4, "(batch, kv_heads, T, head_dim)")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new: expected the shape of k_new {tuple(k_new.shape)}, got {tuple(v_new.shape)}")
        B, H, T, D = k_new.shape
        if T == 0 or (self._k is not None and (B, H, D) != (self._k.shape[0], self._k.shape[1], self._k.shape[3])):
            held = "" if self._k is None else f" like the cache {tuple(self._k.shape)}"
            raise ValueError(f"k_new: expected (batch, kv_heads, T >= 1, head_dim){held}, got {tuple(k_new.shape)}")
        # The next position is tokens seen, never the number held: eviction does not move positions.
        pos = torch.arange(self.tokens_seen, self.tokens_seen + T, device=k_new.device)  # (T,)
        k_rot = apply_rope(k_new, pos, self.rope_base)  # rotated once, at its true position, for good
        pos = pos.expand(B, H, T)  # (B, Hkv, T)
        score = torch.zeros(B, H, T, dtype=torch.float64, device=k_new.device)
        if self._k is None:
            self._k, self._v, self._pos, self._score = k_rot, v_new.clone(), pos.clone(), score
        else:
            self._k = torch.cat([self._k, k_rot], dim=2)  # (B, Hkv, n + T, D)
            self._v = torch.cat([self._v, v_new], dim=2)  # (B, Hkv, n + T, D)
            self._pos = torch.cat([self._pos, pos], dim=2)  # (B, Hkv, n + T)
            self._score = torch.cat([self._score, score], dim=2)  # (B, Hkv, n + T)
        self.tokens_seen += T
        return self._k, self._v

    def observe(self, probs: torch.Tensor) -> None:
        """Add what the new queries paid, probs (B, Hq, T, n), to each held key's score (summed over the
        queries and the group); then keep ``budget`` tokens per head by h2o_keep."""
        n = len(self)
        _expect_tensor("probs", probs, 4, "(batch, q_heads, T, n)")
        B, Hq, T, cols = probs.shape
        if n == 0 or cols != n or B != self._k.shape[0] or Hq % self._k.shape[1] or T == 0:
            raise ValueError(f"probs: expected (batch={self._k.shape[0] if n else '?'}, a multiple of the cache's "
                             f"kv heads, T >= 1, n={n} held), got {tuple(probs.shape)}")
        H = self._k.shape[1]
        paid = probs.to(torch.float64).sum(dim=2)  # (B, Hq, n): every new query's share
        self._score = self._score + paid.reshape(B, H, Hq // H, n).sum(dim=2)  # (B, Hkv, n)
        if n > self.budget:
            self._gather(h2o_keep(self._score, self.budget, self.recent))

    def compress(self, keep: torch.Tensor) -> None:
        """Keep the held tokens ``keep`` (B, Hkv, m) names, distinct per row, in arrival order."""
        n = len(self)
        if (not isinstance(keep, torch.Tensor) or keep.dtype != torch.long or keep.dim() != 3 or n == 0
                or tuple(keep.shape[:2]) != tuple(self._k.shape[:2]) or keep.shape[2] == 0):
            got = f"{keep.dtype} shape {tuple(keep.shape)}" if isinstance(keep, torch.Tensor) else type(keep).__name__
            raise ValueError(f"keep: expected a long tensor (batch, kv_heads, m >= 1) of held tokens, got {got}")
        order = torch.sort(keep, dim=-1).values  # (B, Hkv, m): arrival order
        if order.min() < 0 or order.max() >= n or (order[..., 1:] == order[..., :-1]).any():
            raise ValueError(f"keep: expected distinct indices in 0 … {n - 1} per row, got {keep.tolist()}")
        self._gather(order)

    def _gather(self, idx: torch.Tensor) -> None:
        """Keep the held tokens at ``idx`` (B, Hkv, m), ascending: keys, values, positions and scores alike."""
        wide = idx[..., None].expand(-1, -1, -1, self._k.shape[3])  # (B, Hkv, m, D)
        self._k = self._k.gather(2, wide)
        self._v = self._v.gather(2, wide)
        self._pos = self._pos.gather(2, idx)
        self._score = self._score.gather(2, idx)

    def positions(self) -> torch.Tensor:
        """long (B, Hkv, n): each held token's true position, increasing along each row."""
        if self._pos is None:
            raise ValueError("positions: the cache holds no token yet")
        return self._pos.clone()

    def scores(self) -> torch.Tensor:
        """float64 (B, Hkv, n): each held token's accumulated score."""
        if self._score is None:
            raise ValueError("scores: the cache holds no token yet")
        return self._score.clone()
