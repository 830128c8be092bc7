"""Kata 20, written from the README alone: every layer a Python list of per-token (k, v, position)
entries, masks filled by loops, the linear state kept in float64 and cast back on the way out."""
from __future__ import annotations

import torch

KINDS = ("full_attention", "sliding_attention", "chunked_attention", "shared", "linear_attention")
WINDOWED = ("sliding_attention", "chunked_attention")


def _need(cond, message):
    if not cond:
        raise ValueError(message)


def _is_int(x, low):
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def hybrid_cache_bytes(layer_types, seq_len, *, n_kv_heads, head_dim, window, state_bytes=0, dtype_bytes=2, batch=1):
    _need(isinstance(layer_types, (list, tuple)) and all(t in KINDS for t in layer_types),
          f"layer_types: unknown kinds in {layer_types!r}")
    for name, x, low in (("seq_len", seq_len, 0), ("window", window, 1), ("state_bytes", state_bytes, 0),
                         ("dtype_bytes", dtype_bytes, 1), ("batch", batch, 1)):
        _need(_is_int(x, low), f"{name}: {x!r} is not an int >= {low}")
    out = 0
    for kind in layer_types:
        if kind == "linear_attention":
            out += batch * state_bytes
        elif kind != "shared":
            h = n_kv_heads[kind] if isinstance(n_kv_heads, dict) and kind in n_kv_heads else n_kv_heads
            d = head_dim[kind] if isinstance(head_dim, dict) and kind in head_dim else head_dim
            _need(_is_int(h, 1), f"n_kv_heads: no valid count for {kind}")
            _need(_is_int(d, 1), f"head_dim: no valid width for {kind}")
            tokens = seq_len if kind == "full_attention" else min(seq_len, window - 1)
            out += batch * tokens * 2 * h * d * dtype_bytes
    return out


def window_mask(kind, q_pos, k_pos, window):
    _need(kind in ("full_attention",) + WINDOWED, f"kind: {kind!r} is not an attention kind")
    _need(_is_int(window, 1), f"window: {window!r}")
    for name, x in (("q_pos", q_pos), ("k_pos", k_pos)):
        _need(isinstance(x, torch.Tensor) and x.dim() == 1 and x.dtype == torch.long, f"{name}: not 1-D int64")
    qs, ks = q_pos.tolist(), k_pos.tolist()
    rows = []
    for q in qs:
        row = []
        for k in ks:
            ok = k <= q
            if kind == "sliding_attention":
                ok = ok and q - k < window
            elif kind == "chunked_attention":
                ok = ok and q // window == k // window
            row.append(ok)
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool, device=q_pos.device).reshape(len(qs), len(ks))


def _validate(k, v, entries):
    _need(isinstance(k, torch.Tensor) and k.dim() == 4, "k: expected (B, H, T, D)")
    _need(isinstance(v, torch.Tensor) and v.dim() == 4, "v: expected (B, H, T, Dv)")
    _need(v.shape[0] == k.shape[0] and v.shape[1] == k.shape[1] and v.shape[2] == k.shape[2], "v: unlike k")
    if entries:
        k0, v0, _ = entries[0]
        _need(k.shape[:2] == k0.shape[:2] and k.shape[3] == k0.shape[2], "k: unlike the tokens held")
        _need(v.shape[3] == v0.shape[2], "v: unlike the values held")


class SlidingLayer:
    def __init__(self, window):
        _need(_is_int(window, 1), f"window: {window!r}")
        self.window, self.seen, self.entries = window, 0, []

    def update(self, k, v):
        _validate(k, v, self.entries)
        for t in range(k.shape[2]):
            self.entries.append((k[:, :, t], v[:, :, t], self.seen))
            self.seen += 1
        K = torch.stack([e[0] for e in self.entries], 2)
        V = torch.stack([e[1] for e in self.entries], 2)
        pos = torch.tensor([e[2] for e in self.entries], dtype=torch.long, device=k.device)
        keep = self.window - 1
        self.entries = self.entries[-keep:] if keep else []
        return K, V, pos

    def __len__(self):
        return len(self.entries)

    def nbytes(self):
        return sum(e[0].numel() * e[0].element_size() + e[1].numel() * e[1].element_size() for e in self.entries)


