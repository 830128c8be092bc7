"""Kata 11 — beam search over a shared prefix.

Fill in the pieces below, then run ``pytest katas/11``. The README explains the idea.

Shapes: P prompt tokens, k beams (``num_beams``), N ``max_new_tokens``, n live beams (n <= k),
V vocabulary, Hkv KV heads, S tokens of a sequence, D head width. The cache is a
``PagedKVCache`` with kata 06's API (``grader.paged`` holds one); the model is ``grader.nn.Llama``
or anything with its interface (``config``, ``device``, ``dtype``, ``model(input_ids,
position_ids=, cache=) -> logits (B, T, V)``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


class _PagedBatch:
    """Some sequences of a paged cache, shown to the model as one batch: the ``update`` it calls."""

    def __init__(self, cache, seq_ids: list, n_tokens: int):
        """Reserve ``n_tokens`` slots in each sequence of ``seq_ids`` (once: the slots serve every layer)."""
        raise NotImplementedError("kata 11: _PagedBatch — see README, task 1")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write row b of ``k``, ``v`` (B, Hkv, T, D) into sequence b; return every row's (B, Hkv, S, D).

        The model calls this once per layer and attends to what it returns: each row's gathered
        keys and values, stacked. Every row holds the same number of tokens here.
        """
        raise NotImplementedError("kata 11: _PagedBatch.update — see README, task 1")


@dataclass
class _Beam:
    seq: object  # its sequence id in the cache
    tokens: list  # the new tokens so far
    total: float  # summed log-probability of those tokens


def _walk(live: list[_Beam], logp: torch.Tensor, k: int, eos_token_id, length_penalty: float, finished: list) -> list[tuple[int, list, float]]:
    """Rank every extension of every live beam; walk the top 2k until k live ones are found.

    ``logp`` (n, V). Returns the next live beams as (parent index, tokens, total), best first;
    EOS candidates met on the way join ``finished`` as (tokens, score).
    """
    raise NotImplementedError("kata 11: _walk — see README, task 2")


def _done(live: list[_Beam], finished: list, k: int, step: int, N: int, length_penalty: float) -> bool:
    """Whether no live beam can still beat the k-th best finished hypothesis."""
    raise NotImplementedError("kata 11: _done — see README, task 3")


@torch.inference_mode()
def beam_search(model, prompt: list[int], num_beams: int, max_new_tokens: int, *, cache,
                eos_token_id: int | None = None, length_penalty: float = 1.0) -> list[tuple[list[int], float]]:
    """The best ``num_beams`` continuations of ``prompt`` as (new tokens, score), best first.

    The prompt is prefilled once into ``cache`` (a PagedKVCache with every block free, of the
    model's dtype); every beam is a fork of it, sharing the prompt's blocks. Each step ranks every
    extension of every live beam by summed log-probability (ties: lower beam, then lower token) and
    walks the top 2 * num_beams: an ``eos_token_id`` candidate finishes, the others become the next
    live beams until num_beams are found. A score is the sum over ``len(new_tokens) ** length_penalty``.
    Stops early once num_beams hypotheses are finished and no live beam can beat them (README,
    task 3). Dropped beams are freed before the next decode step, every sequence before returning.
    ValueError (README, task 4) for ``num_beams`` or ``max_new_tokens`` not an int >= 1, a ``prompt``
    empty or with an id outside 0 … vocab_size - 1, a ``cache`` in use or unlike the model (dtype,
    layers, KV heads, head width).
    """
    raise NotImplementedError("kata 11: beam_search — see README, tasks 2 to 4")
