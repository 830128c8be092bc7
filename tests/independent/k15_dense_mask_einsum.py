"""Kata 15 from its README, another style: offsets by torch.cumsum, the mask built in one shot from
segment ids (no loop), attention as one einsum over the whole row under that dense mask, the cache as
lists of chunks per sequence and layer (joined when read), and decode rows in reverse order."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def _int_list(name, xs, low):
    ok = isinstance(xs, (list, tuple)) and len(xs) > 0
    ok = ok and all(type(x) is int and x >= low for x in xs)
    if not ok:
        raise ValueError(f"{name} must be a non-empty list of ints >= {low}; got {xs!r}")
    return list(xs)


def cu_seqlens(lengths, device=None):
    lengths = _int_list("lengths", lengths, 1)
    sums = torch.cumsum(torch.tensor([0] + lengths, dtype=torch.int64), 0)
    return sums.to(dtype=torch.int32, device=device)


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
    if not isinstance(seqs, (list, tuple)) or len(seqs) == 0:
        raise ValueError(f"seqs must be a non-empty list of token lists; got {seqs!r}")
    seqs = [_int_list("seqs", s, 0) for s in seqs]
    n = len(seqs)
    if past_lens is None:
        past_lens = [0] * n
    past_lens = _int_list("past_lens", past_lens, 0)
    if len(past_lens) != n:
        raise ValueError(f"past_lens must hold {n} entries; got {len(past_lens)}")
    if seq_ids is None:
        seq_ids = list(range(n))
    if not isinstance(seq_ids, (list, tuple)) or len(seq_ids) != n or len(set(seq_ids)) != n:
        raise ValueError(f"seq_ids must be {n} distinct ids; got {seq_ids!r}")
    q_lens = [len(s) for s in seqs]
    k_lens = [a + b for a, b in zip(past_lens, q_lens)]
    flat = torch.tensor(sum(seqs, []), dtype=torch.long)
    starts = torch.repeat_interleave(torch.tensor(past_lens), torch.tensor(q_lens))
    firsts = torch.repeat_interleave(torch.tensor([0] + q_lens[:-1]).cumsum(0), torch.tensor(q_lens))
    pos = starts + torch.arange(len(flat)) - firsts
    return Packed(flat[None].to(device), pos[None].to(device), cu_seqlens(q_lens, device), cu_seqlens(k_lens, device),
                  int(max(q_lens)), int(max(k_lens)), tuple(seq_ids))


def _read_cu(name, cu):
    if type(cu) is not torch.Tensor or cu.dtype != torch.int32 or cu.ndim != 1 or len(cu) < 2:
        raise ValueError(f"{name} must be a 1-D int32 tensor; got {cu!r}")
    vals = cu.tolist()
    if vals[0] != 0:
        raise ValueError(f"{name} must start at 0; got {vals}")
    if any(b - a < 1 for a, b in zip(vals, vals[1:])):
        raise ValueError(f"{name} must be strictly increasing; got {vals}")
    return vals


def _pair(cu_q, cu_k, causal=True):
    qv, kv = _read_cu("cu_seqlens_q", cu_q), _read_cu("cu_seqlens_k", cu_k)
    if len(qv) != len(kv):
        raise ValueError(f"cu_seqlens_k has {len(kv) - 1} sequences, cu_seqlens_q {len(qv) - 1}")
    ql = [b - a for a, b in zip(qv, qv[1:])]
    kl = [b - a for a, b in zip(kv, kv[1:])]
    if causal and any(k < q for q, k in zip(ql, kl)):
        raise ValueError(f"cu_seqlens_k: a causal sequence has fewer keys than queries ({kl} for {ql})")
    return qv, kv, ql, kl


def _dense(qv, kv, ql, kl, causal, device):
    n = len(ql)
    seg_q = torch.repeat_interleave(torch.arange(n, device=device), torch.tensor(ql, device=device))
    seg_k = torch.repeat_interleave(torch.arange(n, device=device), torch.tensor(kl, device=device))
    end_q = torch.tensor(qv[1:], device=device)[seg_q]
    end_k = torch.tensor(kv[1:], device=device)[seg_k]
    back_q = torch.arange(qv[-1], device=device) - end_q  # -1 for the last query of a sequence
    back_k = torch.arange(kv[-1], device=device) - end_k
    same = seg_q[:, None] == seg_k[None, :]
    if not causal:
        return same
    return same & (back_k[None, :] <= back_q[:, None])


def varlen_mask(cu_seqlens_q, cu_seqlens_k, device=None):
    qv, kv, ql, kl = _pair(cu_seqlens_q, cu_seqlens_k)
    return _dense(qv, kv, ql, kl, True, cu_seqlens_q.device if device is None else device)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=True, scale=None):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not torch.is_tensor(t) or t.ndim != 3:
            raise ValueError(f"{name} must be (tokens, heads, head_dim); got {t!r}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have k's shape {tuple(k.shape)}; got {tuple(v.shape)}")
    Hq, Hkv = q.shape[1], k.shape[1]
    if k.shape[2] != q.shape[2] or Hq % Hkv != 0:
        raise ValueError(f"k of shape {tuple(k.shape)} does not fit q of shape {tuple(q.shape)}")
    if type(causal) is not bool:
        raise ValueError(f"causal must be a bool; got {causal!r}")
    if scale is not None and (type(scale) not in (int, float) or scale <= 0):
        raise ValueError(f"scale must be None or > 0; got {scale!r}")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if type(m) is not int:
            raise ValueError(f"{name} must be an int; got {m!r}")
    qv, kv, ql, kl = _pair(cu_seqlens_q, cu_seqlens_k, causal)
    if qv[-1] != q.shape[0]:
        raise ValueError(f"cu_seqlens_q ends at {qv[-1]} but q has {q.shape[0]} tokens")
    if kv[-1] != k.shape[0]:
        raise ValueError(f"cu_seqlens_k ends at {kv[-1]} but k has {k.shape[0]} tokens")
    if max_seqlen_q < max(ql):
        raise ValueError(f"max_seqlen_q = {max_seqlen_q} is below the longest query length {max(ql)}")
    if max_seqlen_k < max(kl):
        raise ValueError(f"max_seqlen_k = {max_seqlen_k} is below the longest key length {max(kl)}")
    allowed = _dense(qv, kv, ql, kl, causal, q.device)  # (T, S)
    kk = k.repeat_interleave(Hq // Hkv, dim=1)  # (S, Hq, D)
    vv = v.repeat_interleave(Hq // Hkv, dim=1)
    s = (1 / math.sqrt(q.shape[2])) if scale is None else scale
    scores = torch.einsum("thd,shd->hts", q, kk) * s  # (Hq, T, S)
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("hts,shd->thd", weights, vv)


class PackedKVCache:
    def __init__(self):
        self.chunks = {}  # id -> layer -> list of (k, v) chunks (1, Hkv, n, D)
        self.row = None

    def _held(self, seq_id, layer):
        return sum(c[0].shape[2] for c in self.chunks.get(seq_id, {}).get(layer, []))

    def begin(self, packed):
        qv = _read_cu("packed", packed.cu_seqlens_q)
        kv = _read_cu("packed", packed.cu_seqlens_k)
        ids = list(packed.seq_ids)
        lens = [qv[i + 1] - qv[i] for i in range(len(ids))]
        for i, sid in enumerate(ids):
            past = kv[i + 1] - kv[i] - lens[i]
            if past != self._held(sid, 0):
                raise ValueError(f"packed says {sid!r} has {past} cached tokens; the cache has {self._held(sid, 0)}")
        self.row = list(zip(ids, lens))

    def update(self, layer, k, v):
        if self.row is None:
            raise ValueError("begin(packed) has not been called")
        if type(layer) is not int or layer < 0:
            raise ValueError(f"layer must be an int >= 0; got {layer!r}")
        total = sum(n for _, n in self.row)
        if not torch.is_tensor(k) or k.ndim != 4 or k.shape[0] != 1 or k.shape[2] != total:
            raise ValueError(f"k must be (1, Hkv, {total}, D); got {getattr(k, 'shape', k)!r}")
        if not torch.is_tensor(v) or v.shape != k.shape:
            raise ValueError(f"v must have k's shape; got {getattr(v, 'shape', v)!r}")
        for sid, _ in self.row:
            old = self.chunks.get(sid, {}).get(layer)
            if old and (old[0][0].shape[1] != k.shape[1] or old[0][0].shape[3] != k.shape[3]):
                raise ValueError(f"k heads/width {tuple(k.shape)} differ from what {sid!r} holds")
        at = 0
        for sid, n in self.row:
            self.chunks.setdefault(sid, {}).setdefault(layer, []).append(
                (k[:, :, at:at + n].clone(), v[:, :, at:at + n].clone()))
            at += n
        K = torch.cat([c[0] for sid, _ in self.row for c in self.chunks[sid][layer]], dim=2)
        V = torch.cat([c[1] for sid, _ in self.row for c in self.chunks[sid][layer]], dim=2)
        return K, V

    def seq_len(self, seq_id, layer=0):
        if type(layer) is not int or layer < 0:
            raise ValueError(f"layer must be an int >= 0; got {layer!r}")
        return self._held(seq_id, layer)

    def free(self, seq_id):
        if seq_id not in self.chunks:
            raise ValueError(f"seq_id {seq_id!r} is not in the cache")
        self.chunks.pop(seq_id)


@torch.no_grad()
def packed_generate(model, prompts, max_new_tokens, *, eos_token_id=None):
    V = model.config.vocab_size
    good = isinstance(prompts, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) > 0 and all(type(t) is int and 0 <= t < V for t in p) for p in prompts)
    if not good:
        raise ValueError(f"prompts must be non-empty lists of ids below {V}; got {prompts!r}")
    if type(max_new_tokens) is not int or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0; got {max_new_tokens!r}")
    if eos_token_id is not None and (type(eos_token_id) is not int or not 0 <= eos_token_id < V):
        raise ValueError(f"eos_token_id must be None or an id below {V}; got {eos_token_id!r}")
    results = {i: [] for i in range(len(prompts))}
    if max_new_tokens == 0 or len(prompts) == 0:
        return [results[i] for i in range(len(prompts))]
    cache = PackedKVCache()
    running = {i: list(p) for i, p in enumerate(prompts)}  # id -> tokens to feed next
    first = True
    while running:
        order = sorted(running) if first else sorted(running, reverse=True)
        past = [0 if first else len(prompts[i]) + len(results[i]) - 1 for i in order]
        p = pack([running[i] for i in order], past, order, device=model.device)
        cache.begin(p)
        logits = model(p.input_ids, position_ids=p.position_ids, cache=cache,
                       attention_mask=varlen_mask(p.cu_seqlens_q, p.cu_seqlens_k)[None])
        ends = p.cu_seqlens_q[1:].long() - 1
        picked = logits[0].index_select(0, ends).argmax(-1).tolist()
        for i, tok in zip(order, picked):
            results[i].append(tok)
            if tok == eos_token_id or len(results[i]) == max_new_tokens:
                running.pop(i)
                cache.free(i)
            else:
                running[i] = [tok]
        first = False
    return [results[i] for i in range(len(prompts))]
