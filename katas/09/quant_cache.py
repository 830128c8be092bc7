"""Kata 09 — quantized KV cache, KIVI style.

Fill in the functions and QuantizedKVCache below, then run ``pytest katas/09``. The README explains the idea.
Shapes: B batch, Hkv KV heads, T new tokens, S cached tokens, D head width, R residual_len.
Keys are quantized per channel (statistics over R tokens, one scale per (B, Hkv, D)) and values
per token (statistics over D, one scale per (B, Hkv, token)). The last S % R tokens wait in full
precision until they fill a group of R.
"""
from __future__ import annotations

import torch


def quantize(x: torch.Tensor, n_bits: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric min-max quantization with statistics taken over axis ``dim`` of ``x``.

    Returns ``(codes, scale, zero)``: codes uint8 of x's shape in [0, 2**n_bits - 1]; scale and zero
    in x's dtype, x's shape with size 1 on ``dim``. ``codes * scale + zero`` is within scale / 2 of x.
    """
    raise NotImplementedError("kata 09: quantize — see README, task 1")


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """``codes * scale + zero`` in scale's dtype; scale and zero broadcast against codes."""
    raise NotImplementedError("kata 09: dequantize — see README, task 2")


def pack(codes: torch.Tensor, n_bits: int) -> torch.Tensor:
    """Pack ``8 // n_bits`` codes per byte along the last axis: (..., N) -> (..., N // (8 // n_bits))."""
    raise NotImplementedError("kata 09: pack — see README, task 3")


def unpack(packed: torch.Tensor, n_bits: int) -> torch.Tensor:
    """Invert ``pack``: (..., M) -> (..., M * (8 // n_bits)) uint8 codes."""
    raise NotImplementedError("kata 09: unpack — see README, task 4")


class QuantizedKVCache:
    """Per layer: groups of R quantized tokens (packed codes, scales, zeros) + a full-precision residual."""

    def __init__(self, n_bits: int = 4, residual_len: int = 32):
        raise NotImplementedError("kata 09: QuantizedKVCache — see README, task 5")

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k_new``, ``v_new`` (B, Hkv, T, D) to ``layer``; return the whole layer dequantized.

        Returns ``(K, V)``, each (B, Hkv, S, D) in the inputs' dtype: the first R * (S // R) tokens
        dequantized from their groups, the last S % R exactly as given.
        """
        raise NotImplementedError("kata 09: QuantizedKVCache.update — see README, task 5")

    def seq_len(self, layer: int = 0) -> int:
        """Tokens held by ``layer`` (0 for a layer never updated)."""
        raise NotImplementedError("kata 09: QuantizedKVCache.seq_len — see README, task 5")

    def nbytes(self, layer: int | None = None) -> int:
        """Bytes held by ``layer`` (codes as packed, scales, zeros, residual); all layers when None."""
        raise NotImplementedError("kata 09: QuantizedKVCache.nbytes — see README, task 5")


# -- task 6: an FP8 cache ------------------------------------------------------------------------------
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}  # the format's name -> its torch dtype
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}  # the largest finite value of each format


def fp8_scale(x: torch.Tensor, fmt: str, per_head: bool = False) -> torch.Tensor:
    """float32 ``amax(|x|) / FP8_MAX[fmt]``: shape () per tensor, (1, Hkv, 1, 1) per head (x (B, Hkv, T, D)).

    A scale whose amax is 0 is 1.0.
    """
    raise NotImplementedError("kata 09: fp8_scale — see README, task 6")


def fp8_quantize(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """``x / scale`` in float32, clamped to ±FP8_MAX[fmt], cast to the format's dtype."""
    raise NotImplementedError("kata 09: fp8_quantize — see README, task 6")


def fp8_dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``codes * scale`` in float32, returned in ``dtype``."""
    raise NotImplementedError("kata 09: fp8_dequantize — see README, task 6")


class FP8KVCache:
    """Per layer: FP8 codes of every token (one byte each) and float32 scales.

    ``frozen``: one key scale and one value scale per layer (per head with ``per_head``), calibrated on the
    layer's first update and kept. Otherwise every update's tokens get scales of their own.
    """

    def __init__(self, fmt: str = "e4m3", per_head: bool = False, frozen: bool = True):
        raise NotImplementedError("kata 09: FP8KVCache — see README, task 6")

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k_new``, ``v_new`` (B, Hkv, T, D); return the whole layer dequantized, in their dtype."""
        raise NotImplementedError("kata 09: FP8KVCache.update (FP8KVCache) — see README, task 6")

    def seq_len(self, layer: int = 0) -> int:
        """Tokens held by ``layer`` (0 for a layer never updated)."""
        raise NotImplementedError("kata 09: FP8KVCache.seq_len (FP8KVCache) — see README, task 6")

    def nbytes(self, layer: int | None = None) -> int:
        """Bytes held by ``layer``: one per code, four per float32 scale; all layers when None."""
        raise NotImplementedError("kata 09: FP8KVCache.nbytes (FP8KVCache) — see README, task 6")
