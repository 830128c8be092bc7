"""Kata 20, written from the README alone: window layers in a preallocated ring buffer of W - 1 slots
with a position per slot, a full layer that doubles its buffer, the linear recurrence with einsum."""
from __future__ import annotations

import torch

KINDS = ("full_attention", "sliding_attention", "chunked_attention", "shared", "linear_attention")
_ATTN = {"full_attention", "sliding_attention", "chunked_attention"}


def _size(name, value, smallest):
    if type(value) is not int or value < smallest:
        raise ValueError(f"{name} must be an int >= {smallest}; got {value!r}")
    return value


def _kinds(layer_types):
    if not isinstance(layer_types, (list, tuple)) or any(k not in KINDS for k in layer_types):
        raise ValueError(f"layer_types must be a list of {KINDS}; got {layer_types!r}")
    return list(layer_types)


def hybrid_cache_bytes(layer_types, seq_len, *, n_kv_heads, head_dim, window, state_bytes=0, dtype_bytes=2, batch=1):
    kinds = _kinds(layer_types)
    _size("seq_len", seq_len, 0), _size("window", window, 1), _size("state_bytes", state_bytes, 0)
    _size("dtype_bytes", dtype_bytes, 1), _size("batch", batch, 1)

    def pick(name, value, kind):
        if isinstance(value, dict):
            if kind not in value:
                raise ValueError(f"{name} has no entry for {kind}")
            value = value[kind]
        return _size(name, value, 1)

    per_layer = {"shared": 0, "linear_attention": state_bytes}
    total = 0
    for kind in kinds:
        if kind in _ATTN:
            held = seq_len if kind == "full_attention" else min(seq_len, window - 1)
            total += held * 2 * pick("n_kv_heads", n_kv_heads, kind) * pick("head_dim", head_dim, kind) * dtype_bytes
        else:
            total += per_layer[kind]
    return total * batch


