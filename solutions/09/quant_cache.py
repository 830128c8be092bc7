"""Kata 09 — quantized KV cache, KIVI style (reference solution).

Shapes: B batch, Hkv KV heads, T new tokens, S cached tokens, D head width, R residual_len.
Keys are quantized per channel (statistics over R tokens, one scale per (B, Hkv, D)) and values
per token (statistics over D, one scale per (B, Hkv, token)). The last S % R tokens wait in full
precision until they fill a group of R.
"""
from __future__ import annotations

import torch

BITS = (2, 4, 8)


def _bits(n_bits) -> int:
    if isinstance(n_bits, bool) or n_bits not in BITS:
        raise ValueError(f"n_bits: expected one of {BITS}, got {n_bits!r}")
    return n_bits


def quantize(x: torch.Tensor, n_bits: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric min-max quantization with statistics taken over axis ``dim`` of ``x``.

    Returns ``(codes, scale, zero)``: codes uint8 of x's shape in [0, 2**n_bits - 1]; scale and zero
    in x's dtype, x's shape with size 1 on ``dim``. ``codes * scale + zero`` is within scale / 2 of x.
    """
    if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() >= 1):
        raise ValueError(f"x: expected a floating-point tensor with at least one axis, got {_describe(x)}")
    qmax = 2 ** _bits(n_bits) - 1
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim: expected an axis of x (from {-x.dim()} to {x.dim() - 1}), got {dim!r}")
    zero = x.amin(dim=dim, keepdim=True)  # size 1 on dim
    scale = (x.amax(dim=dim, keepdim=True) - zero) / qmax  # in x's dtype: what the cache stores
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    # A constant slice has scale 0: divide by 1 there, (x - zero) is 0 anyway, so its codes are 0.
    safe = torch.where(scale > 0, scale, torch.ones_like(scale)).to(work)
    # Clamp: a scale rounded down in a narrow dtype can push the top code past qmax.
    codes = torch.round((x.to(work) - zero.to(work)) / safe).clamp(0, qmax)
    return codes.to(torch.uint8), scale, zero


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """``codes * scale + zero`` in scale's dtype; scale and zero broadcast against codes."""
    if not (isinstance(codes, torch.Tensor) and codes.dtype == torch.uint8):
        raise ValueError(f"codes: expected a uint8 tensor, got {_describe(codes)}")
    if not (isinstance(scale, torch.Tensor) and scale.is_floating_point()):
        raise ValueError(f"scale: expected a floating-point tensor, got {_describe(scale)}")
    if not (isinstance(zero, torch.Tensor) and zero.dtype == scale.dtype):
        raise ValueError(f"zero: expected a tensor of scale's dtype {scale.dtype}, got {_describe(zero)}")
    try:
        torch.broadcast_shapes(codes.shape, scale.shape, zero.shape)
    except RuntimeError:
        raise ValueError(f"scale, zero: shapes {tuple(scale.shape)}, {tuple(zero.shape)} do not broadcast "
                         f"against codes {tuple(codes.shape)}") from None
    return codes.to(scale.dtype) * scale + zero


def pack(codes: torch.Tensor, n_bits: int) -> torch.Tensor:
    """Pack ``8 // n_bits`` codes per byte along the last axis: (..., N) -> (..., N // (8 // n_bits))."""
    per = 8 // _bits(n_bits)
    if not (isinstance(codes, torch.Tensor) and codes.dtype == torch.uint8 and codes.dim() >= 1):
        raise ValueError(f"codes: expected a uint8 tensor with at least one axis, got {_describe(codes)}")
    if codes.shape[-1] % per:
        raise ValueError(f"codes: the last axis ({codes.shape[-1]}) must be a multiple of {per} "
                         f"to pack {per} {n_bits}-bit codes per byte")
    if codes.numel() and int(codes.max()) >= 2 ** n_bits:
        raise ValueError(f"codes: a code of {int(codes.max())} does not fit in {n_bits} bits")
    groups = codes.reshape(*codes.shape[:-1], -1, per).to(torch.int32)  # (..., N // per, per)
    mask = 2 ** n_bits - 1  # each code keeps its n_bits bits
    shifts = torch.arange(per, dtype=torch.int32, device=codes.device) * n_bits  # code i -> bits i*n_bits …
    return ((groups & mask) << shifts).sum(-1).to(torch.uint8)  # (..., N // per)


def unpack(packed: torch.Tensor, n_bits: int) -> torch.Tensor:
    """Invert ``pack``: (..., M) -> (..., M * (8 // n_bits)) uint8 codes."""
    per = 8 // _bits(n_bits)
    if not (isinstance(packed, torch.Tensor) and packed.dtype == torch.uint8 and packed.dim() >= 1):
        raise ValueError(f"packed: expected a uint8 tensor with at least one axis, got {_describe(packed)}")
    shifts = torch.arange(per, dtype=torch.int32, device=packed.device) * n_bits
    codes = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & (2 ** n_bits - 1)  # (..., M, per)
    return codes.reshape(*packed.shape[:-1], -1).to(torch.uint8)  # (..., M * per)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__} {x!r}"


class QuantizedKVCache:
    """Per layer: groups of R quantized tokens (packed codes, scales, zeros) + a full-precision residual."""

    def __init__(self, n_bits: int = 4, residual_len: int = 32):
        self.n_bits = _bits(n_bits)
        if isinstance(residual_len, bool) or not isinstance(residual_len, int) or residual_len < 1:
            raise ValueError(f"residual_len: expected an int >= 1, got {residual_len!r}")
        self.residual_len = residual_len
        self._groups: dict[int, list[dict]] = {}  # layer -> quantized groups, oldest first
        self._residual: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> (K, V) (B, Hkv, r, D)

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k_new``, ``v_new`` (B, Hkv, T, D) to ``layer``; return the whole layer dequantized.

        Returns ``(K, V)``, each (B, Hkv, S, D) in the inputs' dtype: the first R * (S // R) tokens
        dequantized from their groups, the last S % R exactly as given.
        """
        self._check_layer(layer)
        self._check_new(layer, k_new, v_new)
        if layer in self._residual:
            k_res, v_res = self._residual[layer]
            k_new, v_new = torch.cat([k_res, k_new], 2), torch.cat([v_res, v_new], 2)  # (B, Hkv, r + T, D)
        groups, R = self._groups.setdefault(layer, []), self.residual_len
        # Flush every full group of R, oldest first: the same groups as token-by-token updates make.
        while k_new.shape[2] >= R:
            groups.append(self._quantize_group(k_new[:, :, :R], v_new[:, :, :R]))
            k_new, v_new = k_new[:, :, R:], v_new[:, :, R:]  # (B, Hkv, r, D)
        # clone: a view would keep the whole concatenated tensor alive.
        self._residual[layer] = (k_new.clone(), v_new.clone())
        return self._read(layer)

    def _quantize_group(self, k: torch.Tensor, v: torch.Tensor) -> dict:
        """k, v (B, Hkv, R, D) -> packed codes (B, Hkv, R, D * n_bits / 8), scales and zeros."""
        k_codes, k_scale, k_zero = quantize(k, self.n_bits, dim=2)  # per channel: scale (B, Hkv, 1, D)
        v_codes, v_scale, v_zero = quantize(v, self.n_bits, dim=3)  # per token: scale (B, Hkv, R, 1)
        return {"k": pack(k_codes, self.n_bits), "k_scale": k_scale, "k_zero": k_zero,
                "v": pack(v_codes, self.n_bits), "v_scale": v_scale, "v_zero": v_zero}

    def _read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        k_res, v_res = self._residual[layer]
        ks = [dequantize(unpack(g["k"], self.n_bits), g["k_scale"], g["k_zero"]) for g in self._groups[layer]]
        vs = [dequantize(unpack(g["v"], self.n_bits), g["v_scale"], g["v_zero"]) for g in self._groups[layer]]
        return torch.cat(ks + [k_res], 2), torch.cat(vs + [v_res], 2)  # (B, Hkv, S, D)

    def seq_len(self, layer: int = 0) -> int:
        """Tokens held by ``layer`` (0 for a layer never updated)."""
        self._check_layer(layer)
        if layer not in self._residual:
            return 0
        return len(self._groups[layer]) * self.residual_len + self._residual[layer][0].shape[2]

    def nbytes(self, layer: int | None = None) -> int:
        """Bytes held by ``layer`` (codes as packed, scales, zeros, residual); all layers when None."""
        if layer is None:
            return sum(self.nbytes(held) for held in self._residual)
        self._check_layer(layer)
        if layer not in self._residual:
            return 0
        tensors = [t for g in self._groups[layer] for t in g.values()] + list(self._residual[layer])
        return sum(t.numel() * t.element_size() for t in tensors)

    def _check_layer(self, layer) -> None:
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise ValueError(f"layer: expected an int >= 0, got {layer!r}")

    def _check_new(self, layer: int, k_new, v_new) -> None:
        per = 8 // self.n_bits
        if not (isinstance(k_new, torch.Tensor) and k_new.is_floating_point() and k_new.dim() == 4):
            raise ValueError(f"k_new: expected a floating-point (B, Hkv, T, D) tensor, got {_describe(k_new)}")
        if k_new.shape[3] % per:
            raise ValueError(f"k_new: head width D = {k_new.shape[3]} must be a multiple of {per} to pack "
                             f"{self.n_bits}-bit codes")
        if not (isinstance(v_new, torch.Tensor) and v_new.shape == k_new.shape and v_new.dtype == k_new.dtype):
            raise ValueError(f"v_new: expected k_new's shape {tuple(k_new.shape)} and dtype {k_new.dtype}, "
                             f"got {_describe(v_new)}")
        if layer in self._residual:
            held = self._residual[layer][0]
            if k_new.shape[:2] != held.shape[:2] or k_new.shape[3] != held.shape[3] or k_new.dtype != held.dtype:
                raise ValueError(f"k_new: layer {layer} holds (B, Hkv, D) = ({held.shape[0]}, {held.shape[1]}, "
                                 f"{held.shape[3]}) in {held.dtype}, got {_describe(k_new)}")


# -- task 6: an FP8 cache ------------------------------------------------------------------------------
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}  # the format's name -> its torch dtype
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}  # the largest finite value of each format


def _fmt(fmt) -> str:
    if not isinstance(fmt, str) or fmt not in FP8:
        raise ValueError(f"fmt: expected one of {tuple(FP8)}, got {fmt!r}")
    return fmt


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected True or False, got {value!r}")
    return value


def fp8_scale(x: torch.Tensor, fmt: str, per_head: bool = False) -> torch.Tensor:
    """float32 ``amax(|x|) / FP8_MAX[fmt]``: shape () per tensor, (1, Hkv, 1, 1) per head (x (B, Hkv, T, D)).

    A scale whose amax is 0 is 1.0 (nothing to scale, and no division by zero later).
    """
    _fmt(fmt)
    if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 0):
        raise ValueError(f"x: expected a non-empty floating-point tensor, got {_describe(x)}")
    if _flag("per_head", per_head) and x.dim() != 4:
        raise ValueError(f"x: a scale per head needs x of shape (B, Hkv, T, D), got {_describe(x)}")
    amax = x.abs().amax(dim=(0, 2, 3), keepdim=True) if per_head else x.abs().amax()  # exact in x's dtype
    scale = amax.to(torch.float32) / FP8_MAX[fmt]
    return torch.where(amax > 0, scale, torch.ones_like(scale))


def _check_scale(scale, shape=None) -> None:
    if not (isinstance(scale, torch.Tensor) and scale.dtype == torch.float32):
        raise ValueError(f"scale: expected a float32 tensor, got {_describe(scale)}")
    if scale.numel() and not bool((scale > 0).all()):
        raise ValueError("scale: every scale must be > 0")
    if shape is not None:
        try:
            fits = torch.broadcast_shapes(shape, scale.shape) == shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"scale: shape {tuple(scale.shape)} does not broadcast to {tuple(shape)}")


def fp8_quantize(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """``x / scale`` in float32, clamped to ±FP8_MAX[fmt] (saturation, also of ±inf), cast to the format."""
    _fmt(fmt)
    if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        raise ValueError(f"x: expected a floating-point tensor, got {_describe(x)}")
    _check_scale(scale, x.shape)
    top = FP8_MAX[fmt]
    # Clamp before the cast: e5m2 turns an overflow into inf, and casts differ between devices.
    y = (x.to(torch.float32) / scale).clamp(-top, top)
    return y.to(FP8[fmt])


def fp8_dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``codes * scale`` in float32, returned in ``dtype``."""
    if not (isinstance(codes, torch.Tensor) and codes.dtype in FP8.values()):
        raise ValueError(f"codes: expected a float8_e4m3fn or float8_e5m2 tensor, got {_describe(codes)}")
    _check_scale(scale, codes.shape)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point and dtype not in FP8.values()):
        raise ValueError(f"dtype: expected float32, float64, bfloat16 or float16, got {dtype!r}")
    return (codes.to(torch.float32) * scale).to(dtype)


