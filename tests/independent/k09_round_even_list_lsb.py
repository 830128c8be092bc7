"""Kata 09, written from its README: torch.round (half to even), amin/amax, code i at bits i*n (LSB first), groups kept in Python lists, nbytes from the held tensors."""
from __future__ import annotations

import torch

_BITS = (2, 4, 8)


def _check_bits(n_bits):
    if isinstance(n_bits, bool) or not isinstance(n_bits, int) or n_bits not in _BITS:
        raise ValueError(f"n_bits: expected one of {_BITS}, got {n_bits!r}")


def quantize(x, n_bits, dim):
    _check_bits(n_bits)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"x: expected a floating-point tensor, got {type(x).__name__}"
                         + (f" of dtype {x.dtype}" if isinstance(x, torch.Tensor) else ""))
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim: expected an axis of x (rank {x.dim()}), got {dim!r}")
    top = 2 ** n_bits - 1
    lo = x.amin(dim=dim, keepdim=True)
    hi = x.amax(dim=dim, keepdim=True)
    scale = (hi - lo) / top  # in x's dtype
    zero = lo.clone()
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    s = scale.to(work)
    flat = s == 0
    y = (x.to(work) - zero.to(work)) / torch.where(flat, torch.ones_like(s), s)
    y = torch.where(flat, torch.zeros_like(y), y)
    codes = torch.round(y).clamp_(0, top).to(torch.uint8)
    return codes, scale, zero


def dequantize(codes, scale, zero):
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise ValueError(f"codes: expected a uint8 tensor, got {getattr(codes, 'dtype', type(codes).__name__)}")
    if not isinstance(scale, torch.Tensor) or not scale.is_floating_point():
        raise ValueError(f"scale: expected a floating-point tensor, got {getattr(scale, 'dtype', type(scale).__name__)}")
    if not isinstance(zero, torch.Tensor) or zero.dtype != scale.dtype:
        raise ValueError(f"zero: expected a tensor of scale's dtype {scale.dtype}, got "
                         f"{getattr(zero, 'dtype', type(zero).__name__)}")
    try:
        torch.broadcast_shapes(codes.shape, scale.shape)
    except RuntimeError:
        raise ValueError(f"scale: shape {tuple(scale.shape)} does not broadcast against codes {tuple(codes.shape)}") from None
    try:
        torch.broadcast_shapes(codes.shape, scale.shape, zero.shape)
    except RuntimeError:
        raise ValueError(f"zero: shape {tuple(zero.shape)} does not broadcast against codes {tuple(codes.shape)}") from None
    return codes.to(scale.dtype) * scale + zero


def pack(codes, n_bits):
    _check_bits(n_bits)
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise ValueError(f"codes: expected a uint8 tensor, got {getattr(codes, 'dtype', type(codes).__name__)}")
    per = 8 // n_bits
    if codes.dim() == 0 or codes.shape[-1] % per:
        raise ValueError(f"codes: the last axis must be a multiple of {per} to pack {n_bits}-bit codes, "
                         f"got shape {tuple(codes.shape)}")
    if codes.numel() and int(codes.max()) >= 2 ** n_bits:
        raise ValueError(f"codes: expected codes below {2 ** n_bits} for {n_bits} bits, got {int(codes.max())}")
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // per, per).to(torch.int32)
    out = torch.zeros(c.shape[:-1], dtype=torch.int32, device=codes.device)
    for i in range(per):
        out |= c[..., i] << (i * n_bits)
    return out.to(torch.uint8)


def unpack(packed, n_bits):
    _check_bits(n_bits)
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise ValueError(f"packed: expected a uint8 tensor, got {getattr(packed, 'dtype', type(packed).__name__)}")
    if packed.dim() == 0:
        raise ValueError("packed: expected a tensor with a last axis of bytes, got a 0-d tensor")
    per = 8 // n_bits
    mask = 2 ** n_bits - 1
    p = packed.to(torch.int32)
    parts = [(p >> (i * n_bits)) & mask for i in range(per)]
    return torch.stack(parts, dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * per).to(torch.uint8)


class _Layer:
    def __init__(self, B, H, D, dtype, device):
        self.B, self.H, self.D, self.dtype, self.device = B, H, D, dtype, device
        self.groups = []  # (k_packed, k_scale, k_zero, v_packed, v_scale, v_zero)
        self.res_k = []  # full-precision tokens, each (B, H, 1..., D) copies
        self.res_v = []

    def res_len(self):
        return sum(t.shape[2] for t in self.res_k)


