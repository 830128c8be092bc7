"""Kata 15 — packed variable-length batches (reference solution).

Shapes: n sequences packed into one row with no padding; T new tokens in the row (the sum of the
query lengths), S keys of the row (the sum of each sequence's cached + new tokens), Hq query heads,
Hkv KV heads, D head width, V vocabulary. ``cu_seqlens`` are int32 offsets ``[0, l0, l0 + l1, ...]``.
The model is ``grader.nn.Llama`` or anything with its interface (``config.vocab_size``, ``device``,
``model(input_ids, position_ids=, cache=, attention_mask=) -> logits``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def _ints(name: str, values, least: int) -> list[int]:
    """``values`` as a list, or ValueError naming ``name``: a non-empty list (or tuple) of ints >= ``least``."""
    if (not isinstance(values, (list, tuple)) or not values
            or any(isinstance(x, bool) or not isinstance(x, int) or x < least for x in values)):
        raise ValueError(f"{name}: expected a non-empty list of ints >= {least}, got {values!r}")
    return list(values)


def cu_seqlens(lengths, device=None) -> torch.Tensor:
    """Cumulative offsets of sequences of ``lengths`` tokens: int32 (n + 1,), ``[0, l0, l0 + l1, ...]``.

    ``lengths``: a non-empty list of ints >= 1; anything else is a ValueError naming ``lengths``.
    """
    lengths = _ints("lengths", lengths, 1)
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32, device=device)  # (n + 1,)


@dataclass(frozen=True)
class Packed:
    """One packed row: n sequences side by side, no padding."""

    input_ids: torch.Tensor  # (1, T) long
    position_ids: torch.Tensor  # (1, T) long; sequence i: past_lens[i] ... past_lens[i] + len_i - 1
    cu_seqlens_q: torch.Tensor  # (n + 1,) int32, offsets of the new tokens
    cu_seqlens_k: torch.Tensor  # (n + 1,) int32, offsets of each sequence's keys: past_lens[i] + len_i
    max_seqlen_q: int  # the longest sequence's new tokens, exactly
    max_seqlen_k: int  # the longest sequence's keys, exactly
    seq_ids: tuple  # the sequences, in row order


def pack(seqs, past_lens=None, seq_ids=None, device=None) -> Packed:
    """Pack ``seqs`` (new token ids of each sequence) into one row; see ``Packed`` for the fields.

    ``past_lens[i]``: the tokens sequence i already has in the cache (default 0): its positions and
    its keys start there. ``seq_ids``: n distinct ids (default 0 ... n - 1). ValueError naming the
    argument for an empty ``seqs`` or sequence, a negative id or past length, or a count that is not n.
    """
    if not isinstance(seqs, (list, tuple)) or not seqs:
        raise ValueError(f"seqs: expected a non-empty list of non-empty lists of token ids, got {seqs!r}")
    seqs = [_ints("seqs", s, 0) for s in seqs]
    n, lengths = len(seqs), [len(s) for s in seqs]
    past = [0] * n if past_lens is None else _ints("past_lens", past_lens, 0)
    if len(past) != n:
        raise ValueError(f"past_lens: expected {n} lengths (one per sequence), got {len(past)}")
    ids = tuple(range(n)) if seq_ids is None else seq_ids
    if not isinstance(ids, (list, tuple)) or len(ids) != n or len(set(ids)) != n:
        raise ValueError(f"seq_ids: expected {n} distinct ids (one per sequence), got {seq_ids!r}")
    keys = [p + m for p, m in zip(past, lengths)]
    positions = [p + i for p, m in zip(past, lengths) for i in range(m)]  # restart at each sequence's cache length
    return Packed(input_ids=torch.tensor([[t for s in seqs for t in s]], dtype=torch.long, device=device),
                  position_ids=torch.tensor([positions], dtype=torch.long, device=device),
                  cu_seqlens_q=cu_seqlens(lengths, device), cu_seqlens_k=cu_seqlens(keys, device),
                  max_seqlen_q=max(lengths), max_seqlen_k=max(keys), seq_ids=tuple(ids))


def _offsets(name: str, cu, total: int | None = None) -> list[int]:
    """The offsets of a cu_seqlens tensor, or ValueError naming ``name``: 1-D int32, from 0, strictly
    increasing (every sequence holds a token), ending at ``total`` when given."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype != torch.int32 or cu.numel() < 2:
        raise ValueError(f"{name}: expected a 1-D int32 tensor [0, l0, l0 + l1, ...], got {cu!r}")
    offsets = cu.tolist()
    if offsets[0] != 0 or any(b <= a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"{name}: expected offsets from 0, strictly increasing (every sequence >= 1 token), "
                         f"got {offsets}")
    if total is not None and offsets[-1] != total:
        raise ValueError(f"{name}: expected the last offset to be the {total} tokens given, got {offsets[-1]}")
    return offsets


