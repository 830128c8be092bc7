"""Kata 15 from its README, another style: plain Python loops for the offsets and positions, the mask
filled entry by entry per sequence, attention computed per sequence and per KV group in float64 with
an explicit softmax (cast back at the end), the cache keyed by (sequence, layer) with one tensor each,
and a generate loop that keeps the live sequences in a list of dicts."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def _check_list(name, values, smallest):
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{name}: expected a list, got {type(values).__name__}")
    if len(values) == 0:
        raise ValueError(f"{name}: expected at least one entry, got none")
    for x in values:
        if isinstance(x, bool) or not isinstance(x, int):
            raise ValueError(f"{name}: expected ints, got {x!r}")
        if x < smallest:
            raise ValueError(f"{name}: expected every entry >= {smallest}, got {x}")


def cu_seqlens(lengths, device=None):
    _check_list("lengths", lengths, 1)
    out, total = [0], 0
    for n in lengths:
        total += n
        out.append(total)
    return torch.tensor(out, dtype=torch.int32, device=device)


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
        raise ValueError(f"seqs: expected a non-empty list of sequences, got {seqs!r}")
    for s in seqs:
        _check_list("seqs", s, 0)
    count = len(seqs)
    past = list(past_lens) if isinstance(past_lens, (list, tuple)) else ([0] * count if past_lens is None else past_lens)
    _check_list("past_lens", past, 0)
    if len(past) != count:
        raise ValueError(f"past_lens: expected {count} entries, got {len(past)}")
    ids = tuple(range(count)) if seq_ids is None else seq_ids
    if not isinstance(ids, (list, tuple)) or len(ids) != count:
        raise ValueError(f"seq_ids: expected {count} ids, got {seq_ids!r}")
    if len(set(ids)) != count:
        raise ValueError(f"seq_ids: expected distinct ids, got {seq_ids!r}")
    token_list, position_list, q_lens, k_lens = [], [], [], []
    for s, p in zip(seqs, past):
        for j, t in enumerate(s):
            token_list.append(t)
            position_list.append(p + j)
        q_lens.append(len(s))
        k_lens.append(p + len(s))
    return Packed(input_ids=torch.tensor([token_list], device=device),
                  position_ids=torch.tensor([position_list], device=device),
                  cu_seqlens_q=cu_seqlens(q_lens, device), cu_seqlens_k=cu_seqlens(k_lens, device),
                  max_seqlen_q=max(q_lens), max_seqlen_k=max(k_lens), seq_ids=tuple(ids))


def _bounds(name, cu, need_total=None):
    if not isinstance(cu, torch.Tensor):
        raise ValueError(f"{name}: expected an int32 tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise ValueError(f"{name}: expected dtype int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name}: expected a 1-D tensor of n + 1 offsets, got shape {tuple(cu.shape)}")
    b = [int(x) for x in cu.tolist()]
    if b[0] != 0:
        raise ValueError(f"{name}: expected the first offset 0, got {b[0]}")
    for i in range(1, len(b)):
        if b[i] <= b[i - 1]:
            raise ValueError(f"{name}: expected increasing offsets, got {b}")
    if need_total is not None and b[-1] != need_total:
        raise ValueError(f"{name}: expected to end at {need_total}, got {b[-1]}")
    return b


def _blocks(cu_q, cu_k, causal, tq=None, tk=None):
    bq = _bounds("cu_seqlens_q", cu_q, tq)
    bk = _bounds("cu_seqlens_k", cu_k, tk)
    if len(bq) != len(bk):
        raise ValueError(f"cu_seqlens_k: {len(bk) - 1} sequences, but cu_seqlens_q has {len(bq) - 1}")
    blocks = []
    for i in range(len(bq) - 1):
        nq, nk = bq[i + 1] - bq[i], bk[i + 1] - bk[i]
        if causal and nk < nq:
            raise ValueError(f"cu_seqlens_k: sequence {i} has {nk} keys for {nq} queries")
        blocks.append((bq[i], nq, bk[i], nk))
    return blocks


def varlen_mask(cu_seqlens_q, cu_seqlens_k, device=None):
    blocks = _blocks(cu_seqlens_q, cu_seqlens_k, True)
    where = device if device is not None else cu_seqlens_q.device
    T = blocks[-1][0] + blocks[-1][1]
    S = blocks[-1][2] + blocks[-1][3]
    grid = [[False] * S for _ in range(T)]
    for q0, nq, k0, nk in blocks:
        for i in range(nq):
            for j in range(nk - nq + i + 1):
                grid[q0 + i][k0 + j] = True
    return torch.tensor(grid, dtype=torch.bool, device=where)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=True, scale=None):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"{name}: expected a 3-D tensor, got {type(x).__name__}")
    if v.shape != k.shape:
        raise ValueError(f"v: expected shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k: expected head width {q.shape[-1]}, got {k.shape[-1]}")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"k: {k.shape[1]} KV heads do not divide {q.shape[1]} query heads")
    if not isinstance(causal, bool):
        raise ValueError(f"causal: expected a bool, got {causal!r}")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
            raise ValueError(f"scale: expected a positive number, got {scale!r}")
    if isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int):
        raise ValueError(f"max_seqlen_q: expected an int, got {max_seqlen_q!r}")
    if isinstance(max_seqlen_k, bool) or not isinstance(max_seqlen_k, int):
        raise ValueError(f"max_seqlen_k: expected an int, got {max_seqlen_k!r}")
    blocks = _blocks(cu_seqlens_q, cu_seqlens_k, causal, q.shape[0], k.shape[0])
    if max_seqlen_q < max(b[1] for b in blocks):
        raise ValueError(f"max_seqlen_q: {max_seqlen_q} is below the longest sequence")
    if max_seqlen_k < max(b[3] for b in blocks):
        raise ValueError(f"max_seqlen_k: {max_seqlen_k} is below the longest sequence")
    factor = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for q0, nq, k0, nk in blocks:
        rows = torch.arange(nq, device=q.device)[:, None]
        cols = torch.arange(nk, device=q.device)[None, :]
        allowed = cols <= rows + (nk - nq) if causal else torch.ones(nq, nk, dtype=torch.bool, device=q.device)
        for g in range(k.shape[1]):
            kg = k[k0:k0 + nk, g].double()  # (nk, D)
            vg = v[k0:k0 + nk, g].double()
            for h in range(g * group, (g + 1) * group):
                s = q[q0:q0 + nq, h].double() @ kg.T * factor  # (nq, nk)
                s = s.masked_fill(~allowed, -math.inf)
                s = torch.exp(s - s.max(dim=1, keepdim=True).values)
                out[q0:q0 + nq, h] = (s / s.sum(dim=1, keepdim=True)) @ vg
    return out.to(q.dtype)


class PackedKVCache:
    def __init__(self):
        self.store = {}  # (seq_id, layer) -> (K, V) each (1, Hkv, L, D)
        self.ids = set()
        self.current = None

    def begin(self, packed):
        bq = _bounds("packed", packed.cu_seqlens_q)
        bk = _bounds("packed", packed.cu_seqlens_k)
        names = tuple(packed.seq_ids)
        plan = []
        for i, name in enumerate(names):
            new = bq[i + 1] - bq[i]
            old = bk[i + 1] - bk[i] - new
            if old != self.seq_len(name):
                raise ValueError(f"packed: {name!r} claims {old} cached tokens, {self.seq_len(name)} are held")
            plan.append((name, new))
        self.current = plan

    def update(self, layer, k, v):
        if self.current is None:
            raise ValueError("begin(packed) must be called before update")
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise ValueError(f"layer: expected an int >= 0, got {layer!r}")
        T = sum(n for _, n in self.current)
        if not isinstance(k, torch.Tensor) or k.dim() != 4 or k.shape[0] != 1 or k.shape[2] != T:
            raise ValueError(f"k: expected (1, Hkv, {T}, D)")
        if not isinstance(v, torch.Tensor) or v.shape != k.shape:
            raise ValueError(f"v: expected the shape of k {tuple(k.shape)}")
        for name, _ in self.current:
            held = self.store.get((name, layer))
            if held is not None and (held[0].shape[1] != k.shape[1] or held[0].shape[3] != k.shape[3]):
                raise ValueError(f"k: {tuple(k.shape)} does not match the {tuple(held[0].shape)} held for {name!r}")
        offset, parts_k, parts_v = 0, [], []
        for name, n in self.current:
            held = self.store.get((name, layer))
            nk, nv = k[:, :, offset:offset + n], v[:, :, offset:offset + n]
            if held is None:
                merged = (nk.contiguous().clone(), nv.contiguous().clone())
            else:
                merged = (torch.cat((held[0], nk), 2), torch.cat((held[1], nv), 2))
            self.store[(name, layer)] = merged
            self.ids.add(name)
            parts_k.append(merged[0])
            parts_v.append(merged[1])
            offset += n
        return torch.cat(parts_k, 2), torch.cat(parts_v, 2)

    def seq_len(self, seq_id, layer=0):
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise ValueError(f"layer: expected an int >= 0, got {layer!r}")
        held = self.store.get((seq_id, layer))
        return 0 if held is None else int(held[0].shape[2])

    def free(self, seq_id):
        if seq_id not in self.ids:
            raise ValueError(f"seq_id: {seq_id!r} is not held")
        self.ids.discard(seq_id)
        for key in [key for key in self.store if key[0] == seq_id]:
            del self.store[key]


def packed_generate(model, prompts, max_new_tokens, *, eos_token_id=None):
    vocab = model.config.vocab_size
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts: expected a list of prompts, got {type(prompts).__name__}")
    for p in prompts:
        if not isinstance(p, (list, tuple)) or not p:
            raise ValueError("prompts: every prompt must be a non-empty list")
        for t in p:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0 or t >= vocab:
                raise ValueError(f"prompts: {t!r} is not a token id of the vocabulary")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an int >= 0, got {max_new_tokens!r}")
    if eos_token_id is not None:
        if isinstance(eos_token_id, bool) or not isinstance(eos_token_id, int) or not 0 <= eos_token_id < vocab:
            raise ValueError(f"eos_token_id: {eos_token_id!r} is not a token id")
    answers = [[] for _ in prompts]
    if max_new_tokens == 0:
        return answers
    cache = PackedKVCache()
    live = [{"id": i, "feed": list(p), "past": 0} for i, p in enumerate(prompts)]
    with torch.no_grad():
        while live:
            row = pack([s["feed"] for s in live], [s["past"] for s in live], [s["id"] for s in live],
                       device=model.device)
            cache.begin(row)
            mask = varlen_mask(row.cu_seqlens_q, row.cu_seqlens_k).unsqueeze(0)
            logits = model(row.input_ids, position_ids=row.position_ids, cache=cache, attention_mask=mask)
            bounds = row.cu_seqlens_q.tolist()
            survivors = []
            for n, s in enumerate(live):
                token = int(torch.argmax(logits[0, bounds[n + 1] - 1]))
                answers[s["id"]].append(token)
                s["past"] += len(s["feed"])
                finished = len(answers[s["id"]]) >= max_new_tokens
                finished = finished or (eos_token_id is not None and token == eos_token_id)
                if finished:
                    cache.free(s["id"])
                else:
                    s["feed"] = [token]
                    survivors.append(s)
            live = survivors
    return answers