class QuantizedKVCache:
    def __init__(self, n_bits=4, residual_len=32):
        _check_bits(n_bits)
        if isinstance(residual_len, bool) or not isinstance(residual_len, int) or residual_len < 1:
            raise ValueError(f"residual_len: expected an int >= 1, got {residual_len!r}")
        self.n_bits, self.R = n_bits, residual_len
        self._layers: dict[int, _Layer] = {}

    @staticmethod
    def _check_layer(layer):
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise ValueError(f"layer: expected an int >= 0, got {layer!r}")

    def update(self, layer, k_new, v_new):
        self._check_layer(layer)
        if not isinstance(k_new, torch.Tensor) or k_new.dim() != 4 or not k_new.is_floating_point():
            raise ValueError(f"k_new: expected a floating-point tensor (B, Hkv, T, D), got "
                             f"{tuple(k_new.shape) if isinstance(k_new, torch.Tensor) else type(k_new).__name__}")
        if not isinstance(v_new, torch.Tensor) or v_new.shape != k_new.shape or v_new.dtype != k_new.dtype:
            raise ValueError(f"v_new: expected k_new's shape {tuple(k_new.shape)} and dtype {k_new.dtype}, got "
                             + (f"{tuple(v_new.shape)} {v_new.dtype}" if isinstance(v_new, torch.Tensor) else type(v_new).__name__))
        B, H, T, D = k_new.shape
        st = self._layers.get(layer)
        if st is not None and ((st.B, st.H, st.D) != (B, H, D) or st.dtype != k_new.dtype):
            raise ValueError(f"k_new: layer {layer} holds (B, Hkv, D) = {(st.B, st.H, st.D)} in {st.dtype}, "
                             f"got {(B, H, D)} in {k_new.dtype}")
        if st is None:
            st = self._layers[layer] = _Layer(B, H, D, k_new.dtype, k_new.device)
        if T:
            st.res_k.append(k_new.clone())
            st.res_v.append(v_new.clone())
        R = self.R
        if st.res_len() >= R:
            rk = torch.cat(st.res_k, dim=2)
            rv = torch.cat(st.res_v, dim=2)
            n = rk.shape[2] // R
            for g in range(n):
                kg = rk[:, :, g * R:(g + 1) * R]
                vg = rv[:, :, g * R:(g + 1) * R]
                kc, ks, kz = quantize(kg, self.n_bits, 2)
                vc, vs, vz = quantize(vg, self.n_bits, 3)
                st.groups.append((pack(kc, self.n_bits), ks, kz, pack(vc, self.n_bits), vs, vz))
            rest_k = rk[:, :, n * R:].clone()
            rest_v = rv[:, :, n * R:].clone()
            st.res_k = [rest_k] if rest_k.shape[2] else []
            st.res_v = [rest_v] if rest_v.shape[2] else []
        ks_out, vs_out = [], []
        for kp, ks, kz, vp, vs, vz in st.groups:
            ks_out.append(dequantize(unpack(kp, self.n_bits), ks, kz))
            vs_out.append(dequantize(unpack(vp, self.n_bits), vs, vz))
        ks_out += st.res_k
        vs_out += st.res_v
        if not ks_out:
            empty = k_new.new_empty((B, H, 0, D))
            return empty, empty.clone()
        return torch.cat(ks_out, dim=2), torch.cat(vs_out, dim=2)

    def seq_len(self, layer=0):
        self._check_layer(layer)
        st = self._layers.get(layer)
        return 0 if st is None else len(st.groups) * self.R + st.res_len()

    def nbytes(self, layer=None):
        if layer is None:
            return sum(self.nbytes(i) for i in self._layers)
        self._check_layer(layer)
        st = self._layers.get(layer)
        if st is None:
            return 0
        total = 0
        for tensors in st.groups:
            total += sum(t.numel() * t.element_size() for t in tensors)
        total += sum(t.numel() * t.element_size() for t in st.res_k + st.res_v)
        return total


# -- task 6: updates kept in a Python list, the codes rounded once from float64 ---------------------------
FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_TOPS = {"e4m3": 448.0, "e5m2": 57344.0}


def _check_fmt(fmt):
    if not isinstance(fmt, str) or fmt not in FP8_DTYPES:
        raise ValueError(f"fmt: expected 'e4m3' or 'e5m2', got {fmt!r}")


