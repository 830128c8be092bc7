"""Kata 20, written from the README alone: the linear layer in its chunked parallel form (decays summed
in log space, one masked matrix product per chunk), windows kept by torch.cat and a slice, the cache
counting tokens per layer itself, positions kept as a tensor next to the keys."""
from __future__ import annotations

import torch

KINDS = ("full_attention", "sliding_attention", "chunked_attention", "shared", "linear_attention")
ATTENTION = KINDS[:3]


def _int(name, x, low):
    if type(x) is not int or x < low:
        raise ValueError(f"{name}={x!r}: want an int of at least {low}")


def hybrid_cache_bytes(layer_types, seq_len, *, n_kv_heads, head_dim, window, state_bytes=0, dtype_bytes=2, batch=1):
    if not isinstance(layer_types, (list, tuple)) or not set(layer_types) <= set(KINDS):
        raise ValueError(f"layer_types={layer_types!r}: want a list of kinds")
    for name, x, low in (("seq_len", seq_len, 0), ("window", window, 1), ("state_bytes", state_bytes, 0),
                         ("dtype_bytes", dtype_bytes, 1), ("batch", batch, 1)):
        _int(name, x, low)
    counts = {kind: list(layer_types).count(kind) for kind in KINDS}
    total = counts["linear_attention"] * state_bytes
    for kind in ATTENTION:
        if counts[kind]:
            heads = n_kv_heads.get(kind) if isinstance(n_kv_heads, dict) else n_kv_heads
            width = head_dim.get(kind) if isinstance(head_dim, dict) else head_dim
            _int("n_kv_heads", heads, 1)
            _int("head_dim", width, 1)
            tokens = seq_len if kind == "full_attention" else min(seq_len, window - 1)
            total += counts[kind] * tokens * 2 * heads * width * dtype_bytes
    return batch * total


def window_mask(kind, q_pos, k_pos, window):
    if kind not in ATTENTION:
        raise ValueError(f"kind={kind!r}: want one of {ATTENTION}")
    _int("window", window, 1)
    for name, x in (("q_pos", q_pos), ("k_pos", k_pos)):
        if not isinstance(x, torch.Tensor) or x.dtype != torch.int64 or x.dim() != 1:
            raise ValueError(f"{name}: want a 1-D int64 tensor")
    q, k = q_pos.view(-1, 1), k_pos.view(1, -1)
    lower = {"full_attention": torch.full_like(q, torch.iinfo(torch.int64).min),
             "sliding_attention": q - window + 1, "chunked_attention": q - q % window}[kind]
    return (k <= q) & (k >= lower)


def _shapes(k, v, held):
    if not (isinstance(k, torch.Tensor) and k.dim() == 4):
        raise ValueError("k: want (batch, heads, tokens, head_dim)")
    if not (isinstance(v, torch.Tensor) and v.dim() == 4 and v.shape[:3] == k.shape[:3]):
        raise ValueError("v: want (batch, heads, tokens, width) with k's first three sizes")
    if held is not None:
        if k.shape[:2] + k.shape[3:] != held[0].shape[:2] + held[0].shape[3:]:
            raise ValueError("k: unlike the keys held")
        if v.shape[:2] + v.shape[3:] != held[1].shape[:2] + held[1].shape[3:]:
            raise ValueError("v: unlike the values held")


class SlidingLayer:
    def __init__(self, window):
        _int("window", window, 1)
        self.window, self.seen = window, 0
        self.held = None  # (K, V, positions)

    def update(self, k, v):
        _shapes(k, v, self.held)
        T = k.shape[2]
        new_pos = torch.arange(self.seen, self.seen + T, device=k.device)
        if self.held is None:
            out = (k, v, new_pos)
        else:
            out = (torch.cat((self.held[0], k), 2), torch.cat((self.held[1], v), 2), torch.cat((self.held[2], new_pos)))
        self.seen += T
        start = max(0, out[0].shape[2] - (self.window - 1))
        self.held = (out[0][:, :, start:], out[1][:, :, start:], out[2][start:].clone())
        return out

    def __len__(self):
        return 0 if self.held is None else self.held[0].shape[2]

    def nbytes(self):
        return 0 if self.held is None else sum(t.nelement() * t.element_size() for t in self.held[:2])


class _All(SlidingLayer):
    def __init__(self):
        super().__init__(1)
        self.window = None

    def update(self, k, v):
        _shapes(k, v, self.held)
        T = k.shape[2]
        if self.held is not None:
            k, v = torch.cat((self.held[0], k), 2), torch.cat((self.held[1], v), 2)
        self.seen += T
        self.held = (k, v, torch.arange(self.seen, device=k.device))
        return k, v, self.held[2].clone()