class FP8KVCache:
    """Per layer: FP8 codes of every token (one byte each) and float32 scales.

    ``frozen``: one key scale and one value scale per layer, calibrated on the layer's first update and
    kept (later values past them saturate). Otherwise every update's tokens get scales of their own.
    """

    def __init__(self, fmt: str = "e4m3", per_head: bool = False, frozen: bool = True):
        self.fmt = _fmt(fmt)
        self.per_head = _flag("per_head", per_head)
        self.frozen = _flag("frozen", frozen)
        self._chunks: dict[int, list[tuple]] = {}  # layer -> [(k codes, k scale, v codes, v scale)], oldest first
        self._dtype: dict[int, torch.dtype] = {}

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k_new``, ``v_new`` (B, Hkv, T, D); return the whole layer dequantized, in their dtype."""
        _check_layer(layer)
        held = self._chunks[layer][0][0] if layer in self._chunks else None
        _check_new(k_new, v_new, held, self._dtype.get(layer))
        chunks = self._chunks.get(layer, [])
        if self.frozen and chunks:
            k_scale, v_scale = chunks[0][1], chunks[0][3]  # calibrated once, on the first update
        else:
            k_scale, v_scale = fp8_scale(k_new, self.fmt, self.per_head), fp8_scale(v_new, self.fmt, self.per_head)
        chunk = (fp8_quantize(k_new, k_scale, self.fmt), k_scale, fp8_quantize(v_new, v_scale, self.fmt), v_scale)
        self._chunks[layer] = chunks + [chunk]
        self._dtype[layer] = dtype = k_new.dtype
        K = torch.cat([fp8_dequantize(kc, ks, dtype) for kc, ks, _, _ in self._chunks[layer]], 2)
        V = torch.cat([fp8_dequantize(vc, vs, dtype) for _, _, vc, vs in self._chunks[layer]], 2)
        return K, V  # (B, Hkv, S, D)

    def seq_len(self, layer: int = 0) -> int:
        """Tokens held by ``layer`` (0 for a layer never updated)."""
        _check_layer(layer)
        return sum(chunk[0].shape[2] for chunk in self._chunks.get(layer, []))

    def nbytes(self, layer: int | None = None) -> int:
        """Bytes held: one per code, four per float32 scale (a frozen layer holds its scales once)."""
        if layer is None:
            return sum(self.nbytes(held) for held in self._chunks)
        _check_layer(layer)
        chunks = self._chunks.get(layer, [])  # a frozen layer holds its first scales only
        codes = sum(kc.numel() + vc.numel() for kc, _, vc, _ in chunks)
        scales = chunks[:1] if self.frozen else chunks
        return codes + sum(4 * (ks.numel() + vs.numel()) for _, ks, _, vs in scales)


def _check_layer(layer) -> None:
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer: expected an int >= 0, got {layer!r}")


def _check_new(k_new, v_new, held, dtype) -> None:
    if not (isinstance(k_new, torch.Tensor) and k_new.is_floating_point() and k_new.dim() == 4
            and k_new.numel() > 0):
        raise ValueError(f"k_new: expected a non-empty floating-point (B, Hkv, T, D) tensor, got {_describe(k_new)}")
    if not (isinstance(v_new, torch.Tensor) and v_new.shape == k_new.shape and v_new.dtype == k_new.dtype):
        raise ValueError(f"v_new: expected k_new's shape {tuple(k_new.shape)} and dtype {k_new.dtype}, "
                         f"got {_describe(v_new)}")
    if held is not None and (k_new.shape[:2] != held.shape[:2] or k_new.shape[3] != held.shape[3]
                             or k_new.dtype != dtype):
        raise ValueError(f"k_new: the layer holds (B, Hkv, D) = ({held.shape[0]}, {held.shape[1]}, {held.shape[3]}) "
                         f"in {dtype}, got {_describe(k_new)}")