def _segments(cu_q, cu_k, total_q=None, total_k=None, causal=True) -> list[tuple[int, int, int, int]]:
    """(q start, q end, k start, k end) of each sequence; ValueError for offsets that do not fit."""
    q, k = _offsets("cu_seqlens_q", cu_q, total_q), _offsets("cu_seqlens_k", cu_k, total_k)
    if len(q) != len(k):
        raise ValueError(f"cu_seqlens_k: expected {len(q) - 1} sequences like cu_seqlens_q, got {len(k) - 1}")
    spans = [(q[i], q[i + 1], k[i], k[i + 1]) for i in range(len(q) - 1)]
    for i, (q0, q1, k0, k1) in enumerate(spans):
        if causal and k1 - k0 < q1 - q0:  # its first query would see no key at all
            raise ValueError(f"cu_seqlens_k: sequence {i} has {k1 - k0} keys for {q1 - q0} queries; a causal "
                             "sequence needs at least as many keys as queries")
    return spans


def varlen_mask(cu_seqlens_q, cu_seqlens_k, device=None) -> torch.Tensor:
    """Bool (T, S), True = may attend: block-diagonal, causal inside each block, aligned bottom-right
    (a sequence's last query sees all its keys). ``device``: default ``cu_seqlens_q``'s."""
    spans = _segments(cu_seqlens_q, cu_seqlens_k)
    device = cu_seqlens_q.device if device is None else device
    mask = torch.zeros(spans[-1][1], spans[-1][3], dtype=torch.bool, device=device)  # (T, S)
    for q0, q1, k0, k1 in spans:
        block = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=device)
        mask[q0:q1, k0:k1] = block.tril(diagonal=(k1 - k0) - (q1 - q0))  # kata 02's offset, per sequence
    return mask


