"""Kata 15 written from the README alone, another way: offsets from itertools.accumulate, the mask and
the attention both per sequence (scaled_dot_product_attention on each segment with its own bottom-right
triangle, the KV heads repeated), and the cache as one buffer per sequence and layer that doubles its
capacity when full (the returned K and V are fresh concatenations of the filled parts).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F


def _ints(name, values, least):
    if not isinstance(values, (list, tuple)) or not values or any(type(x) is not int or x < least for x in values):
        raise ValueError(f"{name}: want a non-empty list of ints >= {least}, got {values!r}")
    return list(values)


def cu_seqlens(lengths, device=None):
    return torch.tensor([0, *accumulate(_ints("lengths", lengths, 1))], dtype=torch.int32, device=device)


@dataclass(frozen=True)
class Packed:
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    seq_ids: tuple


def pack(seqs, past_lens=None, seq_ids=None, device=None):
    if not isinstance(seqs, (list, tuple)) or not seqs:
        raise ValueError(f"seqs: want a non-empty list of token lists, got {seqs!r}")
    seqs = [_ints("seqs", s, 0) for s in seqs]
    past = [0] * len(seqs) if past_lens is None else _ints("past_lens", past_lens, 0)
    if len(past) != len(seqs):
        raise ValueError(f"past_lens: want {len(seqs)} entries, got {len(past)}")
    ids = tuple(range(len(seqs))) if seq_ids is None else seq_ids
    if not isinstance(ids, (list, tuple)) or len(ids) != len(seqs) or len(set(ids)) != len(ids):
        raise ValueError(f"seq_ids: want {len(seqs)} distinct ids, got {seq_ids!r}")
    tokens, positions = [], []
    for s, p in zip(seqs, past):
        tokens += s
        positions += range(p, p + len(s))
    new, total = [len(s) for s in seqs], [p + len(s) for s, p in zip(seqs, past)]
    return Packed(torch.tensor([tokens], dtype=torch.long, device=device),
                  torch.tensor([positions], dtype=torch.long, device=device),
                  cu_seqlens(new, device), cu_seqlens(total, device), max(new), max(total), tuple(ids))


def _offsets(name, cu, total=None):
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name}: want a 1-D int32 tensor of at least two offsets, got {cu!r}")
    values = cu.tolist()
    if values[0] != 0 or any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(f"{name}: want offsets from 0, strictly increasing, got {values}")
    if total is not None and values[-1] != total:
        raise ValueError(f"{name}: the last offset {values[-1]} is not the {total} tokens given")
    return values


def _segments(cu_q, cu_k, total_q=None, total_k=None, causal=True):
    q, k = _offsets("cu_seqlens_q", cu_q, total_q), _offsets("cu_seqlens_k", cu_k, total_k)
    if len(q) != len(k):
        raise ValueError(f"cu_seqlens_k: {len(k) - 1} sequences, cu_seqlens_q has {len(q) - 1}")
    spans = list(zip(q, q[1:], k, k[1:]))
    for q0, q1, k0, k1 in spans:
        if causal and k1 - k0 < q1 - q0:
            raise ValueError(f"cu_seqlens_k: a causal sequence with {k1 - k0} keys for {q1 - q0} queries")
    return spans


def _block(nq, nk, causal, device):
    """(nq, nk) bool: query i sees keys up to nk - nq + i (bottom-right), or every key."""
    full = torch.ones(nq, nk, dtype=torch.bool, device=device)
    return full.tril(diagonal=nk - nq) if causal else full


def varlen_mask(cu_seqlens_q, cu_seqlens_k, device=None):
    spans = _segments(cu_seqlens_q, cu_seqlens_k)
    device = cu_seqlens_q.device if device is None else device
    mask = torch.zeros(spans[-1][1], spans[-1][3], dtype=torch.bool, device=device)
    for q0, q1, k0, k1 in spans:
        mask[q0:q1, k0:k1] = _block(q1 - q0, k1 - k0, True, device)
    return mask


def _check_attention_args(q, k, v, max_seqlen_q, max_seqlen_k, causal, scale):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"{name}: want a 3-D tensor (tokens, heads, width), got {getattr(x, 'shape', x)!r}")
    if v.shape != k.shape:
        raise ValueError(f"v: want k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.shape[2] != q.shape[2] or q.shape[1] % k.shape[1]:
        raise ValueError(f"k: heads {k.shape[1]} of width {k.shape[2]} do not serve q's {q.shape[1]} of {q.shape[2]}")
    if type(causal) is not bool:
        raise ValueError(f"causal: want True or False, got {causal!r}")
    if scale is not None and (type(scale) not in (int, float) or not scale > 0):
        raise ValueError(f"scale: want None or a number > 0, got {scale!r}")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if type(value) is not int:
            raise ValueError(f"{name}: want an int, got {value!r}")


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=True, scale=None):
    _check_attention_args(q, k, v, max_seqlen_q, max_seqlen_k, causal, scale)
    spans = _segments(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], causal)
    if max_seqlen_q < max(b - a for a, b, _, _ in spans):
        raise ValueError(f"max_seqlen_q: {max_seqlen_q} is below the longest sequence's queries")
    if max_seqlen_k < max(d - c for _, _, c, d in spans):
        raise ValueError(f"max_seqlen_k: {max_seqlen_k} is below the longest sequence's keys")
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    for q0, q1, k0, k1 in spans:
        qs = q[q0:q1].transpose(0, 1)  # (Hq, Tq, D)
        ks = k[k0:k1].transpose(0, 1).repeat_interleave(group, dim=0)  # (Hq, Tk, D)
        vs = v[k0:k1].transpose(0, 1).repeat_interleave(group, dim=0)
        allowed = _block(q1 - q0, k1 - k0, causal, q.device)
        out[q0:q1] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed, scale=scale).transpose(0, 1)
    return out


class _Grow:
    """One sequence's keys and values of one layer: (Hkv, capacity, D) buffers, doubled when full."""

    def __init__(self, like):  # like: (Hkv, 0, D), the dtype, device, heads and width to hold
        self.k, self.v, self.n = torch.empty_like(like), torch.empty_like(like), 0  # (Hkv, capacity, D)

    def add(self, k, v):  # k, v (Hkv, T, D)
        need = self.n + k.shape[1]
        if need > self.k.shape[1]:
            size = max(need, 2 * self.k.shape[1])
            for name in ("k", "v"):
                old = getattr(self, name)
                grown = old.new_empty(old.shape[0], size, old.shape[2])
                grown[:, :self.n] = old[:, :self.n]
                setattr(self, name, grown)
        self.k[:, self.n:need], self.v[:, self.n:need] = k, v
        self.n = need


