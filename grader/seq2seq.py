"""A small encoder–decoder built from ``grader.nn``'s blocks, for the cross-attention cache (kata 17).

Pre-norm throughout, the Llama blocks reused: the encoder's layers are bidirectional self-attention
(RoPE over source positions, padded frames hidden) and the SwiGLU MLP; the decoder's layers are causal
self-attention (RoPE, the cache's ``update``), then a *cross-attention slot*, then the MLP. The slot is
built from whatever class is given (``cross_attention(d_model, n_heads, n_kv_heads)``, with ``wq, wk,
wv, wo`` and ``forward(x, encoder_out, cache, layer, encoder_mask)``), so the same model runs any
implementation of it. Shapes: B batch, S source frames, T new decoder tokens, V vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from grader.nn import (LlamaAttention, LlamaConfig, LlamaDecoderLayer, LlamaMLP, RMSNorm, attend, rope_cos_sin,
                       rope_inv_freq)


@dataclass
class Seq2SeqConfig(LlamaConfig):
    """A Llama config (the decoder's and the encoder's widths and heads) plus the encoder's depth."""

    num_encoder_layers: int = 2


class CrossAttentionBlock(nn.Module):
    """The model's own cross-attention: ``wq, wk, wv, wo``; K and V projected from the encoder output at every
    call (it caches nothing, so it ignores ``cache``); no RoPE, no causal mask, padded frames hidden. The
    checks' oracle for uncached decoding, and the slot's default."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None):
        super().__init__()
        self.n_heads, self.n_kv = n_heads, n_kv_heads or n_heads
        self.head_dim = d_model // n_heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, self.n_kv * self.head_dim, bias=False)
        self.wv = nn.Linear(d_model, self.n_kv * self.head_dim, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, encoder_out, cache=None, layer: int = 0, encoder_mask=None) -> torch.Tensor:
        (B, T, _), S = x.shape, encoder_out.shape[1]
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, Hq, T, D)
        k = self.wk(encoder_out).view(B, S, self.n_kv, self.head_dim).transpose(1, 2)  # (B, Hkv, S, D)
        v = self.wv(encoder_out).view(B, S, self.n_kv, self.head_dim).transpose(1, 2)  # (B, Hkv, S, D)
        seen = torch.ones(B, S, dtype=torch.bool, device=x.device) if encoder_mask is None else encoder_mask
        out = attend(q, k, v, seen[:, None, None, :].expand(B, 1, T, S))  # (B, Hq, T, D): an explicit mask, never causal
        return self.wo(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))  # (B, T, d)


class DecoderLayer(nn.Module):
    def __init__(self, config: Seq2SeqConfig, layer_idx: int, cross_attention: type):
        super().__init__()
        self.layer_idx = layer_idx
        self.self_attn = LlamaAttention(config, layer_idx)
        self.cross_attn = cross_attention(config.hidden_size, config.num_attention_heads, config.num_key_value_heads)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.cross_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h, cos, sin, encoder_out, encoder_mask, cache) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, cache, None)  # (B, T, d), causal
        h = h + self.cross_attn(self.cross_layernorm(h), encoder_out, cache, self.layer_idx, encoder_mask)
        return h + self.mlp(self.post_attention_layernorm(h))  # (B, T, d)


class Seq2Seq(nn.Module):
    """``encode(src, mask)`` once per request, then ``decode(ids, positions, encoder_out, encoder_mask, cache)``
    per step. The decoder's self-attention hands its new keys and values to ``cache.update(layer, k, v)``;
    the cross-attention slot receives the same ``cache`` and its ``layer``."""

    def __init__(self, config: Seq2SeqConfig, cross_attention: type = CrossAttentionBlock):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)  # shared by both sides
        self.encoder_layers = nn.ModuleList(  # pre-norm blocks as the decoder-only Llama's, fed a two-way mask
            LlamaDecoderLayer(config, i) for i in range(config.num_encoder_layers))
        self.encoder_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.decoder_layers = nn.ModuleList(DecoderLayer(config, i, cross_attention)
                                            for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, device="cpu", dtype=torch.float64)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin (B, 1, T, D) of ``positions`` (B, T)."""
        work = torch.float64 if self.dtype == torch.float64 else torch.float32
        return rope_cos_sin(positions[:, None], self._inv_freq.to(device=positions.device, dtype=work))

    def encode(self, src: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """src (B, S) token ids; mask (B, S) bool, True = a real frame (None: all real) -> (B, S, d).

        Bidirectional: every frame sees every real frame of its row. Frames are at positions 0 … S-1,
        so a right-padded source gives its real frames the outputs it gives alone.
        """
        _ids(src, "src")
        B, S = src.shape
        positions = torch.arange(S, device=src.device).expand(B, S)  # (B, S)
        # Always a mask: without one grader.nn's attention would be causal, and the encoder sees both ways.
        scores = torch.zeros(B, 1, 1, S, dtype=self.dtype, device=src.device)  # (B, 1, 1, S)
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (B, S):
                raise ValueError(f"mask: expected a bool tensor {(B, S)}, got {mask!r}")
            scores.masked_fill_(~mask[:, None, None], float("-inf"))  # pads hidden as keys
        scores = scores.expand(B, 1, S, S)  # (B, 1, S, S)
        cos, sin = self._rope(positions)
        h = self.embed_tokens(src)  # (B, S, d)
        for layer in self.encoder_layers:
            h = layer(h, cos, sin, None, scores)  # (B, S, d), no cache
        return self.encoder_norm(h)  # (B, S, d)

    def decode(self, ids, positions, encoder_out, encoder_mask=None, cache=None) -> torch.Tensor:
        """ids, positions (B, T); encoder_out (B, S, d); encoder_mask (B, S) bool or None -> logits (B, T, V).

        Without a cache the T tokens attend causally to each other only (a plain uncached forward).
        """
        _ids(ids, "ids")
        if not isinstance(positions, torch.Tensor) or tuple(positions.shape) != tuple(ids.shape):
            raise ValueError(f"positions: expected a tensor of the shape of ids {tuple(ids.shape)}, got "
                             f"{tuple(positions.shape) if isinstance(positions, torch.Tensor) else positions!r}")
        cos, sin = self._rope(positions)  # (B, 1, T, D)
        h = self.embed_tokens(ids)  # (B, T, d)
        for layer in self.decoder_layers:
            h = layer(h, cos, sin, encoder_out, encoder_mask, cache)
        return self.lm_head(self.norm(h))  # (B, T, V)


def _ids(x, name: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.is_floating_point():
        raise ValueError(f"{name}: expected integer token ids (batch, seq), got {x!r}")
