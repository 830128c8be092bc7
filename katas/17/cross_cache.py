"""Kata 17 — the encoder–decoder cross-attention cache.

Fill in the pieces below, then run ``pytest katas/17``. The README explains the idea.
Shapes: B batch, Hq query heads, Hkv KV heads, T new decoder tokens, S cached decoder tokens,
S_enc encoder frames, D head width, d model width, V vocabulary.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class EncoderDecoderKVCache:
    """Per layer, a self part that grows by ``update`` and a cross part set once by ``set_cross``."""

    def __init__(self):
        raise NotImplementedError("kata 17: EncoderDecoderKVCache — see README, task 1")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k``, ``v`` (B, Hkv, T, D) to ``layer``'s self part; return its whole (K, V), each
        (B, Hkv, S + T, D). Bad layer, shapes or a batch other than the cache's: ValueError."""
        raise NotImplementedError("kata 17: EncoderDecoderKVCache.update — see README, task 1")

    def set_cross(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``layer``'s cross K, V (B, Hkv, S_enc, D), projected once from the encoder output; return them.

        A layer whose cross part is already set, or a batch other than the cache's: ValueError.
        """
        raise NotImplementedError("kata 17: EncoderDecoderKVCache.set_cross — see README, task 1")

    def cross(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``layer``'s cross (K, V), each (B, Hkv, S_enc, D), or None when not set."""
        raise NotImplementedError("kata 17: EncoderDecoderKVCache.cross — see README, task 1")

    def seq_len(self, layer: int = 0) -> int:
        """Decoder tokens in ``layer``'s self part; 0 for a layer not seen yet."""
        raise NotImplementedError("kata 17: EncoderDecoderKVCache.seq_len — see README, task 1")

    def cross_len(self, layer: int = 0) -> int:
        """Encoder frames in ``layer``'s cross part; 0 when not set."""
        raise NotImplementedError("kata 17: EncoderDecoderKVCache.cross_len — see README, task 1")

    def crop(self, n: int) -> None:
        """Keep the first ``n`` tokens of every layer's self part; the cross part is left as it is."""
        raise NotImplementedError("kata 17: EncoderDecoderKVCache.crop — see README, task 1")

    def reorder(self, index: torch.Tensor) -> None:
        """Row i of both parts becomes old row ``index[i]`` (1-D integer tensor; repeats and drops allowed)."""
        raise NotImplementedError("kata 17: EncoderDecoderKVCache.reorder — see README, task 1")

    def reset(self) -> None:
        """Forget both parts of every layer: the next request starts empty."""
        raise NotImplementedError("kata 17: EncoderDecoderKVCache.reset — see README, task 1")

    def nbytes(self) -> int:
        """Bytes of every K and V held, self and cross parts alike."""
        raise NotImplementedError("kata 17: EncoderDecoderKVCache.nbytes — see README, task 1")


class CrossAttention(nn.Module):
    """Decoder queries attend to the encoder output; K, V projected once per request and cached."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None):
        """``wq, wk, wv, wo`` as nn.Linear(bias=False); bad sizes raise ValueError naming them."""
        super().__init__()
        raise NotImplementedError("kata 17: CrossAttention.__init__ — see README, task 2")

    def forward(self, x: torch.Tensor, encoder_out: torch.Tensor, cache=None, layer: int = 0,
                encoder_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d) decoder states; encoder_out (B, S_enc, d); encoder_mask (B, S_enc) bool, True = a real
        frame -> (B, T, d). K, V come from ``cache.cross(layer)``; projected from ``encoder_out`` (and handed to
        ``cache.set_cross``) only when that is None. No RoPE, no causal mask."""
        raise NotImplementedError("kata 17: CrossAttention.forward — see README, task 2")


def _check_args(model, sources, max_new_tokens, decoder_start_token_id, eos_token_id, pad_token_id) -> None:
    """ValueError naming the argument: sources not a non-empty list of non-empty lists of token ids of the
    vocabulary; max_new_tokens not an int >= 0; a start, EOS (unless None) or pad id outside the vocabulary."""
    raise NotImplementedError("kata 17: _check_args — see README, task 3")


@torch.inference_mode()
def generate_seq2seq(model, sources: list[list[int]], max_new_tokens: int, *, decoder_start_token_id: int,
                     eos_token_id: int | None = None, pad_token_id: int = 0) -> list[list[int]]:
    """Greedy decoding of every source at once: the encoder runs once, then one token per row per step.

    Row b's tokens equal ``sources[b]`` decoded alone (EOS included, then the row stops)."""
    raise NotImplementedError("kata 17: generate_seq2seq — see README, task 3")