class PackedKVCache:
    def __init__(self):
        self.store = {}  # seq_id -> {layer: _Grow}
        self.row = None

    def seq_len(self, seq_id, layer=0):
        if type(layer) is not int or layer < 0:
            raise ValueError(f"layer: want an int >= 0, got {layer!r}")
        held = self.store.get(seq_id, {}).get(layer)
        return 0 if held is None else held.n

    def begin(self, packed):
        q = _offsets("packed", packed.cu_seqlens_q)
        k = _offsets("packed", packed.cu_seqlens_k)
        ids = tuple(packed.seq_ids)
        new = [b - a for a, b in zip(q, q[1:])]
        for s, n, k0, k1 in zip(ids, new, k, k[1:]):
            if k1 - k0 - n != self.seq_len(s):
                raise ValueError(f"packed: sequence {s!r} says {k1 - k0 - n} cached tokens, the cache holds "
                                 f"{self.seq_len(s)}")
        self.row = (ids, new)

    def update(self, layer, k, v):
        if self.row is None:
            raise ValueError("begin: no row announced; call begin(packed) before update")
        if type(layer) is not int or layer < 0:
            raise ValueError(f"layer: want an int >= 0, got {layer!r}")
        ids, new = self.row
        if not isinstance(k, torch.Tensor) or k.dim() != 4 or k.shape[0] != 1 or k.shape[2] != sum(new):
            raise ValueError(f"k: want (1, Hkv, {sum(new)}, D), got {getattr(k, 'shape', k)!r}")
        for s in ids:
            held = self.store.get(s, {}).get(layer)
            if held is not None and (held.k.shape[0], held.k.shape[2]) != (k.shape[1], k.shape[3]):
                raise ValueError(f"k: heads and width {(k.shape[1], k.shape[3])} differ from sequence {s!r}'s")
        if not isinstance(v, torch.Tensor) or v.shape != k.shape:
            raise ValueError(f"v: want k's shape {tuple(k.shape)}, got {getattr(v, 'shape', v)!r}")
        keys, values, start = [], [], 0
        for s, n in zip(ids, new):
            grow = self.store.setdefault(s, {}).setdefault(layer, _Grow(k[0, :, :0]))
            grow.add(k[0, :, start:start + n], v[0, :, start:start + n])
            keys.append(grow.k[:, :grow.n])
            values.append(grow.v[:, :grow.n])
            start += n
        return torch.cat(keys, dim=1)[None], torch.cat(values, dim=1)[None]  # (1, Hkv, S, D)

    def free(self, seq_id):
        if seq_id not in self.store:
            raise ValueError(f"seq_id: {seq_id!r} is not held")
        del self.store[seq_id]


def _check_generate_args(model, prompts, max_new_tokens, eos_token_id):
    V = model.config.vocab_size
    if not isinstance(prompts, list) or any(
            not isinstance(p, list) or not p or any(type(t) is not int or not 0 <= t < V for t in p) for p in prompts):
        raise ValueError(f"prompts: want a list of non-empty lists of ids below {V}, got {prompts!r}")
    if type(max_new_tokens) is not int or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: want an int >= 0, got {max_new_tokens!r}")
    if eos_token_id is not None and (type(eos_token_id) is not int or not 0 <= eos_token_id < V):
        raise ValueError(f"eos_token_id: want None or an id below {V}, got {eos_token_id!r}")


@torch.no_grad()
def packed_generate(model, prompts, max_new_tokens, *, eos_token_id=None):
    _check_generate_args(model, prompts, max_new_tokens, eos_token_id)
    out = [[] for _ in prompts]
    if not prompts or max_new_tokens == 0:
        return out
    cache, running = PackedKVCache(), list(range(len(prompts)))
    row = pack([list(p) for p in prompts], device=model.device)
    while running:
        cache.begin(row)
        logits = model(row.input_ids, position_ids=row.position_ids, cache=cache,
                       attention_mask=varlen_mask(row.cu_seqlens_q, row.cu_seqlens_k)[None])
        ends = (row.cu_seqlens_q[1:] - 1).long()
        picks = logits[0, ends].argmax(dim=-1).tolist()
        still = []
        for i, t in zip(running, picks):
            out[i].append(t)
            if len(out[i]) == max_new_tokens or (eos_token_id is not None and t == eos_token_id):
                cache.free(i)
            else:
                still.append(i)
        running = still
        if running:
            row = pack([[out[i][-1]] for i in running], [len(prompts[i]) + len(out[i]) - 1 for i in running],
                       seq_ids=running, device=model.device)
    return out
