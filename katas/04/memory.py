"""Kata 04 — the memory formula.

Fill in the functions below, then run ``pytest katas/04``. The README explains the idea.
Every answer is an exact int: a size in bytes, or a count of tokens, sequences or score entries.
Use integer arithmetic only — ``//`` to round down, ``-(-a // b)`` to round up — because a float
loses exactness past 2**53 and a byte count must not be off by one.
"""
from __future__ import annotations

import numbers

import torch


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_elem: int) -> int:
    """Bytes one token adds to the cache of one sequence, over every layer.

    Each layer keeps a key and a value of shape (n_kv_heads, head_dim) per token. The sizes are
    ints >= 1; anything else raises ValueError naming the argument.
    """
    raise NotImplementedError("kata 04: kv_bytes_per_token — see README, task 1")


def kv_cache_bytes(n_layers: int, batch: int, seq_len: int, n_kv_heads: int, head_dim: int,
                   bytes_per_elem: int) -> int:
    """Bytes of the whole cache: ``batch`` sequences of ``seq_len`` tokens each.

    Per layer that is K and V, each (batch, n_kv_heads, seq_len, head_dim). ``batch`` and
    ``seq_len`` may be 0; a negative or non-int value raises ValueError naming the argument.
    """
    raise NotImplementedError("kata 04: kv_cache_bytes — see README, task 1")


def kv_cache_bytes_from_config(config: dict, batch: int, seq_len: int, bytes_per_elem: int | None = None) -> int:
    """Cache bytes of a Hugging Face model, read from its config.json (parsed into a dict).

    Fields: num_hidden_layers, num_attention_heads, num_key_value_heads (default:
    num_attention_heads), head_dim (default: hidden_size // num_attention_heads; null counts as
    missing), dtype from "torch_dtype" or "dtype" ("bfloat16", "float16", "float32", ...). A
    nested "text_config" holds the language model's fields when present. ``bytes_per_elem``,
    when given, overrides the dtype. A missing field raises ValueError naming it.
    """
    raise NotImplementedError("kata 04: kv_cache_bytes_from_config — see README, task 2")


def crossover_tokens(weight_bytes: int, n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_elem: int) -> int:
    """The fewest cached tokens (batch x sequence, summed) whose cache is at least the weights.

    Rounds up: with 128 bytes per token and 1,000 bytes of weights the answer is 8, not 7.
    """
    raise NotImplementedError("kata 04: crossover_tokens — see README, task 3")


def max_batch_size(memory_bytes: int, weight_bytes: int, seq_len: int, n_layers: int, n_kv_heads: int,
                   head_dim: int, bytes_per_elem: int) -> int:
    """How many sequences of ``seq_len`` tokens fit their caches next to the weights.

    Rounds down (a cache that does not fit whole cannot run); 0 when not even the weights fit.
    ``seq_len`` is an int >= 1.
    """
    raise NotImplementedError("kata 04: max_batch_size — see README, task 3")


def projection_counts(n_steps: int, prompt_len: int = 1) -> tuple[int, int]:
    """Token projections (uncached, cached) over ``n_steps`` forward passes, the first over the prompt.

    ``projection_counts(8) == (36, 8)``. ``n_steps`` and ``prompt_len`` are ints >= 1.
    """
    raise NotImplementedError("kata 04: projection_counts — see README, task 4")


def score_counts(n_steps: int, prompt_len: int = 1) -> tuple[int, int]:
    """Attention-score entries per head (uncached, cached) over ``n_steps`` forward passes.

    An uncached pass over L tokens computes L x L scores; the cached prompt pass P x P; a cached
    step with S tokens in the cache (its own included) computes S. ``score_counts(8) == (204, 36)``.
    """
    raise NotImplementedError("kata 04: score_counts — see README, task 4")
