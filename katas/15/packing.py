"""Kata 15 — packed variable-length batches.

Fill in every function that raises NotImplementedError, then run ``pytest katas/15``; the README
walks through the tasks.

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
    raise NotImplementedError("kata 15: _ints — see README, task 1")


def cu_seqlens(lengths, device=None) -> torch.Tensor:
    """Cumulative offsets of sequences of ``lengths`` tokens: int32 (n + 1,), ``[0, l0, l0 + l1, ...]``.

    ``lengths``: a non-empty list of ints >= 1; anything else is a ValueError naming ``lengths``.
    """
    raise NotImplementedError("kata 15: cu_seqlens — see README, task 1")


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
    raise NotImplementedError("kata 15: pack — see README, task 1")


def _offsets(name: str, cu, total: int | None = None) -> list[int]:
    """The offsets of a cu_seqlens tensor, or ValueError naming ``name``: 1-D int32, from 0, strictly
    increasing (every sequence holds a token), ending at ``total`` when given."""
    raise NotImplementedError("kata 15: _offsets — see README, task 2")


def _segments(cu_q, cu_k, total_q=None, total_k=None, causal=True) -> list[tuple[int, int, int, int]]:
    """(q start, q end, k start, k end) of each sequence; ValueError for offsets that do not fit."""
    raise NotImplementedError("kata 15: _segments — see README, task 2")


def varlen_mask(cu_seqlens_q, cu_seqlens_k, device=None) -> torch.Tensor:
    """Bool (T, S), True = may attend: block-diagonal, causal inside each block, aligned bottom-right
    (a sequence's last query sees all its keys). ``device``: default ``cu_seqlens_q``'s."""
    raise NotImplementedError("kata 15: varlen_mask — see README, task 2")


def _check_attention_args(q, k, v, max_seqlen_q, max_seqlen_k, causal, scale) -> None:
    """ValueError naming the argument: q, k, v not 3-D, v not shaped like k, k's width or head count not
    fitting q's, a max_seqlen that is not an int, causal not a bool, scale not None or a number > 0."""
    raise NotImplementedError("kata 15: _check_attention_args — see README, task 2")


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                     causal: bool = True, scale: float | None = None) -> torch.Tensor:
    """FlashAttention's varlen contract: q (T, Hq, D), k and v (S, Hkv, D) -> (T, Hq, D).

    Each sequence attends to its own keys only (causal: aligned bottom-right); query head h uses KV
    head h // (Hq // Hkv); ``scale`` defaults to 1 / sqrt(D). ``max_seqlen_q/k`` below the true
    maximum is a ValueError (above is accepted).
    """
    raise NotImplementedError("kata 15: varlen_attention — see README, task 2")


class PackedKVCache:
    """Each sequence's keys and values per layer, written from packed rows and read back packed."""

    def __init__(self):
        raise NotImplementedError("kata 15: PackedKVCache — see README, task 3")

    def begin(self, packed) -> None:
        """Announce the next row: which sequences (``packed.seq_ids``), with how many new tokens each.

        A sequence whose past length (``cu_seqlens_k`` minus ``cu_seqlens_q``) differs from what the
        cache holds for it is a ValueError naming ``packed``, and the row is not begun.
        """
        raise NotImplementedError("kata 15: PackedKVCache.begin — see README, task 3")

    def update(self, layer: int, k, v) -> tuple[torch.Tensor, torch.Tensor]:
        """Append each sequence's slice of ``k``, ``v`` (1, Hkv, T, D) to it; return every sequence of the
        row, in row order (``cu_seqlens_k``'s), as (K, V), each (1, Hkv, S, D)."""
        raise NotImplementedError("kata 15: PackedKVCache.update — see README, task 3")

    def seq_len(self, seq_id, layer: int = 0) -> int:
        """Tokens cached for ``seq_id`` in ``layer``; 0 for a sequence or layer not seen (or freed)."""
        raise NotImplementedError("kata 15: PackedKVCache.seq_len — see README, task 3")

    def free(self, seq_id) -> None:
        """Forget ``seq_id``'s keys and values; an id the cache does not hold is a ValueError naming it."""
        raise NotImplementedError("kata 15: PackedKVCache.free — see README, task 3")


def _check_generate_args(model, prompts, max_new_tokens, eos_token_id) -> None:
    """ValueError naming the argument: prompts not a list of non-empty lists of ids of the vocabulary,
    max_new_tokens not an int >= 0, eos_token_id neither None nor an id of the vocabulary."""
    raise NotImplementedError("kata 15: _check_generate_args — see README, task 4")


@torch.inference_mode()
def packed_generate(model, prompts, max_new_tokens: int, *, eos_token_id: int | None = None) -> list[list[int]]:
    """Greedy generation of every prompt from packed rows: one packed prefill, then one decode row per
    step holding one token of each sequence still running. Each prompt gets exactly the tokens it
    would get alone (ties toward the lower id; an EOS is kept, then that sequence stops).
    """
    raise NotImplementedError("kata 15: packed_generate — see README, task 4")
