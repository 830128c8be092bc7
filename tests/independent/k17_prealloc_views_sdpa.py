"""Kata 17 written from its README alone: each layer's self part a preallocated buffer that doubles when
full, returned as views of it (valid until the cache changes); the cross part copied into its own
storage; attention by scaled_dot_product_attention with the KV heads expanded per group and an
additive mask; the sources padded on the right, the tokens kept on the device until the end."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


def _need_layer(layer):
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer: want a non-negative int, have {layer!r}")


@dataclass
class _Layer:
    k: torch.Tensor | None = None  # (B, Hkv, capacity, D)
    v: torch.Tensor | None = None
    used: int = 0
    cross: tuple | None = field(default=None)


class EncoderDecoderKVCache:
    def __init__(self):
        self.layers: dict[int, _Layer] = {}

    def _entry(self, layer) -> _Layer:
        return self.layers.setdefault(layer, _Layer())

    def _batch(self):
        for entry in self.layers.values():
            if entry.k is not None:
                return entry.k.shape[0]
            if entry.cross is not None:
                return entry.cross[0].shape[0]
        return None

    def _shapes(self, k, v):
        if not isinstance(k, torch.Tensor) or k.dim() != 4:
            raise ValueError("k: want a 4-D tensor (B, Hkv, T, D)")
        if not isinstance(v, torch.Tensor) or v.shape != k.shape:
            raise ValueError(f"v: want the shape of k, {tuple(k.shape)}")
        batch = self._batch()
        if batch is not None and k.shape[0] != batch:
            raise ValueError(f"k: batch {k.shape[0]} differs from the cache's {batch}")

    def update(self, layer, k, v):
        _need_layer(layer)
        self._shapes(k, v)
        entry = self.layers.get(layer)
        if entry is not None and entry.k is not None and (entry.k.shape[1], entry.k.shape[3]) != (k.shape[1], k.shape[3]):
            raise ValueError(f"k: heads/width {(k.shape[1], k.shape[3])} differ from layer {layer}'s")
        entry = self._entry(layer)
        T = k.shape[2]
        if entry.k is None or entry.used + T > entry.k.shape[2]:
            size = max(2 * (entry.used + T), 8)
            grown_k = k.new_empty(k.shape[0], k.shape[1], size, k.shape[3])
            grown_v = v.new_empty(grown_k.shape)
            if entry.k is not None:
                grown_k[:, :, :entry.used] = entry.k[:, :, :entry.used]
                grown_v[:, :, :entry.used] = entry.v[:, :, :entry.used]
            entry.k, entry.v = grown_k, grown_v
        entry.k[:, :, entry.used:entry.used + T] = k
        entry.v[:, :, entry.used:entry.used + T] = v
        entry.used += T
        return entry.k[:, :, :entry.used], entry.v[:, :, :entry.used]

    def set_cross(self, layer, k, v):
        _need_layer(layer)
        if layer in self.layers and self.layers[layer].cross is not None:
            raise ValueError(f"layer: cross keys/values of layer {layer} were set already in this request")
        self._shapes(k, v)
        self._entry(layer).cross = (k.clone(), v.clone())
        return self.layers[layer].cross

    def cross(self, layer):
        _need_layer(layer)
        entry = self.layers.get(layer)
        return None if entry is None else entry.cross

    def seq_len(self, layer=0):
        _need_layer(layer)
        entry = self.layers.get(layer)
        return 0 if entry is None else entry.used

    def cross_len(self, layer=0):
        pair = self.cross(layer)
        return 0 if pair is None else pair[0].shape[2]

    def crop(self, n):
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.seq_len(0):
            raise ValueError(f"n: want an int between 0 and {self.seq_len(0)}, have {n!r}")
        for entry in self.layers.values():
            entry.used = min(entry.used, n)

    def reorder(self, index):
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.numel() < 1 or \
                index.dtype in (torch.bool, torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise ValueError("index: want a 1-D integer tensor with at least one row")
        batch = self._batch()
        if batch is None:
            return
        if bool((index < 0).any()) or bool((index >= batch).any()):
            raise ValueError(f"index: rows must lie in [0, {batch})")
        for entry in self.layers.values():
            if entry.k is not None:
                i = index.to(device=entry.k.device, dtype=torch.long)
                entry.k, entry.v = entry.k[i], entry.v[i]
            if entry.cross is not None:
                i = index.to(device=entry.cross[0].device, dtype=torch.long)
                entry.cross = (entry.cross[0][i], entry.cross[1][i])

    def reset(self):
        self.layers = {}

    def nbytes(self):
        total = 0
        for e in self.layers.values():
            if e.k is not None:
                total += 2 * e.k[:, :, :e.used].numel() * e.k.element_size()
            if e.cross is not None:
                total += 2 * e.cross[0].numel() * e.cross[0].element_size()
        return total


class CrossAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads=None):
        super().__init__()
        for name, val in (("d_model", d_model), ("n_heads", n_heads)):
            if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
                raise ValueError(f"{name}: want a positive int, have {val!r}")
        if d_model % n_heads:
            raise ValueError(f"n_heads: {n_heads} does not divide d_model {d_model}")
        kv = n_heads if n_kv_heads is None else n_kv_heads
        if isinstance(kv, bool) or not isinstance(kv, int) or kv <= 0 or n_heads % kv:
            raise ValueError(f"n_kv_heads: {n_kv_heads!r} does not divide n_heads {n_heads}")
        self.heads, self.kv_heads, self.dim = n_heads, kv, d_model // n_heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, kv * self.dim, bias=False)
        self.wv = nn.Linear(d_model, kv * self.dim, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, encoder_out, cache=None, layer=0, encoder_mask=None):
        d = self.wo.out_features
        if not (isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[-1] == d):
            raise ValueError(f"x: want (B, T, {d})")
        if not (isinstance(encoder_out, torch.Tensor) and encoder_out.dim() == 3 and encoder_out.shape[-1] == d
                and encoder_out.shape[0] == x.shape[0] and encoder_out.shape[1] > 0):
            raise ValueError(f"encoder_out: want ({x.shape[0]}, S_enc > 0, {d})")
        bias = None
        if encoder_mask is not None:
            if not (isinstance(encoder_mask, torch.Tensor) and encoder_mask.dtype == torch.bool
                    and encoder_mask.shape == encoder_out.shape[:2]):
                raise ValueError("encoder_mask: want a bool (B, S_enc) tensor")
            if not bool(encoder_mask.any(-1).all()):
                raise ValueError("encoder_mask: a row hides every frame")
            bias = torch.zeros(encoder_mask.shape, dtype=x.dtype, device=x.device)
            bias = bias.masked_fill(~encoder_mask, float("-inf"))[:, None, None, :]
        B, T, _ = x.shape
        stored = cache.cross(layer) if cache is not None else None
        if stored is None:
            S = encoder_out.shape[1]
            k = self.wk(encoder_out).view(B, S, self.kv_heads, self.dim).transpose(1, 2)
            v = self.wv(encoder_out).view(B, S, self.kv_heads, self.dim).transpose(1, 2)
            stored = (k, v) if cache is None else cache.set_cross(layer, k, v)
        k, v = stored
        g = self.heads // self.kv_heads
        S = k.shape[2]
        k = k[:, :, None].expand(B, self.kv_heads, g, S, self.dim).reshape(B, self.heads, S, self.dim)
        v = v[:, :, None].expand(B, self.kv_heads, g, S, self.dim).reshape(B, self.heads, S, self.dim)
        q = self.wq(x).view(B, T, self.heads, self.dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.wo(y.transpose(1, 2).reshape(B, T, d))


def _check_args(model, sources, max_new_tokens, decoder_start_token_id, eos_token_id, pad_token_id):
    V = model.config.vocab_size

    def is_id(t):
        return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < V

    good = isinstance(sources, (list, tuple)) and len(sources) > 0 and all(
        isinstance(s, (list, tuple)) and len(s) > 0 and all(is_id(t) for t in s) for s in sources)
    if not good:
        raise ValueError("sources: want a non-empty list of non-empty token-id lists")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError("max_new_tokens: want an int >= 0")
    if not is_id(decoder_start_token_id):
        raise ValueError("decoder_start_token_id: want a token id of the vocabulary")
    if not is_id(pad_token_id):
        raise ValueError("pad_token_id: want a token id of the vocabulary")
    if eos_token_id is not None and not is_id(eos_token_id):
        raise ValueError("eos_token_id: want None or a token id of the vocabulary")


def generate_seq2seq(model, sources, max_new_tokens, *, decoder_start_token_id, eos_token_id=None, pad_token_id=0):
    _check_args(model, sources, max_new_tokens, decoder_start_token_id, eos_token_id, pad_token_id)
    if not max_new_tokens:
        return [[] for _ in sources]
    with torch.inference_mode():
        dev, B = model.device, len(sources)
        lengths = torch.tensor([len(s) for s in sources], device=dev)
        S = int(max(len(s) for s in sources))
        src = torch.tensor([list(s) + [pad_token_id] * (S - len(s)) for s in sources], device=dev)
        mask = torch.arange(S, device=dev)[None, :] < lengths[:, None]
        enc = model.encode(src, mask)
        cache = EncoderDecoderKVCache()
        token = torch.full((B, 1), decoder_start_token_id, device=dev, dtype=torch.long)
        alive = torch.ones(B, dtype=torch.bool, device=dev)
        kept = torch.zeros(B, max_new_tokens, dtype=torch.bool, device=dev)
        made = torch.zeros(B, max_new_tokens, dtype=torch.long, device=dev)
        for step in range(max_new_tokens):
            logits = model.decode(token, torch.full_like(token, step), enc, mask, cache)
            token = logits[:, -1:].argmax(-1)
            made[:, step], kept[:, step] = token[:, 0], alive
            if eos_token_id is not None:
                alive = alive & (token[:, 0] != eos_token_id)
            if not bool(alive.any()):
                break
        return [[t for t, k in zip(row, keep) if k] for row, keep in zip(made.tolist(), kept.tolist())]