def _check_attention_args(q, k, v, max_seqlen_q, max_seqlen_k, causal, scale) -> None:
    """ValueError naming the argument: q, k, v not 3-D, v not shaped like k, k's width or head count not
    fitting q's, a max_seqlen that is not an int, causal not a bool, scale not None or a number > 0."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"{name}: expected a 3-D tensor (tokens, heads, head_dim), got {x!r}")
    if v.shape != k.shape:
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.shape[2] != q.shape[2] or q.shape[1] % k.shape[1]:
        raise ValueError(f"k: expected a head width of {q.shape[2]} and a head count dividing {q.shape[1]}, "
                         f"got {tuple(k.shape)}")
    for name, x in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(x, bool) or not isinstance(x, int):
            raise ValueError(f"{name}: expected an int, got {x!r}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal: expected True or False, got {causal!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0):
        raise ValueError(f"scale: expected None or a number > 0, got {scale!r}")


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                     causal: bool = True, scale: float | None = None) -> torch.Tensor:
    """FlashAttention's varlen contract: q (T, Hq, D), k and v (S, Hkv, D) -> (T, Hq, D).

    Each sequence attends to its own keys only (causal: aligned bottom-right); query head h uses KV
    head h // (Hq // Hkv); ``scale`` defaults to 1 / sqrt(D). ``max_seqlen_q/k`` below the true
    maximum is a ValueError (above is accepted).
    """
    _check_attention_args(q, k, v, max_seqlen_q, max_seqlen_k, causal, scale)
    spans = _segments(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], causal)
    for name, given, need in (("max_seqlen_q", max_seqlen_q, max(b - a for a, b, _, _ in spans)),
                              ("max_seqlen_k", max_seqlen_k, max(b - a for _, _, a, b in spans))):
        if given < need:
            raise ValueError(f"{name}: expected at least the longest sequence's {need} tokens, got {given}")
    group = q.shape[1] // k.shape[1]
    outs = []
    for q0, q1, k0, k1 in spans:
        qs = q[q0:q1].transpose(0, 1)  # (Hq, lq, D)
        ks = k[k0:k1].transpose(0, 1).repeat_interleave(group, dim=0)  # (Hq, lk, D)
        vs = v[k0:k1].transpose(0, 1).repeat_interleave(group, dim=0)  # (Hq, lk, D)
        mask = None
        if causal:
            mask = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=q.device).tril((k1 - k0) - (q1 - q0))
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale).transpose(0, 1))
    return torch.cat(outs)  # (T, Hq, D)


class PackedKVCache:
    """Each sequence's keys and values per layer, written from packed rows and read back packed."""

    def __init__(self):
        self._kv: dict = {}  # seq_id -> {layer: (K, V)}, each (1, Hkv, L, D)
        self._row: tuple | None = None  # (seq_ids, new tokens of each) of the row begun last

    def begin(self, packed) -> None:
        """Announce the next row: which sequences (``packed.seq_ids``), with how many new tokens each.

        A sequence whose past length (``cu_seqlens_k`` minus ``cu_seqlens_q``) differs from what the
        cache holds for it is a ValueError naming ``packed``, and the row is not begun.
        """
        q = _offsets("packed", packed.cu_seqlens_q)
        k = _offsets("packed", packed.cu_seqlens_k)
        new = [b - a for a, b in zip(q, q[1:])]
        past = [b - a - m for a, b, m in zip(k, k[1:], new)]
        ids = tuple(packed.seq_ids)
        for seq_id, p in zip(ids, past):
            if p != self.seq_len(seq_id):
                raise ValueError(f"packed: sequence {seq_id!r} continues from {p} cached tokens, "
                                 f"but the cache holds {self.seq_len(seq_id)}")
        self._row = (ids, new)

    def update(self, layer: int, k, v) -> tuple[torch.Tensor, torch.Tensor]:
        """Append each sequence's slice of ``k``, ``v`` (1, Hkv, T, D) to it; return every sequence of the
        row, in row order (``cu_seqlens_k``'s), as (K, V), each (1, Hkv, S, D)."""
        if self._row is None:
            raise ValueError("update: call begin(packed) first, so the cache knows the row's sequences")
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise ValueError(f"layer: expected an int >= 0, got {layer!r}")
        ids, new = self._row
        if not isinstance(k, torch.Tensor) or k.dim() != 4 or k.shape[0] != 1 or k.shape[2] != sum(new):
            raise ValueError(f"k: expected (1, kv_heads, {sum(new)}, head_dim) for the row begun, got {k!r}")
        if not isinstance(v, torch.Tensor) or v.shape != k.shape:
            raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {v!r}")
        held = [self._kv.get(i, {}).get(layer) for i in ids]
        for seq_id, kv in zip(ids, held):
            if kv is not None and (kv[0].shape[1], kv[0].shape[3]) != (k.shape[1], k.shape[3]):
                raise ValueError(f"k: expected {kv[0].shape[1]} heads of width {kv[0].shape[3]} like the keys "
                                 f"held for sequence {seq_id!r}, got {tuple(k.shape)}")
        keys, values, start = [], [], 0
        for seq_id, n, kv in zip(ids, new, held):
            K, V = k[:, :, start:start + n], v[:, :, start:start + n]  # (1, Hkv, n, D)
            if kv is not None:
                K, V = torch.cat([kv[0], K], dim=2), torch.cat([kv[1], V], dim=2)  # (1, Hkv, L + n, D)
            else:
                K, V = K.clone(), V.clone()  # the cache's own copy, not a view of the caller's k
            self._kv.setdefault(seq_id, {})[layer] = (K, V)
            keys.append(K)
            values.append(V)
            start += n
        return torch.cat(keys, dim=2), torch.cat(values, dim=2)  # (1, Hkv, S, D)

    def seq_len(self, seq_id, layer: int = 0) -> int:
        """Tokens cached for ``seq_id`` in ``layer``; 0 for a sequence or layer not seen (or freed)."""
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise ValueError(f"layer: expected an int >= 0, got {layer!r}")
        kv = self._kv.get(seq_id, {}).get(layer)
        return 0 if kv is None else kv[0].shape[2]

    def free(self, seq_id) -> None:
        """Forget ``seq_id``'s keys and values; an id the cache does not hold is a ValueError naming it."""
        if seq_id not in self._kv:
            raise ValueError(f"seq_id: the cache holds no sequence {seq_id!r}")
        del self._kv[seq_id]


