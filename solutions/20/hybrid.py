"""Kata 20 — a cache per layer type (reference solution).

Shapes: B batch, H heads, T new tokens, S keys returned, D head width (Dk, Dv for a linear state).
Cache tensors are (B, H, S, D); positions are int64 tensors of absolute token indices.
"""
from __future__ import annotations

import torch

KINDS = ("full_attention", "sliding_attention", "chunked_attention", "shared", "linear_attention")
ATTENTION = KINDS[:3]  # the kinds that store keys and values


def _expect_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")


def _expect_kinds(layer_types) -> list[str]:
    if isinstance(layer_types, str) or not isinstance(layer_types, (list, tuple)):
        raise ValueError(f"layer_types: expected a list of kinds, got {type(layer_types).__name__}")
    for kind in layer_types:
        if kind not in KINDS:
            raise ValueError(f"layer_types: expected kinds among {KINDS}, got {kind!r}")
    return list(layer_types)


def _per_kind(name: str, value, kind: str) -> int:
    """``value`` (an int, or a dict from kind to int) for layers of ``kind``."""
    if isinstance(value, dict):
        if kind not in value:
            raise ValueError(f"{name}: expected an entry for {kind!r}, got keys {sorted(value)}")
        value = value[kind]
    _expect_int(name, value, 1)
    return value


def hybrid_cache_bytes(layer_types, seq_len: int, *, n_kv_heads, head_dim, window: int, state_bytes: int = 0,
                       dtype_bytes: int = 2, batch: int = 1) -> int:
    """Bytes a hybrid cache holds after ``seq_len`` tokens: a sum over layers by kind (README, task 1)."""
    kinds = _expect_kinds(layer_types)
    for name, value, low in (("seq_len", seq_len, 0), ("window", window, 1), ("state_bytes", state_bytes, 0),
                             ("dtype_bytes", dtype_bytes, 1), ("batch", batch, 1)):
        _expect_int(name, value, low)
    total = 0
    for kind in kinds:
        if kind in ATTENTION:
            # A window layer keeps W - 1 tokens between steps: all the next query can need.
            tokens = seq_len if kind == "full_attention" else min(seq_len, window - 1)
            per_token = 2 * _per_kind("n_kv_heads", n_kv_heads, kind) * _per_kind("head_dim", head_dim, kind)
            total += batch * tokens * per_token * dtype_bytes
        elif kind == "linear_attention":
            total += batch * state_bytes  # a fixed state: the same after 1 token or a million
    return total


