"""Kata 05 — preallocation (reference solution).

Shapes: B batch, Hkv KV heads, T new tokens, L max_len (slots per buffer), D head width.
Each layer owns a key buffer and a value buffer, both (B, Hkv, L, D). Slots 0 … seq_len-1 of a
layer are filled; the slots after them are unfilled (zeros, or stale values after a reset).
"""
from __future__ import annotations

import torch


class CacheFullError(ValueError):
    """An update would write past ``max_len``; the cache was left exactly as it was."""


class StaticKVCache:
    """Keys and values of every layer in buffers of ``max_len`` slots, allocated once."""

    def __init__(self, n_layers: int, batch: int, max_len: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        """Allocate ``keys[l]`` and ``values[l]``, each (B, Hkv, L, D), for every layer ``l``.

        Sizes that are not positive ints raise ValueError naming the argument.
        """
        sizes = {"n_layers": n_layers, "batch": batch, "max_len": max_len, "n_kv_heads": n_kv_heads,
                 "head_dim": head_dim}
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        self.max_len = max_len
        shape = (batch, n_kv_heads, max_len, head_dim)  # (B, Hkv, L, D)
        # The only allocation this class makes: every later write lands inside these tensors.
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self._pos = [0] * n_layers  # filled slots per layer = where that layer writes next

    def _layer(self, layer) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(self.keys):
            raise ValueError(f"layer: expected an int from 0 to {len(self.keys) - 1}, got {layer!r}")
        return layer

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k_new``, ``v_new`` (B, Hkv, T, D) at ``layer``'s position, slots seq_len … seq_len+T-1.

        Returns ``(keys[layer], values[layer])``: the same two buffer objects on every call.
        Inputs of another dtype or device are converted to the buffers' (a ValueError would do too).
        Writing past ``max_len`` raises CacheFullError and writes nothing; bad shapes or a bad
        ``layer`` raise ValueError naming the argument.
        """
        self._layer(layer)
        K, V = self.keys[layer], self.values[layer]
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if not (isinstance(x, torch.Tensor) and x.dim() == 4
                    and x.shape[:2] == K.shape[:2] and x.shape[3] == K.shape[3]):
                got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name}: expected (batch, n_kv_heads, T, head_dim) = "
                                 f"({K.shape[0]}, {K.shape[1]}, T, {K.shape[3]}), got {got}")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new: expected the shape of k_new {tuple(k_new.shape)}, got {tuple(v_new.shape)}")
        start = self._pos[layer]
        end = start + k_new.shape[2]
        if end > self.max_len:  # check before writing: a failed update must change nothing
            raise CacheFullError(f"k_new: {end - start} new token(s) after the {start} in layer {layer} "
                                 f"exceed max_len={self.max_len}")
        K[:, :, start:end] = k_new  # (B, Hkv, T, D) copied into slots start … end-1, in place
        V[:, :, start:end] = v_new
        self._pos[layer] = end
        return K, V

    def seq_len(self, layer: int = 0) -> int:
        """Tokens written to ``layer`` since construction or the last reset."""
        return self._pos[self._layer(layer)]

    def attention_mask(self, new_len: int, layer: int = 0) -> torch.Tensor:
        """BoolTensor (new_len, L) for the last ``new_len`` tokens written to ``layer``; True = may attend.

        Row i is the token in slot seq_len - new_len + i: it sees the filled slots up to its own and
        nothing after (later tokens of its chunk, unfilled slots).
        """
        filled = self.seq_len(layer)
        if isinstance(new_len, bool) or not isinstance(new_len, int) or not 0 <= new_len <= filled:
            raise ValueError(f"new_len: expected an int from 0 to {filled} (tokens in layer {layer}), got {new_len!r}")
        device = self.keys[layer].device
        rows = torch.arange(new_len, device=device)[:, None] + (filled - new_len)  # (T, 1): slot of each new token
        cols = torch.arange(self.max_len, device=device)[None, :]  # (1, L)
        # Every row's own slot is below `filled`, so "up to my slot" also hides the unfilled slots.
        return cols <= rows  # (T, L)

    def reset(self) -> None:
        """Forget every layer's tokens and keep the buffers; stale values stay hidden behind seq_len."""
        self._pos = [0] * len(self._pos)
