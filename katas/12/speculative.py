"""Kata 12 — speculative decoding with cache rollback.

Fill in the pieces below, then run ``pytest katas/12``. The README explains the idea.
Shapes: batch 1, Hkv KV heads, T tokens fed, S tokens cached, D head width, V vocabulary.
Both models are ``grader.nn.Llama`` or anything with its interface: ``model.config.vocab_size``,
``model.device`` and ``model(input_ids, position_ids=, cache=) -> logits (1, T, V)``.
"""
from __future__ import annotations

import torch


class RollbackKVCache:
    """One growing (K, V) pair per layer that can be cut back to its first n tokens."""

    def __init__(self):
        raise NotImplementedError("kata 12: RollbackKVCache — see README, task 1")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k``, ``v`` (B, Hkv, T, D) to ``layer``; return its whole (K, V), each (B, Hkv, S + T, D).

        The model calls this once per layer and attends to what it returns. A layer index below 0,
        a k or v that is not 4-D, or a shape that does not fit what the layer holds: ValueError.
        """
        raise NotImplementedError("kata 12: RollbackKVCache.update — see README, task 1")

    def seq_len(self, layer: int = 0) -> int:
        """Tokens cached in ``layer``; 0 for a layer not seen yet."""
        raise NotImplementedError("kata 12: RollbackKVCache.seq_len — see README, task 1")

    def crop(self, n: int) -> None:
        """Keep the first ``n`` tokens of every layer; the rest are forgotten.

        ``n`` outside 0 … seq_len(): ValueError, and nothing is dropped.
        """
        raise NotImplementedError("kata 12: RollbackKVCache.crop — see README, task 1")


def _check_args(target, draft, prompt, max_new_tokens, k) -> None:
    """ValueError naming the argument: k not an int >= 1, max_new_tokens not an int >= 0, a prompt that
    is not a non-empty list of int token ids of the target's vocabulary, or a draft whose
    ``config.vocab_size`` differs from the target's."""
    raise NotImplementedError("kata 12: _check_args — see README, task 3")


def _forward(model, tokens: list[int], start: int, cache: RollbackKVCache, stats: dict, counter: str) -> torch.Tensor:
    """Feed ``tokens`` at positions start … start + T - 1 after the ``start`` cached ones; logits (T, V).

    One model call on a (1, T) batch; ``stats[counter]`` counts it.
    """
    raise NotImplementedError("kata 12: _forward — see README, task 2")


def _propose(draft, seq: list[int], cache: RollbackKVCache, n: int, stats: dict) -> list[int]:
    """``n`` greedy draft tokens after ``seq``, one forward each; the first feeds what the cache lacks.

    ``cache`` is the draft's own: it holds a prefix of ``seq`` (what the last rollback kept).
    """
    raise NotImplementedError("kata 12: _propose — see README, task 2")


@torch.inference_mode()
def speculative_generate(target, draft, prompt: list[int], max_new_tokens: int, k: int = 4, *,
                         eos_token_id: int | None = None) -> tuple[list[int], dict]:
    """Greedy speculative decoding, batch 1: the target's own greedy tokens, found faster.

    Each round the draft proposes up to ``k`` tokens (one forward each, with its own cache); the
    target scores the pending token and the proposals in ONE forward, keeps the agreeing prefix
    and adds its own next token; both caches are cropped back to the accepted tokens. Stops after
    ``eos_token_id`` (included) or ``max_new_tokens``. Returns (tokens, stats), tokens a list of
    int, stats a dict with ``target_forwards``, ``draft_forwards`` (model calls), ``proposed``
    (draft tokens sent to the target) and ``accepted`` (agreeing-prefix lengths, summed).
    ValueError for k < 1, max_new_tokens < 0 (or either not an int), a prompt that is empty or
    holds an id outside the target's vocabulary, or a draft whose vocabulary differs from the target's.
    """
    raise NotImplementedError("kata 12: speculative_generate — see README, tasks 2 and 3")