def window_mask(kind: str, q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """(T, S) bool, True where the query at q_pos[i] may attend to the key at k_pos[j] (README, task 2)."""
    if kind not in ATTENTION:
        raise ValueError(f"kind: expected one of {ATTENTION}, got {kind!r}")
    _expect_int("window", window, 1)
    for name, pos in (("q_pos", q_pos), ("k_pos", k_pos)):
        if not isinstance(pos, torch.Tensor) or pos.dim() != 1 or pos.dtype != torch.long:
            raise ValueError(f"{name}: expected a 1-D int64 tensor of positions, got {pos!r}")
    q, k = q_pos[:, None], k_pos[None, :]  # (T, 1), (1, S)
    mask = k <= q
    if kind == "sliding_attention":
        mask = mask & (k > q - window)  # the last W tokens, the query's own included
    elif kind == "chunked_attention":
        mask = mask & (torch.div(k, window, rounding_mode="floor") == torch.div(q, window, rounding_mode="floor"))
    return mask


def _expect_kv(k, v, held) -> None:
    for name, x in (("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name}: expected a tensor (batch, heads, seq, head_dim), got {got}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"v: expected (batch, heads, seq) of k {tuple(k.shape[:3])}, got {tuple(v.shape)}")
    if held is None:
        return
    for name, x, y in (("k", k, held[0]), ("v", v, held[1])):
        if x.shape[:2] != y.shape[:2] or x.shape[3] != y.shape[3]:
            raise ValueError(f"{name}: expected (batch, heads, *, width) like the tokens held {tuple(y.shape)}, "
                             f"got {tuple(x.shape)}")


class SlidingLayer:
    """One window layer (sliding or chunked): keeps the last ``window - 1`` tokens between updates."""

    def __init__(self, window: int):
        _expect_int("window", window, 1)
        self.window = window
        self.seen = 0  # tokens ever written: the next token's position
        self._kv: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add k, v (B, H, T, D); return the kept tokens and the new ones with their positions (task 2)."""
        _expect_kv(k, v, self._kv)
        K = k if self._kv is None else torch.cat([self._kv[0], k], dim=2)  # (B, H, stored + T, D)
        V = v if self._kv is None else torch.cat([self._kv[1], v], dim=2)  # (B, H, stored + T, Dv)
        S = K.shape[2]
        self.seen += k.shape[2]
        positions = torch.arange(self.seen - S, self.seen, device=k.device)  # (S,) the tokens' own positions
        keep = min(S, self.window - 1)  # the chunk's first query needs W - 1 earlier keys; keep no more
        self._kv = (K[:, :, S - keep:], V[:, :, S - keep:])
        return K, V, positions

    def __len__(self) -> int:
        """Tokens stored now: min(seen, window - 1)."""
        return 0 if self._kv is None else self._kv[0].shape[2]

    def nbytes(self) -> int:
        """Bytes of the keys and values stored now (0 before the first update)."""
        return 0 if self._kv is None else sum(x.numel() * x.element_size() for x in self._kv)


class _FullLayer:
    """Every token, as kata 01's cache."""

    def __init__(self):
        self.seen = 0
        self._kv: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _expect_kv(k, v, self._kv)
        if self._kv is not None:
            k, v = torch.cat([self._kv[0], k], dim=2), torch.cat([self._kv[1], v], dim=2)  # (B, H, S, D)
        self._kv = (k, v)
        self.seen = k.shape[2]
        return k, v, torch.arange(self.seen, device=k.device)

    def __len__(self) -> int:
        return self.seen

    def nbytes(self) -> int:
        return 0 if self._kv is None else sum(x.numel() * x.element_size() for x in self._kv)


class LinearState:
    """A fixed-size recurrent state S (B, H, Dk, Dv): S <- decay * S + k^T v, out = q S (task 4)."""

    def __init__(self):
        self.state: torch.Tensor | None = None
        self.seen = 0

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
        """q, k (B, H, T, Dk), v (B, H, T, Dv), decay (B, H, T) -> out (B, H, T, Dv), token by token."""
        for name, x in (("q", q), ("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor) or x.dim() != 4:
                raise ValueError(f"{name}: expected a tensor (batch, heads, seq, dim), got {x!r}")
        if q.shape != k.shape or v.shape[:3] != k.shape[:3]:
            raise ValueError(f"k: expected q's shape {tuple(q.shape)} and v's (batch, heads, seq) to match, "
                             f"got k {tuple(k.shape)}, v {tuple(v.shape)}")
        if not isinstance(decay, torch.Tensor) or decay.shape != k.shape[:3]:
            raise ValueError(f"decay: expected shape {tuple(k.shape[:3])}, got {decay!r}")
        B, H, T, Dk = k.shape
        S = self.state
        if S is None:
            S = k.new_zeros(B, H, Dk, v.shape[3])  # (B, H, Dk, Dv)
        elif S.shape != (B, H, Dk, v.shape[3]):
            raise ValueError(f"k: expected (batch, heads, dk) and v's dv of the state {tuple(S.shape)}, "
                             f"got k {tuple(k.shape)}, v {tuple(v.shape)}")
        outs = []
        for t in range(T):
            S = decay[:, :, t, None, None] * S + k[:, :, t, :, None] * v[:, :, t, None, :]  # (B, H, Dk, Dv)
            outs.append((q[:, :, t, None, :] @ S).squeeze(2))  # (B, H, Dv)
        self.state, self.seen = S, self.seen + T
        return torch.stack(outs, dim=2)  # (B, H, T, Dv)

    def nbytes(self) -> int:
        """Bytes of the state (0 before the first step)."""
        return 0 if self.state is None else self.state.numel() * self.state.element_size()


class HybridKVCache:
    """One cache for a model whose layers store different things, one entry per layer (task 3)."""

    def __init__(self, layer_types, *, window: int, shared_from: dict[int, int] | None = None):
        self.layer_types = _expect_kinds(layer_types)
        _expect_int("window", window, 1)
        self.window = window
        self.shared_from = dict(shared_from or {})
        for layer, kind in enumerate(self.layer_types):
            source = self.shared_from.get(layer)
            if (kind == "shared") != (source is not None):
                raise ValueError(f"shared_from: expected a producer for each shared layer only, got {shared_from!r}")
            if source is not None and (not isinstance(source, int) or not 0 <= source < layer
                                       or self.layer_types[source] not in ATTENTION):
                raise ValueError(f"shared_from: layer {layer} must read an earlier attention layer, got {source!r}")
        extra = set(self.shared_from) - set(range(len(self.layer_types)))
        if extra:
            raise ValueError(f"shared_from: no layer {sorted(extra)} in layer_types")
        self.reset()

    def reset(self) -> None:
        """Forget every token; the layer types, window and producers stay."""
        self.layers = [_FullLayer() if kind == "full_attention" else SlidingLayer(self.window)
                       if kind in ATTENTION else LinearState() if kind == "linear_attention" else None
                       for kind in self.layer_types]
        self._last: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def _layer(self, layer, kinds) -> object:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(self.layer_types):
            raise ValueError(f"layer: expected an int in 0 … {len(self.layer_types) - 1}, got {layer!r}")
        if self.layer_types[layer] not in kinds:
            raise ValueError(f"layer: layer {layer} is {self.layer_types[layer]!r}, expected one of {kinds}")
        return self.layers[layer]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write layer's new k, v; return (K, V, k_pos) the new queries attend to."""
        out = self._layer(layer, ATTENTION).update(k, v)
        self._last[layer] = out  # what a shared layer reads: the triple, not the stored window
        return out

    def shared(self, layer: int):
        """The (K, V, k_pos) the producer of shared ``layer`` returned on its latest update."""
        self._layer(layer, ("shared",))
        source = self.shared_from[layer]
        if source not in self._last:
            raise ValueError(f"layer: its producer, layer {source}, has not been updated yet")
        return self._last[source]

    def state(self, layer: int) -> LinearState:
        """The LinearState of linear ``layer``."""
        return self._layer(layer, ("linear_attention",))

    def seq_len(self) -> int:
        """Tokens the request has seen (never what a window layer stores)."""
        return max([0] + [layer.seen for layer in self.layers if layer is not None])

    def stored(self, layer: int) -> int:
        """Tokens layer holds: all for full, min(seen, window - 1) for a window, 0 for shared and linear."""
        held = self._layer(layer, KINDS)
        return len(held) if self.layer_types[layer] in ATTENTION else 0

    def nbytes(self, layer: int | None = None) -> int:
        """Bytes held by layer's tensors (every layer's when None)."""
        if layer is None:
            return sum(self.nbytes(i) for i in range(len(self.layer_types)))
        held = self._layer(layer, KINDS)  # None for a shared layer: it holds nothing
        return 0 if held is None else held.nbytes()