def fp8_scale(x, fmt, per_head=False):
    _check_fmt(fmt)
    if per_head is not True and per_head is not False:
        raise ValueError(f"per_head: expected a bool, got {per_head!r}")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
        raise ValueError("x: expected a non-empty floating-point tensor")
    if per_head and x.dim() != 4:
        raise ValueError(f"x: a scale per head needs 4 axes (B, Hkv, T, D), got {x.dim()}")
    dims = (0, 2, 3) if per_head else tuple(range(x.dim()))
    amax = torch.amax(torch.abs(x), dim=dims, keepdim=per_head).to(torch.float32)
    out = amax / FP8_TOPS[fmt]
    out[amax == 0] = 1.0
    return out


def _check_scale(scale, shape):
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
        raise ValueError("scale: expected a float32 tensor")
    if bool((scale <= 0).any()):
        raise ValueError("scale: expected every scale > 0")
    if scale.dim() > len(shape) or any(s not in (1, n) for s, n in zip(reversed(scale.shape), reversed(shape))):
        raise ValueError(f"scale: shape {tuple(scale.shape)} does not broadcast to {tuple(shape)}")


def fp8_quantize(x, scale, fmt):
    _check_fmt(fmt)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError("x: expected a floating-point tensor")
    _check_scale(scale, x.shape)
    top = FP8_TOPS[fmt]
    y = x.to(torch.float64) / scale.to(torch.float64)  # one rounding, from float64 straight to the format
    return y.clamp(-top, top).to(FP8_DTYPES[fmt])


def fp8_dequantize(codes, scale, dtype=torch.float32):
    if not isinstance(codes, torch.Tensor) or codes.dtype not in FP8_DTYPES.values():
        raise ValueError("codes: expected a float8_e4m3fn or float8_e5m2 tensor")
    _check_scale(scale, codes.shape)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype in FP8_DTYPES.values():
        raise ValueError(f"dtype: expected a floating-point dtype, got {dtype!r}")
    return torch.mul(codes.to(torch.float32), scale).to(dtype)


class FP8KVCache:
    def __init__(self, fmt="e4m3", per_head=False, frozen=True):
        _check_fmt(fmt)
        if per_head not in (True, False) or not isinstance(per_head, bool):
            raise ValueError(f"per_head: expected a bool, got {per_head!r}")
        if not isinstance(frozen, bool):
            raise ValueError(f"frozen: expected a bool, got {frozen!r}")
        self.fmt, self.per_head, self.frozen = fmt, per_head, frozen
        self.layers = {}  # layer -> list of {"k", "ks", "v", "vs"}

    def update(self, layer, k_new, v_new):
        QuantizedKVCache._check_layer(layer)
        if not isinstance(k_new, torch.Tensor) or k_new.dim() != 4 or not k_new.is_floating_point():
            raise ValueError("k_new: expected a floating-point (B, Hkv, T, D) tensor")
        if k_new.numel() == 0:
            raise ValueError("k_new: no token to add")
        if not isinstance(v_new, torch.Tensor) or v_new.shape != k_new.shape or v_new.dtype != k_new.dtype:
            raise ValueError("v_new: expected k_new's shape and dtype")
        items = self.layers.get(layer, [])
        if items:
            first = items[0]["k"]
            if (first.shape[0], first.shape[1], first.shape[3]) != (k_new.shape[0], k_new.shape[1], k_new.shape[3]) \
                    or items[0]["dtype"] != k_new.dtype:
                raise ValueError("k_new: another (B, Hkv, D) or dtype than the layer holds")
        if items and self.frozen:
            ks, vs = items[0]["ks"], items[0]["vs"]
        else:
            ks = fp8_scale(k_new, self.fmt, self.per_head)
            vs = fp8_scale(v_new, self.fmt, self.per_head)
        items.append({"k": fp8_quantize(k_new, ks, self.fmt), "ks": ks, "v": fp8_quantize(v_new, vs, self.fmt),
                      "vs": vs, "dtype": k_new.dtype})
        self.layers[layer] = items
        K = [fp8_dequantize(it["k"], it["ks"], k_new.dtype) for it in items]
        V = [fp8_dequantize(it["v"], it["vs"], k_new.dtype) for it in items]
        return torch.cat(K, dim=2), torch.cat(V, dim=2)

    def seq_len(self, layer=0):
        QuantizedKVCache._check_layer(layer)
        return sum(it["k"].shape[2] for it in self.layers.get(layer, []))

    def nbytes(self, layer=None):
        if layer is None:
            return sum(self.nbytes(i) for i in self.layers)
        QuantizedKVCache._check_layer(layer)
        items = self.layers.get(layer, [])
        total = sum(it["k"].numel() * it["k"].element_size() + it["v"].numel() * it["v"].element_size()
                    for it in items)
        for it in items[:1] if self.frozen else items:
            total += it["ks"].numel() * 4 + it["vs"].numel() * 4
        return total
