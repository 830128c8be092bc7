"""Kata 17 written from its README alone: the self part kept as a list of chunks per layer (joined when
read), the cross part in a list indexed by layer, attention written out with einsum in float64 over
query groups (no repeat of the KV heads), and the sources padded on the left."""
from __future__ import annotations

import math

import torch
from torch import nn


def _is_index(value) -> bool:
    return type(value) is int and value >= 0


class EncoderDecoderKVCache:
    def __init__(self):
        self.chunks: list[list[tuple[torch.Tensor, torch.Tensor]]] = []  # per layer: (k, v) chunks in order
        self.crossed: list[tuple[torch.Tensor, torch.Tensor] | None] = []

    def _rows(self):
        for layer in self.chunks:
            if layer:
                return layer[0][0].shape[0]
        for pair in self.crossed:
            if pair is not None:
                return pair[0].shape[0]
        return None

    def _grow(self, layer):
        while len(self.chunks) <= layer:
            self.chunks.append([])
            self.crossed.append(None)

    def _validate(self, layer, k, v, self_part):
        if not _is_index(layer):
            raise ValueError(f"layer must be an int >= 0, not {layer!r}")
        if not torch.is_tensor(k) or k.ndim != 4:
            raise ValueError(f"k must be a 4-D tensor, got {k!r:.60}")
        if not torch.is_tensor(v) or v.shape != k.shape:
            raise ValueError(f"v must have k's shape {list(k.shape)}")
        rows = self._rows()
        if rows is not None and rows != k.shape[0]:
            raise ValueError(f"k has batch {k.shape[0]} but the cache holds batch {rows}")
        if self_part and layer < len(self.chunks) and self.chunks[layer]:
            first = self.chunks[layer][0][0]
            if first.shape[1] != k.shape[1] or first.shape[3] != k.shape[3]:
                raise ValueError(f"k has {k.shape[1]} heads of width {k.shape[3]}; layer {layer} holds "
                                 f"{first.shape[1]} of width {first.shape[3]}")

    def update(self, layer, k, v):
        self._validate(layer, k, v, True)
        self._grow(layer)
        self.chunks[layer].append((k, v))
        K = torch.cat([c[0] for c in self.chunks[layer]], 2)
        V = torch.cat([c[1] for c in self.chunks[layer]], 2)
        self.chunks[layer] = [(K, V)]
        return K, V

    def set_cross(self, layer, k, v):
        if not _is_index(layer):
            raise ValueError(f"layer must be an int >= 0, not {layer!r}")
        if layer < len(self.crossed) and self.crossed[layer] is not None:
            raise ValueError(f"layer {layer} already has its cross keys and values for this request")
        self._validate(layer, k, v, False)
        self._grow(layer)
        self.crossed[layer] = (k, v)
        return k, v

    def cross(self, layer):
        if not _is_index(layer):
            raise ValueError(f"layer must be an int >= 0, not {layer!r}")
        return self.crossed[layer] if layer < len(self.crossed) else None

    def seq_len(self, layer=0):
        if not _is_index(layer):
            raise ValueError(f"layer must be an int >= 0, not {layer!r}")
        return sum(c[0].shape[2] for c in self.chunks[layer]) if layer < len(self.chunks) else 0

    def cross_len(self, layer=0):
        pair = self.cross(layer)
        return 0 if pair is None else pair[0].shape[2]

    def crop(self, n):
        if type(n) is not int or n < 0 or n > self.seq_len():
            raise ValueError(f"n must be an int in [0, {self.seq_len()}], got {n!r}")
        for i, layer in enumerate(self.chunks):
            if layer:
                K = torch.cat([c[0] for c in layer], 2)
                V = torch.cat([c[1] for c in layer], 2)
                self.chunks[i] = [(K.narrow(2, 0, n), V.narrow(2, 0, n))]

    def reorder(self, index):
        if (not torch.is_tensor(index) or index.ndim != 1 or len(index) == 0
                or index.dtype not in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)):
            raise ValueError(f"index must be a non-empty 1-D integer tensor, got {index!r:.80}")
        rows = self._rows()
        if rows is None:
            return
        if int(index.min()) < 0 or int(index.max()) >= rows:
            raise ValueError(f"index holds rows outside 0..{rows - 1}")
        pick = index.long()
        for i, layer in enumerate(self.chunks):
            self.chunks[i] = [(k[pick.to(k.device)], v[pick.to(v.device)]) for k, v in layer]
        self.crossed = [None if p is None else (p[0][pick.to(p[0].device)], p[1][pick.to(p[1].device)])
                        for p in self.crossed]

    def reset(self):
        self.chunks, self.crossed = [], []

    def nbytes(self):
        total = 0
        for layer in self.chunks:
            for k, v in layer:
                total += k.numel() * k.element_size() + v.numel() * v.element_size()
        for pair in self.crossed:
            if pair is not None:
                total += sum(t.numel() * t.element_size() for t in pair)
        return total


class CrossAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads=None):
        super().__init__()
        if type(d_model) is not int or d_model < 1:
            raise ValueError(f"d_model must be a positive int, got {d_model!r}")
        if type(n_heads) is not int or n_heads < 1 or d_model % n_heads != 0:
            raise ValueError(f"n_heads must be a positive divisor of d_model={d_model}, got {n_heads!r}")
        if n_kv_heads is None:
            n_kv_heads = n_heads
        if type(n_kv_heads) is not int or n_kv_heads < 1 or n_heads % n_kv_heads != 0:
            raise ValueError(f"n_kv_heads must divide n_heads={n_heads}, got {n_kv_heads!r}")
        self.h, self.hk, self.dh = n_heads, n_kv_heads, d_model // n_heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, n_kv_heads * self.dh, bias=False)
        self.wv = nn.Linear(d_model, n_kv_heads * self.dh, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, encoder_out, cache=None, layer=0, encoder_mask=None):
        width = self.wq.in_features
        if not torch.is_tensor(x) or x.ndim != 3 or x.shape[2] != width:
            raise ValueError(f"x must be (B, T, {width})")
        if (not torch.is_tensor(encoder_out) or encoder_out.ndim != 3 or encoder_out.shape[0] != x.shape[0]
                or encoder_out.shape[1] < 1 or encoder_out.shape[2] != width):
            raise ValueError(f"encoder_out must be ({x.shape[0]}, S_enc >= 1, {width})")
        if encoder_mask is not None:
            if (not torch.is_tensor(encoder_mask) or encoder_mask.dtype is not torch.bool
                    or encoder_mask.shape != encoder_out.shape[:2]):
                raise ValueError(f"encoder_mask must be a bool tensor of shape {list(encoder_out.shape[:2])}")
            if not encoder_mask.any(1).all():
                raise ValueError("encoder_mask has a row with no real frame")
        B, T, _ = x.shape
        pair = cache.cross(layer) if cache is not None else None
        if pair is None:
            S = encoder_out.shape[1]
            k = self.wk(encoder_out).reshape(B, S, self.hk, self.dh).permute(0, 2, 1, 3)
            v = self.wv(encoder_out).reshape(B, S, self.hk, self.dh).permute(0, 2, 1, 3)
            pair = cache.set_cross(layer, k, v) if cache is not None else (k, v)
        k, v = pair
        g = self.h // self.hk
        q = self.wq(x).reshape(B, T, self.hk, g, self.dh).double()  # query head j*g + i -> group j, member i
        scores = torch.einsum("btjid,bjsd->bjits", q, k.double()) / math.sqrt(self.dh)
        if encoder_mask is not None:
            scores = scores.masked_fill(~encoder_mask[:, None, None, None, :], float("-inf"))
        out = torch.einsum("bjits,bjsd->btjid", scores.softmax(-1), v.double())
        return self.wo(out.reshape(B, T, self.h * self.dh).to(x.dtype))


def _check_args(model, sources, max_new_tokens, decoder_start_token_id, eos_token_id, pad_token_id):
    V = model.config.vocab_size
    ok = lambda t: type(t) is int and 0 <= t < V  # noqa: E731
    if type(sources) not in (list, tuple) or len(sources) == 0:
        raise ValueError("sources must be a non-empty list of token lists")
    for s in sources:
        if type(s) not in (list, tuple) or len(s) == 0 or not all(ok(t) for t in s):
            raise ValueError(f"sources: each source must be a non-empty list of ids in [0, {V}), got {s!r}")
    if type(max_new_tokens) is not int or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not ok(decoder_start_token_id):
        raise ValueError(f"decoder_start_token_id must be an id in [0, {V}), got {decoder_start_token_id!r}")
    if eos_token_id is not None and not ok(eos_token_id):
        raise ValueError(f"eos_token_id must be None or an id in [0, {V}), got {eos_token_id!r}")
    if not ok(pad_token_id):
        raise ValueError(f"pad_token_id must be an id in [0, {V}), got {pad_token_id!r}")


@torch.no_grad()
def generate_seq2seq(model, sources, max_new_tokens, *, decoder_start_token_id, eos_token_id=None, pad_token_id=0):
    _check_args(model, sources, max_new_tokens, decoder_start_token_id, eos_token_id, pad_token_id)
    results = [[] for _ in sources]
    if max_new_tokens == 0:
        return results
    longest = max(map(len, sources))
    padded = [[pad_token_id] * (longest - len(s)) + list(s) for s in sources]  # left padding
    real = [[False] * (longest - len(s)) + [True] * len(s) for s in sources]
    src = torch.tensor(padded, device=model.device)
    mask = torch.tensor(real, device=model.device)
    memory = model.encode(src, mask)
    cache = EncoderDecoderKVCache()
    finished = [False] * len(sources)
    current = [decoder_start_token_id] * len(sources)
    for t in range(max_new_tokens):
        ids = torch.tensor([[c] for c in current], device=model.device)
        pos = torch.tensor([[t]] * len(sources), device=model.device)
        logits = model.decode(ids, pos, memory, mask, cache)
        current = logits[:, -1, :].argmax(-1).tolist()
        for b, token in enumerate(current):
            if not finished[b]:
                results[b].append(token)
                finished[b] = eos_token_id is not None and token == eos_token_id
        if all(finished):
            break
    return results
