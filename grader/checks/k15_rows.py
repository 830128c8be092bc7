"""Rows for kata 15's checks: drawn packed rows (sequences of new tokens, each with a past length),
their offsets as tensors, the row as plain data, and ``Row``, the grader's own description of a packed
row that ``PackedKVCache.begin`` is handed (the cache is checked apart from the learner's ``pack``).

What a check compares must be plain data (the cohort's record and a handout's public record hold
nothing else): ``fields`` reads a learner's ``Packed`` into a dict of its fields before it is compared.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from grader.engine import Failure, report
from grader.checks.support import envelope
from grader.checks.support.common import DTYPES, SEEDS

FIELDS = ("input_ids", "position_ids", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "seq_ids")


@st.composite
def rows(draw, max_seqs: int = 6, max_len: int = 12):
    """1 to ``max_seqs`` sequences: new tokens (1 to ``max_len``; a third of them single decode tokens) and
    past lengths (0 to 9): a mixed row, prefill chunks next to decode tokens, as a serving engine builds it."""
    n = draw(st.integers(1, max_seqs))
    lengths = [draw(st.one_of(st.just(1), st.integers(1, max_len))) for _ in range(n)]
    past = [draw(st.integers(0, 9)) for _ in range(n)]
    return {"lengths": lengths, "past": past, "seed": draw(SEEDS)}


@st.composite
def attention_rows(draw):
    """A row with heads, a GQA ratio (MHA and MQA included), a head width and a dtype."""
    ex = draw(rows())
    hkv = draw(st.sampled_from([1, 2]))
    ex.update(hkv=hkv, hq=hkv * draw(st.sampled_from([1, 2, 4])), d=draw(st.sampled_from([4, 8])), dtype=draw(DTYPES))
    return ex


def tokens(ex: dict) -> list[list[int]]:
    """Seeded token ids (0 to 99) for each sequence of a row example."""
    g = torch.Generator().manual_seed(ex["seed"])
    return [torch.randint(0, 100, (n,), generator=g).tolist() for n in ex["lengths"]]


def offsets(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def cu(lengths: list[int], device="cpu") -> torch.Tensor:
    """The int32 offsets of ``lengths``, built by the grader (inputs of varlen_mask and varlen_attention)."""
    return torch.tensor(offsets(lengths), dtype=torch.int32, device=device)


def key_lengths(ex: dict) -> list[int]:
    """Each sequence's keys: an explicit ``k_lengths``, else past + new."""
    return ex.get("k_lengths") or [p + n for p, n in zip(ex["past"], ex["lengths"])]


def fields(packed) -> dict:
    """A learner's ``Packed`` as a dict of its fields (plain data); a missing field is a clear failure."""
    if packed is None:
        raise Failure("pack returned None; expected a Packed", ("returned", "None"))
    missing = [name for name in FIELDS if not hasattr(packed, name)]
    if missing:
        raise Failure(f"pack returned {report.describe(packed)} without the field(s) {', '.join(missing)} of Packed",
                      ("missing fields", tuple(missing)))
    out = {name: getattr(packed, name) for name in FIELDS}
    out["seq_ids"] = list(out["seq_ids"]) if isinstance(out["seq_ids"], (tuple, list)) else out["seq_ids"]
    out["seq_ids is a tuple"] = isinstance(getattr(packed, "seq_ids"), tuple)
    try:  # a frozen dataclass: the row cannot be changed behind the caller's back
        setattr(packed, "seq_ids", getattr(packed, "seq_ids"))
        out["frozen"] = False
    except AttributeError:
        out["frozen"] = True
    for name in ("max_seqlen_q", "max_seqlen_k"):  # Python ints, as FlashAttention takes them
        out[f"{name} is an int"] = isinstance(out[name], int) and not isinstance(out[name], bool)
    return out


@dataclass(frozen=True)
class Row:
    """A packed row as ``pack`` describes it, built by the grader for the cache checks."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    seq_ids: tuple


def row(new: list[int], past: list[int], seq_ids, device="cpu") -> Row:
    """The row of sequences ``seq_ids`` with ``new`` tokens each after ``past`` cached (token ids 0)."""
    keys = [p + n for p, n in zip(past, new)]
    positions = [p + i for p, n in zip(past, new) for i in range(n)]
    return Row(torch.zeros(1, sum(new), dtype=torch.long, device=device),
               torch.tensor([positions], dtype=torch.long, device=device), cu(new, device), cu(keys, device),
               max(new), max(keys), tuple(seq_ids))


def qkv(ex: dict, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (T, Hq, D), k and v (S, Hkv, D) of an attention example (envelope: dtype, scale, strided views)."""
    T, S = sum(ex["lengths"]), sum(key_lengths(ex))
    q = envelope.tensor(ex, ex["seed"], T, ex["hq"], ex["d"], device=device)
    k = envelope.tensor(ex, ex["seed"] + 1, S, ex["hkv"], ex["d"], device=device)
    v = envelope.tensor(ex, ex["seed"] + 2, S, ex["hkv"], ex["d"], device=device)
    return q, k, v


def maxima(ex: dict) -> tuple[int, int]:
    """The max_seqlen_q and max_seqlen_k an example passes: exact, plus its ``slack`` when it has one."""
    extra = ex.get("slack", 0)
    return max(ex["lengths"]) + extra, max(key_lengths(ex)) + extra