class _FullList(SlidingLayer):
    def __init__(self):
        self.window, self.seen, self.entries = None, 0, []

    def update(self, k, v):
        _validate(k, v, self.entries)
        for t in range(k.shape[2]):
            self.entries.append((k[:, :, t], v[:, :, t], self.seen))
            self.seen += 1
        return (torch.stack([e[0] for e in self.entries], 2), torch.stack([e[1] for e in self.entries], 2),
                torch.arange(self.seen, device=k.device))


class LinearState:
    def __init__(self):
        self.state, self.seen, self._wide = None, 0, None

    def step(self, q, k, v, decay):
        for name, x in (("q", q), ("k", k), ("v", v)):
            _need(isinstance(x, torch.Tensor) and x.dim() == 4, f"{name}: expected a 4-D tensor")
        _need(k.shape == q.shape, "k: expected q's shape")
        _need(v.shape[:3] == k.shape[:3], "v: batch, heads or tokens unlike k")
        _need(isinstance(decay, torch.Tensor) and decay.shape == k.shape[:3], "decay: expected (B, H, T)")
        B, H, T, Dk = k.shape
        Dv = v.shape[3]
        if self._wide is not None:
            _need(self._wide.shape == (B, H, Dk, Dv), "k, v: sizes unlike the state held")
        S = self._wide if self._wide is not None else torch.zeros(B, H, Dk, Dv, dtype=torch.float64, device=k.device)
        qd, kd, vd, dd = q.double(), k.double(), v.double(), decay.double()
        outs = []
        for t in range(T):
            S = dd[:, :, t].unsqueeze(-1).unsqueeze(-1) * S + kd[:, :, t].unsqueeze(-1) @ vd[:, :, t].unsqueeze(-2)
            outs.append((qd[:, :, t].unsqueeze(-2) @ S).squeeze(-2))
        self._wide, self.seen = S, self.seen + T
        self.state = S.to(k.dtype)
        return torch.stack(outs, 2).to(v.dtype)

    def nbytes(self):
        return 0 if self.state is None else self.state.numel() * self.state.element_size()


class HybridKVCache:
    def __init__(self, layer_types, *, window, shared_from=None):
        _need(isinstance(layer_types, (list, tuple)) and all(t in KINDS for t in layer_types),
              f"layer_types: {layer_types!r}")
        _need(_is_int(window, 1), f"window: {window!r}")
        self.kinds, self.window = list(layer_types), window
        self.producer = dict(shared_from) if shared_from else {}
        for i, kind in enumerate(self.kinds):
            if kind == "shared":
                src = self.producer.get(i)
                _need(isinstance(src, int) and 0 <= src < i and self.kinds[src] in ("full_attention",) + WINDOWED,
                      f"shared_from: layer {i} needs an earlier attention producer, got {src!r}")
        _need(all(isinstance(i, int) and 0 <= i < len(self.kinds) and self.kinds[i] == "shared" for i in self.producer),
              "shared_from: only shared layers have producers")
        self.reset()

    def reset(self):
        self.layers = [_FullList() if kind == "full_attention" else SlidingLayer(self.window) if kind in WINDOWED
                       else LinearState() if kind == "linear_attention" else None for kind in self.kinds]
        self.last = [None] * len(self.kinds)

    def _at(self, layer, kinds=None):
        _need(isinstance(layer, int) and not isinstance(layer, bool) and 0 <= layer < len(self.kinds),
              f"layer: {layer!r} out of range")
        _need(kinds is None or self.kinds[layer] in kinds, f"layer: {layer} is a {self.kinds[layer]} layer")
        return self.layers[layer]

    def update(self, layer, k, v):
        out = self._at(layer, ("full_attention",) + WINDOWED).update(k, v)
        self.last[layer] = out
        return out

    def shared(self, layer):
        self._at(layer, ("shared",))
        got = self.last[self.producer[layer]]
        _need(got is not None, f"layer: producer of {layer} not updated yet")
        return got

    def state(self, layer):
        return self._at(layer, ("linear_attention",))

    def seq_len(self):
        return max([x.seen for x in self.layers if x is not None], default=0)

    def stored(self, layer):
        held = self._at(layer)
        return len(held) if isinstance(held, SlidingLayer) else 0

    def nbytes(self, layer=None):
        if layer is None:
            return sum(x.nbytes() for x in self.layers if x is not None)
        held = self._at(layer)
        return 0 if held is None else held.nbytes()
