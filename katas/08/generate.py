"""Kata 08 — a batched generate loop.

Fill in the pieces below, then run ``pytest katas/08``. The README explains the idea.
Shapes: B prompts, P padded prompt width, N max_new_tokens, S = P + N - 1 cache slots,
Hkv KV heads, D head width, V vocabulary. The model is ``grader.nn.Llama`` or anything with
its interface: ``model.config``, ``model.device``, ``model.dtype`` and
``model(input_ids, position_ids=, cache=, attention_mask=) -> logits (B, T, V)``.
"""
from __future__ import annotations

import torch


class _StaticCache:
    """Per-layer key and value buffers (B, Hkv, S, D), allocated once and written in place."""

    def __init__(self, n_layers: int, batch: int, max_len: int, n_kv_heads: int, head_dim: int, dtype, device):
        raise NotImplementedError("kata 08: _StaticCache — see README, task 1")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k``, ``v`` (B, Hkv, T, D) at the layer's next slots; return the filled part (B, Hkv, S', D).

        The model calls this once per layer and attends to what it returns. Return views of the
        buffers, never fresh tensors: a cache that grows by torch.cat copies itself every step.
        """
        raise NotImplementedError("kata 08: _StaticCache.update — see README, task 1")


def _pick(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """The next token of every row (B,) from its logits (B, V): argmax, or a draw from softmax(logits / T)."""
    raise NotImplementedError("kata 08: _pick — see README, task 4")


@torch.inference_mode()
def generate(model, prompts: list[list[int]], max_new_tokens: int, *, eos_token_id: int | None = None,
             pad_token_id: int = 0, temperature: float = 0.0, generator: torch.Generator | None = None) -> list[list[int]]:
    """Continue every prompt by up to ``max_new_tokens`` tokens; return the new tokens of each.

    A row stops after its first ``eos_token_id`` (which it includes). One prefill over the prompts,
    left-padded with ``pad_token_id`` to (B, P), then one-token decode steps over a cache allocated
    once. Greedy at ``temperature`` 0; otherwise draws from softmax(logits / temperature) with
    ``generator``. Runs on ``model.device``. ValueError naming the argument for prompts that are
    not lists of int token ids of the vocabulary, an empty prompt, a negative ``max_new_tokens``
    or ``temperature``, and a ``pad_token_id`` outside the vocabulary (pads are fed to the model).
    """
    raise NotImplementedError("kata 08: generate — see README, tasks 2 and 3")
