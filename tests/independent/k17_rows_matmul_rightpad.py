"""Kata 17 written from the README alone, another way: each part of each layer kept row by row (a list
of (Hkv, S, D) tensors, one per batch row), so reorder is a list comprehension and update a per-row
cat; a cache that holds no row refuses a reorder (no index can name a row of it); CrossAttention with
the KV heads repeated and plain matmuls, the pads hidden by -inf; sources padded on the right.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def _layer_index(layer):
    if type(layer) is not int or layer < 0:
        raise ValueError(f"layer must be an int >= 0, got {layer!r}")
    return layer


def _kv(k, v):
    if not torch.is_tensor(k) or k.ndim != 4:
        raise ValueError(f"k must be a 4-D tensor (B, Hkv, T, D), got {getattr(k, 'shape', type(k).__name__)}")
    if not torch.is_tensor(v) or v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {getattr(v, 'shape', type(v).__name__)}")


class EncoderDecoderKVCache:
    def __init__(self):
        self.own = {}    # layer -> (rows of K, rows of V), each row (Hkv, S, D)
        self.cross_ = {}  # layer -> (rows of K, rows of V), each row (Hkv, S_enc, D)

    def _rows(self):
        for part in (self.own, self.cross_):
            for keys, _ in part.values():
                return len(keys)
        return None

    def _same_batch(self, k):
        rows = self._rows()
        if rows is not None and k.shape[0] != rows:
            raise ValueError(f"k has batch {k.shape[0]}, but the cache holds {rows} rows")

    def update(self, layer, k, v):
        _kv(k, v)
        _layer_index(layer)
        self._same_batch(k)
        if layer in self.own:
            keys, values = self.own[layer]
            if (k.shape[1], k.shape[3]) != (keys[0].shape[0], keys[0].shape[2]):
                raise ValueError(f"k has (heads, width) {(k.shape[1], k.shape[3])}, the layer holds "
                                 f"{(keys[0].shape[0], keys[0].shape[2])}")
            keys = [torch.cat([old, new], dim=1) for old, new in zip(keys, k)]
            values = [torch.cat([old, new], dim=1) for old, new in zip(values, v)]
        else:
            keys, values = [row.clone() for row in k], [row.clone() for row in v]
        self.own[layer] = (keys, values)
        return torch.stack(keys), torch.stack(values)

    def set_cross(self, layer, k, v):
        if _layer_index(layer) in self.cross_:
            raise ValueError(f"layer {layer} already has its cross part (once per request; reset() first)")
        _kv(k, v)
        self._same_batch(k)
        self.cross_[layer] = ([row.clone() for row in k], [row.clone() for row in v])
        return k, v

    def cross(self, layer):
        held = self.cross_.get(_layer_index(layer))
        return None if held is None else (torch.stack(held[0]), torch.stack(held[1]))

    def seq_len(self, layer=0):
        held = self.own.get(_layer_index(layer))
        return 0 if held is None else held[0][0].shape[1]

    def cross_len(self, layer=0):
        held = self.cross_.get(_layer_index(layer))
        return 0 if held is None else held[0][0].shape[1]

    def crop(self, n):
        if type(n) is not int or not 0 <= n <= self.seq_len():
            raise ValueError(f"n must be an int in [0, {self.seq_len()}], got {n!r}")
        for layer, (keys, values) in self.own.items():
            self.own[layer] = ([r[:, :n] for r in keys], [r[:, :n] for r in values])

    def reorder(self, index):
        if (not torch.is_tensor(index) or index.ndim != 1 or len(index) == 0 or index.dtype == torch.bool
                or index.is_floating_point() or index.is_complex()):
            raise ValueError(f"index must be a non-empty 1-D integer tensor, got {index!r}")
        rows = self._rows()
        order = index.tolist()
        if rows is None or any(not 0 <= i < rows for i in order):
            raise ValueError(f"index {order} names a row the cache does not hold (it holds {rows or 0})")
        for part in (self.own, self.cross_):
            for layer, (keys, values) in part.items():
                part[layer] = ([keys[i] for i in order], [values[i] for i in order])

    def reset(self):
        self.own, self.cross_ = {}, {}

    def nbytes(self):
        total = 0
        for part in (self.own, self.cross_):
            for keys, values in part.values():
                total += sum(r.numel() * r.element_size() for r in keys + values)
        return total


def _count(name, value):
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class CrossAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads=None):
        super().__init__()
        _count("d_model", d_model)
        _count("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"n_heads {n_heads} does not divide d_model {d_model}")
        kv = n_heads if n_kv_heads is None else n_kv_heads
        if type(kv) is not int or kv < 1 or n_heads % kv:
            raise ValueError(f"n_kv_heads must be None or a positive divisor of {n_heads}, got {n_kv_heads!r}")
        self.d, self.h, self.hkv, self.dh = d_model, n_heads, kv, d_model // n_heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, kv * self.dh, bias=False)
        self.wv = nn.Linear(d_model, kv * self.dh, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def _inputs(self, x, encoder_out, encoder_mask):
        if not torch.is_tensor(x) or x.ndim != 3 or x.shape[2] != self.d:
            raise ValueError(f"x must be (B, T, {self.d}), got {getattr(x, 'shape', type(x).__name__)}")
        if (not torch.is_tensor(encoder_out) or encoder_out.ndim != 3 or encoder_out.shape[0] != x.shape[0]
                or encoder_out.shape[2] != self.d or encoder_out.shape[1] < 1):
            raise ValueError(f"encoder_out must be ({x.shape[0]}, S_enc >= 1, {self.d}), got "
                             f"{getattr(encoder_out, 'shape', type(encoder_out).__name__)}")
        if encoder_mask is not None:
            if (not torch.is_tensor(encoder_mask) or encoder_mask.dtype != torch.bool
                    or tuple(encoder_mask.shape) != tuple(encoder_out.shape[:2])):
                raise ValueError(f"encoder_mask must be a bool {tuple(encoder_out.shape[:2])} tensor")
            if not bool(encoder_mask.any(dim=1).all()):
                raise ValueError("encoder_mask has a row with no real frame")

    def forward(self, x, encoder_out, cache=None, layer=0, encoder_mask=None):
        self._inputs(x, encoder_out, encoder_mask)
        B, T, _ = x.shape
        held = None if cache is None else cache.cross(layer)
        if held is None:
            S = encoder_out.shape[1]
            k = self.wk(encoder_out).reshape(B, S, self.hkv, self.dh).transpose(1, 2)  # (B, Hkv, S, D)
            v = self.wv(encoder_out).reshape(B, S, self.hkv, self.dh).transpose(1, 2)
            if cache is not None:
                cache.set_cross(layer, k, v)
        else:
            k, v = held
        group = self.h // self.hkv
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, Hq, S, D)
        q = self.wq(x).reshape(B, T, self.h, self.dh).transpose(1, 2)  # (B, Hq, T, D)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.dh)  # (B, Hq, T, S)
        if encoder_mask is not None:
            scores = scores.masked_fill(~encoder_mask[:, None, None, :], float("-inf"))
        out = scores.softmax(dim=-1) @ v  # (B, Hq, T, D)
        return self.wo(out.transpose(1, 2).reshape(B, T, self.d))


def _check_args(model, sources, max_new_tokens, decoder_start_token_id, eos_token_id, pad_token_id):
    V = model.config.vocab_size

    def token(t):
        return type(t) is int and 0 <= t < V

    if (type(sources) is not list or not sources
            or any(type(s) is not list or not s or not all(token(t) for t in s) for s in sources)):
        raise ValueError(f"sources must be a non-empty list of non-empty lists of ids below {V}")
    if type(max_new_tokens) is not int or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    for name, value in (("decoder_start_token_id", decoder_start_token_id), ("pad_token_id", pad_token_id)):
        if not token(value):
            raise ValueError(f"{name} must be a token id below {V}, got {value!r}")
    if eos_token_id is not None and not token(eos_token_id):
        raise ValueError(f"eos_token_id must be None or a token id below {V}, got {eos_token_id!r}")


@torch.no_grad()
def generate_seq2seq(model, sources, max_new_tokens, *, decoder_start_token_id, eos_token_id=None,
                     pad_token_id=0):
    _check_args(model, sources, max_new_tokens, decoder_start_token_id, eos_token_id, pad_token_id)
    new = [[] for _ in sources]
    if max_new_tokens == 0:
        return new
    width = max(len(s) for s in sources)
    src = torch.tensor([s + [pad_token_id] * (width - len(s)) for s in sources], device=model.device)
    mask = torch.tensor([[True] * len(s) + [False] * (width - len(s)) for s in sources], device=model.device)
    memory = model.encode(src, mask)
    cache, finished = EncoderDecoderKVCache(), [False] * len(sources)
    feed = [decoder_start_token_id] * len(sources)
    for step in range(max_new_tokens):
        ids = torch.tensor(feed, device=model.device)[:, None]  # (B, 1)
        positions = torch.full_like(ids, step)
        logits = model.decode(ids, positions, memory, mask, cache)  # (B, 1, V)
        picks = logits[:, -1].argmax(dim=-1).tolist()
        for b, t in enumerate(picks):
            if not finished[b]:
                new[b].append(t)
                finished[b] = eos_token_id is not None and t == eos_token_id
        if all(finished):
            break
        feed = picks
    return new