def window_mask(kind, q_pos, k_pos, window):
    if kind not in _ATTN:
        raise ValueError(f"kind {kind!r} has no mask")
    _size("window", window, 1)
    for name, x in (("q_pos", q_pos), ("k_pos", k_pos)):
        if not (isinstance(x, torch.Tensor) and x.ndim == 1 and x.dtype == torch.int64):
            raise ValueError(f"{name} must be a 1-D int64 tensor")
    dist = q_pos.unsqueeze(1) - k_pos.unsqueeze(0)  # (T, S)
    if kind == "full_attention":
        return dist >= 0
    if kind == "sliding_attention":
        return (dist >= 0) & (dist < window)
    return (dist >= 0) & (q_pos.unsqueeze(1) // window == k_pos.unsqueeze(0) // window)


def _check(k, v, like_k, like_v):
    if not isinstance(k, torch.Tensor) or k.ndim != 4:
        raise ValueError("k must be 4-D (batch, heads, tokens, head_dim)")
    if not isinstance(v, torch.Tensor) or v.ndim != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError("v must be 4-D with k's batch, heads and tokens")
    if like_k is not None:
        if (k.shape[0], k.shape[1], k.shape[3]) != like_k:
            raise ValueError(f"k must match the held (batch, heads, head_dim) {like_k}")
        if (v.shape[0], v.shape[1], v.shape[3]) != like_v:
            raise ValueError(f"v must match the held (batch, heads, width) {like_v}")


class SlidingLayer:
    def __init__(self, window):
        self.window = _size("window", window, 1)
        self.seen = 0
        self.kbuf = self.vbuf = self.pos = None  # ring of W - 1 slots; pos[-1]: empty
        self.like = (None, None)

    def update(self, k, v):
        _check(k, v, *self.like)
        cap = self.window - 1
        if self.kbuf is None:
            B, H, _, D = k.shape
            self.kbuf = k.new_zeros(B, H, cap, D)
            self.vbuf = v.new_zeros(B, H, cap, v.shape[3])
            self.pos = torch.full((cap,), -1, dtype=torch.long, device=k.device)
            self.like = ((B, H, D), (B, H, v.shape[3]))
        held = (self.pos >= 0).nonzero().flatten()
        order = held[torch.argsort(self.pos[held])]  # oldest first, whatever the slot
        T = k.shape[2]
        K = torch.cat([self.kbuf.index_select(2, order), k], 2)
        V = torch.cat([self.vbuf.index_select(2, order), v], 2)
        k_pos = torch.cat([self.pos[order], torch.arange(self.seen, self.seen + T, device=k.device)])
        for t in range(max(0, T - cap), T):  # only the last cap new tokens can stay
            slot = (self.seen + t) % cap
            self.kbuf[:, :, slot] = k[:, :, t]
            self.vbuf[:, :, slot] = v[:, :, t]
            self.pos[slot] = self.seen + t
        self.seen += T
        return K, V, k_pos

    def __len__(self):
        return 0 if self.pos is None else int((self.pos >= 0).sum())

    def nbytes(self):
        if self.kbuf is None:
            return 0
        n, B, H = len(self), self.kbuf.shape[0], self.kbuf.shape[1]
        return n * B * H * (self.kbuf.shape[3] * self.kbuf.element_size() + self.vbuf.shape[3] * self.vbuf.element_size())


class _Full:
    def __init__(self):
        self.k = self.v = None
        self.seen = 0

    def update(self, k, v):
        like = (None, None) if self.k is None else ((self.k.shape[0], self.k.shape[1], self.k.shape[3]),
                                                     (self.v.shape[0], self.v.shape[1], self.v.shape[3]))
        _check(k, v, *like)
        T = k.shape[2]
        if self.k is None:
            self.k, self.v = k.clone(), v.clone()
        else:
            if self.seen + T > self.k.shape[2]:
                grow = max(2 * self.k.shape[2], self.seen + T)
                nk = self.k.new_zeros(*self.k.shape[:2], grow, self.k.shape[3])
                nv = self.v.new_zeros(*self.v.shape[:2], grow, self.v.shape[3])
                nk[:, :, :self.seen], nv[:, :, :self.seen] = self.k[:, :, :self.seen], self.v[:, :, :self.seen]
                self.k, self.v = nk, nv
            self.k[:, :, self.seen:self.seen + T] = k
            self.v[:, :, self.seen:self.seen + T] = v
        self.seen += T
        return self.k[:, :, :self.seen], self.v[:, :, :self.seen], torch.arange(self.seen, device=k.device)

    def __len__(self):
        return self.seen

    def nbytes(self):
        if self.k is None:
            return 0
        return self.seen * self.k.shape[0] * self.k.shape[1] * (
            self.k.shape[3] * self.k.element_size() + self.v.shape[3] * self.v.element_size())


class LinearState:
    def __init__(self):
        self.state = None
        self.seen = 0

    def step(self, q, k, v, decay):
        for name, x in (("q", q), ("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor) or x.ndim != 4:
                raise ValueError(f"{name} must be a 4-D tensor")
        if k.shape != q.shape:
            raise ValueError("k must have q's shape")
        if v.shape[:3] != k.shape[:3]:
            raise ValueError("v must share batch, heads and tokens with k")
        if not isinstance(decay, torch.Tensor) or tuple(decay.shape) != tuple(k.shape[:3]):
            raise ValueError("decay must be (batch, heads, tokens)")
        B, H, T, Dk = k.shape
        if self.state is not None and tuple(self.state.shape) != (B, H, Dk, v.shape[3]):
            raise ValueError("k and v must match the state held")
        S = self.state if self.state is not None else torch.zeros(B, H, Dk, v.shape[3], dtype=k.dtype, device=k.device)
        out = torch.empty(B, H, T, v.shape[3], dtype=v.dtype, device=v.device)
        for t in range(T):
            S = torch.einsum("bh,bhkv->bhkv", decay[:, :, t], S) + torch.einsum("bhk,bhv->bhkv", k[:, :, t], v[:, :, t])
            out[:, :, t] = torch.einsum("bhk,bhkv->bhv", q[:, :, t], S)
        self.state, self.seen = S, self.seen + T
        return out

    def nbytes(self):
        return 0 if self.state is None else self.state.nelement() * self.state.element_size()


class HybridKVCache:
    def __init__(self, layer_types, *, window, shared_from=None):
        self.types = _kinds(layer_types)
        self.window = _size("window", window, 1)
        shared_from = {} if shared_from is None else dict(shared_from)
        n = len(self.types)
        for layer, src in shared_from.items():
            if not (isinstance(layer, int) and 0 <= layer < n and self.types[layer] == "shared"):
                raise ValueError(f"shared_from: {layer!r} is not a shared layer")
            if not (isinstance(src, int) and 0 <= src < layer and self.types[src] in _ATTN):
                raise ValueError(f"shared_from: layer {layer} must read an earlier attention layer, not {src!r}")
        if any(kind == "shared" and i not in shared_from for i, kind in enumerate(self.types)):
            raise ValueError("shared_from: every shared layer needs a producer")
        self.src = shared_from
        self.reset()

    def reset(self):
        self.store = {}
        for i, kind in enumerate(self.types):
            if kind == "full_attention":
                self.store[i] = _Full()
            elif kind in _ATTN:
                self.store[i] = SlidingLayer(self.window)
            elif kind == "linear_attention":
                self.store[i] = LinearState()
        self.returned = {}

    def _index(self, layer, *allowed):
        if type(layer) is not int or not 0 <= layer < len(self.types):
            raise ValueError(f"layer must be an index below {len(self.types)}; got {layer!r}")
        if allowed and self.types[layer] not in allowed:
            raise ValueError(f"layer {layer} is {self.types[layer]}, not {allowed}")
        return layer

    def update(self, layer, k, v):
        self._index(layer, *_ATTN)
        self.returned[layer] = self.store[layer].update(k, v)
        return self.returned[layer]

    def shared(self, layer):
        self._index(layer, "shared")
        if self.src[layer] not in self.returned:
            raise ValueError(f"layer {layer}: its producer has not been updated")
        return self.returned[self.src[layer]]

    def state(self, layer):
        return self.store[self._index(layer, "linear_attention")]

    def seq_len(self):
        return max((s.seen for s in self.store.values()), default=0)

    def stored(self, layer):
        self._index(layer)
        return len(self.store[layer]) if self.types[layer] in _ATTN else 0

    def nbytes(self, layer=None):
        if layer is None:
            return sum(s.nbytes() for s in self.store.values())
        self._index(layer)
        return self.store[layer].nbytes() if layer in self.store else 0