def _check_generate_args(model, prompts, max_new_tokens, eos_token_id) -> None:
    """ValueError naming the argument: prompts not a list of non-empty lists of ids of the vocabulary,
    max_new_tokens not an int >= 0, eos_token_id neither None nor an id of the vocabulary."""
    vocab = model.config.vocab_size
    if not isinstance(prompts, (list, tuple)) or any(
            not isinstance(p, (list, tuple)) or not p
            or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in p) for p in prompts):
        raise ValueError(f"prompts: expected a list of non-empty lists of token ids from 0 to {vocab - 1}, "
                         f"got {prompts!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an int >= 0, got {max_new_tokens!r}")
    if eos_token_id is not None and (isinstance(eos_token_id, bool) or not isinstance(eos_token_id, int)
                                     or not 0 <= eos_token_id < vocab):
        raise ValueError(f"eos_token_id: expected None or a token id from 0 to {vocab - 1}, got {eos_token_id!r}")


@torch.inference_mode()
def packed_generate(model, prompts, max_new_tokens: int, *, eos_token_id: int | None = None) -> list[list[int]]:
    """Greedy generation of every prompt from packed rows: one packed prefill, then one decode row per
    step holding one token of each sequence still running. Each prompt gets exactly the tokens it
    would get alone (ties toward the lower id; an EOS is kept, then that sequence stops).
    """
    _check_generate_args(model, prompts, max_new_tokens, eos_token_id)
    out: list[list[int]] = [[] for _ in prompts]
    if max_new_tokens == 0 or not out:
        return out
    cache, live = PackedKVCache(), list(range(len(prompts)))
    row = pack([list(p) for p in prompts], device=model.device)
    while True:
        cache.begin(row)
        mask = varlen_mask(row.cu_seqlens_q, row.cu_seqlens_k)[None]  # (1, T, S)
        logits = model(row.input_ids, position_ids=row.position_ids, cache=cache, attention_mask=mask)  # (1, T, V)
        last = logits[0, row.cu_seqlens_q[1:].long() - 1]  # (n, V): each sequence's newest token
        going, feed, past = [], [], []
        for i, token in zip(live, last.argmax(dim=-1).tolist()):
            out[i].append(token)
            if len(out[i]) < max_new_tokens and (eos_token_id is None or token != eos_token_id):
                going.append(i)
                feed.append([token])
                past.append(len(prompts[i]) + len(out[i]) - 1)
            else:
                cache.free(i)
        if not going:
            return out
        live = going
        row = pack(feed, past, seq_ids=going, device=model.device)
