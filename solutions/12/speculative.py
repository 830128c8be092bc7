"""Kata 12 — speculative decoding with cache rollback (reference solution).

Shapes: batch 1, Hkv KV heads, T tokens fed, S tokens cached, D head width, V vocabulary.
Both models are ``grader.nn.Llama`` or anything with its interface: ``model.config.vocab_size``,
``model.device`` and ``model(input_ids, position_ids=, cache=) -> logits (1, T, V)``.
"""
from __future__ import annotations

import torch


def _expect_kv(name: str, x) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name}: expected a tensor (batch, kv_heads, seq, head_dim), got {got}")


def _expect_layer(layer) -> None:
    if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
        raise ValueError(f"layer: expected an int >= 0, got {layer!r}")


class RollbackKVCache:
    """One growing (K, V) pair per layer that can be cut back to its first n tokens."""

    def __init__(self):
        self._keys: dict[int, torch.Tensor] = {}  # layer -> (B, Hkv, S, D)
        self._values: dict[int, torch.Tensor] = {}

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k``, ``v`` (B, Hkv, T, D) to ``layer``; return its whole (K, V), each (B, Hkv, S + T, D).

        The model calls this once per layer and attends to what it returns. A layer index below 0,
        a k or v that is not 4-D, or a shape that does not fit what the layer holds: ValueError.
        """
        _expect_layer(layer)
        _expect_kv("k", k)
        _expect_kv("v", v)
        if v.shape != k.shape:
            raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
        if layer in self._keys:
            K = self._keys[layer]
            if K.shape[:2] != k.shape[:2] or K.shape[3] != k.shape[3]:
                raise ValueError(f"k: expected (batch, kv_heads, *, head_dim) = ({K.shape[0]}, {K.shape[1]}, *, "
                                 f"{K.shape[3]}) like the {K.shape[2]} tokens layer {layer} holds, got {tuple(k.shape)}")
            k = torch.cat([K, k], dim=2)  # (B, Hkv, S + T, D)
            v = torch.cat([self._values[layer], v], dim=2)  # (B, Hkv, S + T, D)
        self._keys[layer], self._values[layer] = k, v
        return k, v

    def seq_len(self, layer: int = 0) -> int:
        """Tokens cached in ``layer``; 0 for a layer not seen yet."""
        _expect_layer(layer)
        return self._keys[layer].shape[2] if layer in self._keys else 0

    def crop(self, n: int) -> None:
        """Keep the first ``n`` tokens of every layer; the rest are forgotten.

        ``n`` outside 0 … seq_len(): ValueError, and nothing is dropped.
        """
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= self.seq_len():
            raise ValueError(f"n: expected an int from 0 to seq_len() = {self.seq_len()}, got {n!r}")
        for layer in self._keys:
            # A slice is a view: nothing is copied, and the next update's cat writes a fresh tensor.
            self._keys[layer] = self._keys[layer][:, :, :n]  # (B, Hkv, n, D)
            self._values[layer] = self._values[layer][:, :, :n]  # (B, Hkv, n, D)


def _check_args(target, draft, prompt, max_new_tokens, k) -> None:
    """ValueError naming the argument: k not an int >= 1, max_new_tokens not an int >= 0, a prompt that
    is not a non-empty list of int token ids of the target's vocabulary, or a draft whose
    ``config.vocab_size`` differs from the target's."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected an int >= 1 (draft tokens per round), got {k!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an int >= 0, got {max_new_tokens!r}")
    if not isinstance(prompt, (list, tuple)) or len(prompt) == 0:
        raise ValueError(f"prompt: expected a non-empty list of token ids, got {prompt!r}")
    for token in prompt:
        if not isinstance(token, int) or not 0 <= token < target.config.vocab_size:
            raise ValueError(f"prompt: expected int token ids from 0 up to the target's vocab_size "
                             f"{target.config.vocab_size} (excluded), got {token!r}")
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft: its vocabulary of {draft.config.vocab_size} tokens differs from the target's "
                         f"{target.config.vocab_size}; the target cannot check tokens it does not know")


def _forward(model, tokens: list[int], start: int, cache: RollbackKVCache, stats: dict, counter: str) -> torch.Tensor:
    """Feed ``tokens`` at positions start … start + T - 1 after the ``start`` cached ones; logits (T, V).

    One model call on a (1, T) batch; ``stats[counter]`` counts it.
    """
    ids = torch.tensor([tokens], device=model.device)  # (1, T)
    positions = torch.arange(start, start + len(tokens), device=model.device)[None]  # (1, T)
    stats[counter] += 1
    return model(ids, position_ids=positions, cache=cache)[0]  # (T, V)


def _propose(draft, seq: list[int], cache: RollbackKVCache, n: int, stats: dict) -> list[int]:
    """``n`` greedy draft tokens after ``seq``, one forward each; the first feeds what the cache lacks.

    ``cache`` is the draft's own: it holds a prefix of ``seq`` (what the last rollback kept).
    """
    proposals: list[int] = []
    for _ in range(n):
        have = cache.seq_len()  # the draft's cache holds seq[:have] (then earlier proposals)
        logits = _forward(draft, (seq + proposals)[have:], have, cache, stats, "draft_forwards")
        proposals.append(int(logits[-1].argmax()))
    return proposals


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
    _check_args(target, draft, prompt, max_new_tokens, k)
    stats = {"target_forwards": 0, "draft_forwards": 0, "proposed": 0, "accepted": 0}
    if max_new_tokens == 0:
        return [], stats
    t_cache, d_cache = RollbackKVCache(), RollbackKVCache()
    seq = list(prompt)  # every accepted token; the last one is pending (not yet in the target's cache)
    out = [int(_forward(target, seq, 0, t_cache, stats, "target_forwards")[-1].argmax())]
    seq.append(out[-1])
    while len(out) < max_new_tokens and out[-1] != eos_token_id:
        n = min(k, max_new_tokens - len(out) - 1)  # a round yields up to n + 1 tokens: never overshoot
        proposals = _propose(draft, seq, d_cache, n, stats)
        start = len(seq) - 1  # the pending token's position: the target's cache holds every token before it
        logits = _forward(target, [seq[-1]] + proposals, start, t_cache, stats, "target_forwards")  # (1 + n, V)
        choices = logits.argmax(-1).tolist()  # choices[j]: the target's token after seq + proposals[:j]
        a = 0
        while a < len(proposals) and proposals[a] == choices[a]:
            a += 1
        stats["proposed"] += len(proposals)
        stats["accepted"] += a
        new = proposals[:a] + [choices[a]]  # the agreeing prefix, then the target's own token (the bonus)
        for token in new:
            out.append(token)
            seq.append(token)
            if token == eos_token_id:
                break
        # Roll back: keep only keys of accepted tokens, so a rejected token's keys never reach a later forward.
        t_cache.crop(len(seq) - 1)
        d_cache.crop(min(d_cache.seq_len(), len(seq) - 1))
    return out, stats
