"""Kata 17 — the encoder–decoder cross-attention cache.

Fill in the pieces below, then run ``pytest katas/17``. The README explains the idea.
Shapes: B batch, Hq query heads, Hkv KV heads, T new decoder tokens, S cached decoder tokens,
S_enc encoder frames, D head width, d model width, V vocabulary.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _layer(layer) -> int:
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer: expected an int >= 0, got {layer!r}")
    return layer


def _pair(k, v) -> None:
    """k and v: 4-D tensors of one shape."""
    if not isinstance(k, torch.Tensor) or k.dim() != 4:
        raise ValueError(f"k: expected a 4-D tensor (B, Hkv, T, D), got "
                         f"{tuple(k.shape) if isinstance(k, torch.Tensor) else type(k).__name__}")
    if not isinstance(v, torch.Tensor) or tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v: expected a tensor of k's shape {tuple(k.shape)}, got "
                         f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}")


class EncoderDecoderKVCache:
    """Per layer, a self part that grows by ``update`` and a cross part set once by ``set_cross``."""

    def __init__(self):
        self._self: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> (K, V), each (B, Hkv, S, D)
        self._cross: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> (K, V), each (B, Hkv, S_enc, D)

    def _batch(self) -> int | None:
        """The batch every part shares, or None while the cache holds nothing."""
        for K, _ in (*self._self.values(), *self._cross.values()):
            return K.shape[0]
        return None

    def _fits(self, k: torch.Tensor, held: tuple | None) -> None:
        """k's batch is the cache's, and its heads and width those of ``held`` (a layer's pair) when given."""
        batch = self._batch()
        if batch is not None and k.shape[0] != batch:
            raise ValueError(f"k: expected batch {batch}, as the cache holds, got {k.shape[0]}")
        if held is not None and (k.shape[1], k.shape[3]) != (held[0].shape[1], held[0].shape[3]):
            raise ValueError(f"k: expected (heads, width) = {(held[0].shape[1], held[0].shape[3])} as the layer "
                             f"holds, got {(k.shape[1], k.shape[3])}")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k``, ``v`` (B, Hkv, T, D) to ``layer``'s self part; return its whole (K, V), each
        (B, Hkv, S + T, D). Bad layer, shapes or a batch other than the cache's: ValueError."""
        _pair(k, v)
        self._fits(k, self._self.get(_layer(layer)))  # (the layer checked before anything changes)
        if layer in self._self:
            K, V = self._self[layer]
            k, v = torch.cat([K, k], dim=2), torch.cat([V, v], dim=2)  # (B, Hkv, S + T, D)
        self._self[layer] = (k, v)
        return k, v

    def set_cross(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``layer``'s cross K, V (B, Hkv, S_enc, D), projected once from the encoder output; return them.

        A layer whose cross part is already set, or a batch other than the cache's: ValueError.
        """
        if _layer(layer) in self._cross:
            raise ValueError(f"layer: the cross part of layer {layer} is already set; it is set once per request "
                             "(reset() starts the next one)")
        _pair(k, v)
        self._fits(k, None)
        self._cross[layer] = (k, v)
        return k, v

    def cross(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``layer``'s cross (K, V), each (B, Hkv, S_enc, D), or None when not set."""
        return self._cross.get(_layer(layer))

    def seq_len(self, layer: int = 0) -> int:
        """Decoder tokens in ``layer``'s self part; 0 for a layer not seen yet."""
        held = self._self.get(_layer(layer))
        return 0 if held is None else held[0].shape[2]

    def cross_len(self, layer: int = 0) -> int:
        """Encoder frames in ``layer``'s cross part; 0 when not set."""
        held = self._cross.get(_layer(layer))
        return 0 if held is None else held[0].shape[2]

    def crop(self, n: int) -> None:
        """Keep the first ``n`` tokens of every layer's self part; the cross part is left as it is."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.seq_len():
            raise ValueError(f"n: expected an int from 0 to seq_len() = {self.seq_len()}, got {n!r}")
        for layer, (K, V) in self._self.items():
            self._self[layer] = (K[:, :, :n], V[:, :, :n])  # (B, Hkv, n, D)

    def reorder(self, index: torch.Tensor) -> None:
        """Row i of both parts becomes old row ``index[i]`` (1-D integer tensor; repeats and drops allowed)."""
        if (not isinstance(index, torch.Tensor) or index.dim() != 1 or index.numel() == 0
                or index.is_floating_point() or index.is_complex() or index.dtype == torch.bool):
            raise ValueError(f"index: expected a non-empty 1-D integer tensor, got "
                             f"{tuple(index.shape) if isinstance(index, torch.Tensor) else type(index).__name__}"
                             f"{' of ' + str(index.dtype) if isinstance(index, torch.Tensor) else ''}")
        batch = self._batch()
        if batch is None:
            return
        rows = index.tolist()
        if min(rows) < 0 or max(rows) >= batch:
            raise ValueError(f"index: expected rows from 0 to {batch - 1}, got {rows}")
        for part in (self._self, self._cross):
            for layer, (K, V) in part.items():
                at = index.to(K.device)
                part[layer] = (K.index_select(0, at), V.index_select(0, at))  # (len(index), Hkv, *, D)

    def reset(self) -> None:
        """Forget both parts of every layer: the next request starts empty."""
        self._self.clear()
        self._cross.clear()

    def nbytes(self) -> int:
        """Bytes of every K and V held, self and cross parts alike."""
        return sum(t.numel() * t.element_size()
                   for part in (self._self, self._cross) for pair in part.values() for t in pair)


class CrossAttention(nn.Module):
    """Decoder queries attend to the encoder output; K, V projected once per request and cached."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None):
        super().__init__()
        for name, value in (("d_model", d_model), ("n_heads", n_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if d_model % n_heads:
            raise ValueError(f"n_heads: expected a divisor of d_model = {d_model}, got {n_heads}")
        n_kv = n_heads if n_kv_heads is None else n_kv_heads
        if isinstance(n_kv, bool) or not isinstance(n_kv, int) or n_kv < 1 or n_heads % n_kv:
            raise ValueError(f"n_kv_heads: expected None or a positive divisor of n_heads = {n_heads}, got {n_kv_heads!r}")
        self.n_heads, self.n_kv, self.head_dim = n_heads, n_kv, d_model // n_heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, n_kv * self.head_dim, bias=False)
        self.wv = nn.Linear(d_model, n_kv * self.head_dim, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def _check(self, x, encoder_out, encoder_mask) -> None:
        d = self.wq.in_features
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != d:
            raise ValueError(f"x: expected a tensor (B, T, {d}), got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if (not isinstance(encoder_out, torch.Tensor) or encoder_out.dim() != 3 or encoder_out.shape[-1] != d
                or encoder_out.shape[0] != x.shape[0] or encoder_out.shape[1] == 0):
            raise ValueError(f"encoder_out: expected a tensor ({x.shape[0]}, S_enc >= 1, {d}), got "
                             f"{tuple(encoder_out.shape) if isinstance(encoder_out, torch.Tensor) else type(encoder_out).__name__}")
        if encoder_mask is not None:
            want = tuple(encoder_out.shape[:2])
            if (not isinstance(encoder_mask, torch.Tensor) or encoder_mask.dtype != torch.bool
                    or tuple(encoder_mask.shape) != want):
                raise ValueError(f"encoder_mask: expected a bool tensor {want}, got "
                                 f"{tuple(encoder_mask.shape) if isinstance(encoder_mask, torch.Tensor) else type(encoder_mask).__name__}"
                                 f"{' of ' + str(encoder_mask.dtype) if isinstance(encoder_mask, torch.Tensor) else ''}")
            if not bool(encoder_mask.any(dim=1).all()):
                raise ValueError("encoder_mask: every row needs at least one visible frame (True); got a row of "
                                 "only False")

    def _heads(self, y: torch.Tensor, n: int) -> torch.Tensor:
        B, L, _ = y.shape
        return y.view(B, L, n, self.head_dim).transpose(1, 2)  # (B, n, L, D)

    def forward(self, x: torch.Tensor, encoder_out: torch.Tensor, cache=None, layer: int = 0,
                encoder_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d) decoder states; encoder_out (B, S_enc, d); encoder_mask (B, S_enc) bool, True = a real
        frame -> (B, T, d). K, V come from ``cache.cross(layer)``; projected from ``encoder_out`` (and handed to
        ``cache.set_cross``) only when that is None. No RoPE, no causal mask."""
        self._check(x, encoder_out, encoder_mask)
        B, T, _ = x.shape
        q = self._heads(self.wq(x), self.n_heads)  # (B, Hq, T, D)
        held = None if cache is None else cache.cross(layer)
        if held is None:
            k = self._heads(self.wk(encoder_out), self.n_kv)  # (B, Hkv, S_enc, D)
            v = self._heads(self.wv(encoder_out), self.n_kv)  # (B, Hkv, S_enc, D)
            held = (k, v) if cache is None else cache.set_cross(layer, k, v)
        k, v = held
        rep = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # (B, Hq, S_enc, D)
        mask = None if encoder_mask is None else encoder_mask[:, None, None, :]  # (B, 1, 1, S_enc): every query
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, Hq, T, D)
        return self.wo(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))  # (B, T, d)


def _check_args(model, sources, max_new_tokens, decoder_start_token_id, eos_token_id, pad_token_id) -> None:
    """ValueError naming the argument: sources not a non-empty list of non-empty lists of token ids of the
    vocabulary; max_new_tokens not an int >= 0; a start, EOS (unless None) or pad id outside the vocabulary."""
    vocab = model.config.vocab_size

    def token(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < vocab

    if (not isinstance(sources, (list, tuple)) or not sources
            or not all(isinstance(s, (list, tuple)) and s and all(token(t) for t in s) for s in sources)):
        raise ValueError(f"sources: expected a non-empty list of non-empty lists of token ids 0 … {vocab - 1}, "
                         f"got {sources!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an int >= 0, got {max_new_tokens!r}")
    for name, value in (("decoder_start_token_id", decoder_start_token_id), ("pad_token_id", pad_token_id),
                        ("eos_token_id", eos_token_id)):
        if not (token(value) or (name == "eos_token_id" and value is None)):
            raise ValueError(f"{name}: expected a token id from 0 to {vocab - 1}, got {value!r}")


@torch.inference_mode()
def generate_seq2seq(model, sources: list[list[int]], max_new_tokens: int, *, decoder_start_token_id: int,
                     eos_token_id: int | None = None, pad_token_id: int = 0) -> list[list[int]]:
    """Greedy decoding of every source at once: the encoder runs once, then one token per row per step.

    Row b's tokens equal ``sources[b]`` decoded alone (EOS included, then the row stops)."""
    _check_args(model, sources, max_new_tokens, decoder_start_token_id, eos_token_id, pad_token_id)
    B = len(sources)
    if max_new_tokens == 0:
        return [[] for _ in range(B)]
    device, width = model.device, max(len(s) for s in sources)
    src = torch.full((B, width), pad_token_id, dtype=torch.long, device=device)  # (B, S_enc), right-padded
    for b, s in enumerate(sources):
        src[b, :len(s)] = torch.tensor(s, device=device)
    mask = torch.arange(width, device=device) < torch.tensor([len(s) for s in sources], device=device)[:, None]
    encoder_out = model.encode(src, mask)  # (B, S_enc, d), once
    cache = EncoderDecoderKVCache()
    ids = torch.full((B, 1), decoder_start_token_id, dtype=torch.long, device=device)  # (B, 1)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    out: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        positions = torch.full((B, 1), step, dtype=torch.long, device=device)  # every row at the same step
        logits = model.decode(ids, positions, encoder_out, mask, cache)  # (B, 1, V)
        ids = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1); ties to the lower id
        out.append(torch.where(done, -1, ids[:, 0]))  # -1: the row was already done
        if eos_token_id is not None:
            done = done | (ids[:, 0] == eos_token_id)
        if bool(done.all()):
            break
    table = torch.stack(out, dim=1).tolist()  # (B, steps): one sync
    return [[t for t in row if t >= 0] for row in table]
