"""Kata 18 — the two regimes: prefill and decode on a roofline.

Fill in the functions below, then run ``pytest katas/18``. The README explains the idea and every
counting convention. Counts are exact ints; ratios and times are ``fractions.Fraction`` — no
float, so nothing rounds, at any size.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction

import torch


def forward_flops(config: dict, batch: int, new_tokens: int, past_len: int) -> int:
    """FLOPs of one forward: ``batch`` sequences, each ``new_tokens`` new tokens after ``past_len`` cached ones.

    2 FLOPs per multiply-add: the q/k/v/o projections and the gated MLP for every new token, the
    attention scores and weighted sums over the keys the causal mask keeps, and the LM head
    (hidden_size x vocab_size) over the last new token of each sequence. batch, new_tokens >= 1,
    past_len >= 0; anything else raises ValueError naming the argument.
    """
    raise NotImplementedError("kata 18: forward_flops — see README, task 1")


def forward_bytes(config: dict, batch: int, new_tokens: int, past_len: int,
                  weight_bytes_per_elem: int | None = None, kv_bytes_per_elem: int | None = None) -> int:
    """Bytes one forward moves: the weights read once, the cache read, the new tokens' K/V written.

    The cache of one token is 2 x layers x kv_heads x head_dim x kv_bytes_per_elem bytes; the
    cache read covers batch x past_len tokens, the write batch x new_tokens. weight_bytes_per_elem
    defaults to the config's dtype, kv_bytes_per_elem to the weights' bytes.
    """
    raise NotImplementedError("kata 18: forward_bytes — see README, task 2")


def arithmetic_intensity(config: dict, batch: int, new_tokens: int, past_len: int,
                         weight_bytes_per_elem: int | None = None, kv_bytes_per_elem: int | None = None) -> Fraction:
    """FLOPs per byte moved of one forward, as an exact Fraction."""
    raise NotImplementedError("kata 18: arithmetic_intensity — see README, task 2")


def ridge_point(peak_flops, bandwidth) -> Fraction:
    """peak_flops / bandwidth as a Fraction: the intensity where compute time equals memory time.

    A peak is an int, a Fraction or a finite float > 0 (a float taken at its exact value).
    """
    raise NotImplementedError("kata 18: ridge_point — see README, task 3")


def roofline_time(config: dict, batch: int, new_tokens: int, past_len: int, peak_flops, bandwidth,
                  weight_bytes_per_elem: int | None = None, kv_bytes_per_elem: int | None = None) -> Fraction:
    """Seconds of one forward on the roofline: max(FLOPs / peak_flops, bytes / bandwidth), a Fraction."""
    raise NotImplementedError("kata 18: roofline_time — see README, task 3")


def decode_crossover_batch(config: dict, past_len: int, peak_flops, bandwidth,
                           weight_bytes_per_elem: int | None = None, kv_bytes_per_elem: int | None = None) -> int | None:
    """The smallest batch whose decode step (one new token each, ``past_len`` cached) is no longer
    bandwidth-bound (compute time >= memory time), or None when no batch gets there."""
    raise NotImplementedError("kata 18: decode_crossover_batch — see README, task 4")