class LinearState:
    def __init__(self):
        self.state, self.seen = None, 0

    def step(self, q, k, v, decay):
        for name, x in (("q", q), ("k", k), ("v", v)):
            if not (isinstance(x, torch.Tensor) and x.dim() == 4):
                raise ValueError(f"{name}: want a 4-D tensor")
        if q.shape != k.shape:
            raise ValueError("k: want q's shape")
        if v.shape[:3] != k.shape[:3]:
            raise ValueError("v: want k's batch, heads and tokens")
        if not (isinstance(decay, torch.Tensor) and decay.shape == k.shape[:3]):
            raise ValueError("decay: want (batch, heads, tokens)")
        B, H, T, Dk = k.shape
        if self.state is not None and self.state.shape != (B, H, Dk, v.shape[-1]):
            raise ValueError("k, v: sizes unlike the state")
        dtype = v.dtype
        work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        S = torch.zeros(B, H, Dk, v.shape[-1], dtype=work, device=k.device) if self.state is None \
            else self.state.to(work)
        outs = []
        for start in range(0, T, self.CHUNK):  # short chunks: a long cumulative sum of logs drifts
            part = slice(start, start + self.CHUNK)
            out, S = self._chunk(*(x[:, :, part].to(work) for x in (q, k, v, decay)), S)
            outs.append(out)
        self.state, self.seen = S.to(dtype), self.seen + T
        return torch.cat(outs, 2).to(dtype)

    CHUNK = 16

    @staticmethod
    def _chunk(q, k, v, a, S0):
        T = k.shape[2]
        L = torch.cumsum(torch.log(a), dim=-1)  # (B, H, T): log of the decay product up to t
        gap = L.unsqueeze(-1) - L.unsqueeze(-2)  # (B, H, T, T): from s to t
        causal = torch.ones(T, T, dtype=torch.bool, device=k.device).tril()
        weight = torch.exp(gap.masked_fill(~causal, float("-inf")))
        out = ((q @ k.transpose(-1, -2)) * weight) @ v + torch.exp(L).unsqueeze(-1) * (q @ S0)
        tail = torch.exp(L[..., -1:] - L)  # (B, H, T): from each token to the chunk's end
        S = torch.exp(L[..., -1]).unsqueeze(-1).unsqueeze(-1) * S0 + (k * tail.unsqueeze(-1)).transpose(-1, -2) @ v
        return out, S

    def nbytes(self):
        return 0 if self.state is None else self.state.nelement() * self.state.element_size()


class HybridKVCache:
    def __init__(self, layer_types, *, window, shared_from=None):
        if not isinstance(layer_types, (list, tuple)) or not set(layer_types) <= set(KINDS):
            raise ValueError(f"layer_types={layer_types!r}")
        _int("window", window, 1)
        self.layer_types, self.window = tuple(layer_types), window
        links = dict(shared_from or {})
        wanted = {i for i, kind in enumerate(self.layer_types) if kind == "shared"}
        if set(links) != wanted:
            raise ValueError(f"shared_from: want producers for exactly the shared layers {sorted(wanted)}")
        for layer, src in links.items():
            if type(src) is not int or not 0 <= src < layer or self.layer_types[src] not in ATTENTION:
                raise ValueError(f"shared_from: layer {layer} cannot read {src!r}")
        self.links = links
        self.reset()

    def reset(self):
        self.parts = {i: (_All() if kind == "full_attention" else SlidingLayer(self.window)) if kind in ATTENTION
                      else LinearState() for i, kind in enumerate(self.layer_types) if kind != "shared"}
        self.latest = {}

    def _check(self, layer, kinds=KINDS):
        if type(layer) is not int or not 0 <= layer < len(self.layer_types) or self.layer_types[layer] not in kinds:
            raise ValueError(f"layer={layer!r}: want a layer of kind {kinds}")

    def update(self, layer, k, v):
        self._check(layer, ATTENTION)
        self.latest[layer] = self.parts[layer].update(k, v)
        return self.latest[layer]

    def shared(self, layer):
        self._check(layer, ("shared",))
        if self.links[layer] not in self.latest:
            raise ValueError(f"layer={layer}: nothing returned by its producer yet")
        return self.latest[self.links[layer]]

    def state(self, layer):
        self._check(layer, ("linear_attention",))
        return self.parts[layer]

    def seq_len(self):
        return max([part.seen for part in self.parts.values()] + [0])

    def stored(self, layer):
        self._check(layer)
        part = self.parts.get(layer)
        return len(part) if isinstance(part, SlidingLayer) else 0

    def nbytes(self, layer=None):
        if layer is not None:
            self._check(layer)
            return self.parts[layer].nbytes() if layer in self.parts else 0
        return sum(part.nbytes() for part in self.parts.values())
