"""Kata 09, written from its README: floor(y + 0.5) rounding, aminmax, first code in the high bits (MSB first), groups and residual kept in growing tensors (torch.cat), one batched dequantize, nbytes by the formula from counts."""
from __future__ import annotations

import torch


def _nbits(n_bits):
    if type(n_bits) is not int or n_bits not in (2, 4, 8):
        raise ValueError(f"n_bits must be 2, 4 or 8, not {n_bits!r}")
    return n_bits


def quantize(x, n_bits, dim):
    n_bits = _nbits(n_bits)
    if not torch.is_tensor(x):
        raise ValueError(f"x must be a tensor, not {type(x).__name__}")
    if not torch.is_floating_point(x):
        raise ValueError(f"x must be floating point, got dtype {x.dtype}")
    if type(dim) is not int or dim >= x.ndim or dim < -x.ndim:
        raise ValueError(f"dim must be an axis of x ({x.ndim} axes), got {dim!r}")
    levels = (1 << n_bits) - 1
    if x.shape[dim] == 0:
        raise ValueError(f"x has no element along dim {dim} (shape {tuple(x.shape)})")
    mn, mx = torch.aminmax(x, dim=dim, keepdim=True)
    scale = (mx - mn) / levels
    zero = mn
    wide = torch.float64 if x.dtype is torch.float64 else torch.float32
    xs, zs, ss = x.to(wide), zero.to(wide), scale.to(wide)
    safe = ss.masked_fill(ss == 0, 1.0)
    y = torch.floor((xs - zs) / safe + 0.5)
    y = y.masked_fill(ss == 0, 0.0)
    codes = y.clamp(0, levels).to(torch.uint8)
    return codes, scale, zero


def dequantize(codes, scale, zero):
    if not torch.is_tensor(codes) or codes.dtype is not torch.uint8:
        raise ValueError("codes must be a uint8 tensor")
    if not torch.is_tensor(scale) or not torch.is_floating_point(scale):
        raise ValueError("scale must be a floating-point tensor")
    if not torch.is_tensor(zero) or zero.dtype is not scale.dtype:
        raise ValueError(f"zero must be a tensor in scale's dtype ({scale.dtype})")
    for name, t in (("scale", scale), ("zero", zero)):
        try:
            torch.broadcast_shapes(codes.shape, t.shape)
        except RuntimeError:
            raise ValueError(f"{name} of shape {tuple(t.shape)} does not broadcast with codes of shape "
                             f"{tuple(codes.shape)}") from None
    return torch.add(zero, codes.to(scale.dtype) * scale)


def pack(codes, n_bits):
    n_bits = _nbits(n_bits)
    if not torch.is_tensor(codes) or codes.dtype is not torch.uint8:
        raise ValueError("codes must be a uint8 tensor")
    per = 8 // n_bits
    if codes.ndim < 1 or codes.size(-1) % per != 0:
        raise ValueError(f"codes: last axis of shape {tuple(codes.shape)} is not a multiple of {per}")
    if codes.numel() > 0 and codes.max().item() > (1 << n_bits) - 1:
        raise ValueError(f"codes holds {codes.max().item()}, which does not fit in {n_bits} bits")
    grouped = codes.unflatten(-1, (codes.size(-1) // per, per)).long()
    shifts = torch.arange(per - 1, -1, -1, device=codes.device) * n_bits  # first code in the high bits
    return (grouped << shifts).sum(-1).to(torch.uint8)


def unpack(packed, n_bits):
    n_bits = _nbits(n_bits)
    if not torch.is_tensor(packed) or packed.dtype is not torch.uint8:
        raise ValueError("packed must be a uint8 tensor")
    if packed.ndim < 1:
        raise ValueError("packed must have a last axis holding the bytes")
    per = 8 // n_bits
    shifts = torch.arange(per - 1, -1, -1, device=packed.device) * n_bits
    vals = (packed.long().unsqueeze(-1) >> shifts) & ((1 << n_bits) - 1)
    return vals.flatten(-2).to(torch.uint8)


class QuantizedKVCache:
    def __init__(self, n_bits=4, residual_len=32):
        self.n_bits = _nbits(n_bits)
        if type(residual_len) is not int or residual_len < 1:
            raise ValueError(f"residual_len must be an int of at least 1, not {residual_len!r}")
        self.residual_len = residual_len
        self.L = {}

    def _layer_ok(self, layer):
        if type(layer) is not int or layer < 0:
            raise ValueError(f"layer must be a non-negative int, not {layer!r}")

    def update(self, layer, k_new, v_new):
        self._layer_ok(layer)
        if not torch.is_tensor(k_new) or k_new.ndim != 4:
            raise ValueError("k_new must be a rank-4 tensor (B, Hkv, T, D)")
        if not torch.is_floating_point(k_new):
            raise ValueError(f"k_new must be floating point, got {k_new.dtype}")
        if not torch.is_tensor(v_new) or v_new.shape != k_new.shape or v_new.dtype != k_new.dtype:
            raise ValueError("v_new must match k_new in shape and dtype")
        B, H, T, D = k_new.shape
        st = self.L.get(layer)
        if st is not None and (st["sig"] != (B, H, D) or st["dtype"] != k_new.dtype):
            raise ValueError(f"k_new: layer {layer} holds {st['sig']} {st['dtype']}, given {(B, H, D)} {k_new.dtype}")
        if st is None:
            e = k_new.new_empty
            per = 8 // self.n_bits
            st = self.L[layer] = dict(
                sig=(B, H, D), dtype=k_new.dtype, G=0,
                kc=torch.empty(B, H, 0, D // per, dtype=torch.uint8, device=k_new.device),
                vc=torch.empty(B, H, 0, D // per, dtype=torch.uint8, device=k_new.device),
                ks=e(B, H, 0, D), kz=e(B, H, 0, D), vs=e(B, H, 0, 1), vz=e(B, H, 0, 1),
                rk=e(B, H, 0, D), rv=e(B, H, 0, D))
        rk = torch.cat([st["rk"], k_new], 2)  # a new tensor: the cache's own copy
        rv = torch.cat([st["rv"], v_new], 2)
        R, nb = self.residual_len, self.n_bits
        n_full = rk.size(2) // R
        if n_full:
            kq = rk[:, :, :n_full * R].reshape(B, H, n_full, R, D)
            vq = rv[:, :, :n_full * R]
            kc, ks, kz = quantize(kq, nb, 3)  # over the R tokens of each group: (B, H, G, 1, D)
            vc, vs, vz = quantize(vq, nb, 3)  # over the channels of each token: (B, H, G*R, 1)
            st["kc"] = torch.cat([st["kc"], pack(kc.reshape(B, H, n_full * R, D), nb)], 2)
            st["vc"] = torch.cat([st["vc"], pack(vc, nb)], 2)
            st["ks"] = torch.cat([st["ks"], ks.squeeze(3)], 2)
            st["kz"] = torch.cat([st["kz"], kz.squeeze(3)], 2)
            st["vs"] = torch.cat([st["vs"], vs], 2)
            st["vz"] = torch.cat([st["vz"], vz], 2)
            st["G"] += n_full
            rk, rv = rk[:, :, n_full * R:].clone(), rv[:, :, n_full * R:].clone()
        st["rk"], st["rv"] = rk, rv
        G = st["G"]
        kd = dequantize(unpack(st["kc"], nb).reshape(B, H, G, R, D), st["ks"].unsqueeze(3), st["kz"].unsqueeze(3))
        vd = dequantize(unpack(st["vc"], nb), st["vs"], st["vz"])
        return torch.cat([kd.reshape(B, H, G * R, D), rk], 2), torch.cat([vd, rv], 2)

    def seq_len(self, layer=0):
        self._layer_ok(layer)
        st = self.L.get(layer)
        return 0 if st is None else st["G"] * self.residual_len + st["rk"].size(2)

    def nbytes(self, layer=None):
        if layer is None:
            return sum(self.nbytes(i) for i in list(self.L))
        self._layer_ok(layer)
        st = self.L.get(layer)
        if st is None:
            return 0
        B, H, D = st["sig"]
        e = torch.empty((), dtype=st["dtype"]).element_size()
        R, r = self.residual_len, st["rk"].size(2)
        per_group = 2 * B * H * R * D * self.n_bits // 8 + 2 * e * B * H * D + 2 * e * B * H * R
        return st["G"] * per_group + 2 * e * B * H * r * D


# -- task 6: one growing code tensor per layer, a scale stored per token (broadcast from its update) --------
_FMT = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


def _fmt_of(fmt):
    if type(fmt) is not str or fmt not in _FMT:
        raise ValueError(f"fmt must be 'e4m3' or 'e5m2', not {fmt!r}")
    return _FMT[fmt]


def fp8_scale(x, fmt, per_head=False):
    _, top = _fmt_of(fmt)
    if type(per_head) is not bool:
        raise ValueError(f"per_head must be a bool, not {per_head!r}")
    if not torch.is_tensor(x) or not torch.is_floating_point(x) or x.numel() == 0:
        raise ValueError("x must be a non-empty floating-point tensor")
    if per_head:
        if x.ndim != 4:
            raise ValueError(f"x must be (B, Hkv, T, D) for a scale per head, got rank {x.ndim}")
        H = x.size(1)
        m = x.transpose(0, 1).reshape(H, -1).abs().max(dim=1).values.reshape(1, H, 1, 1)
    else:
        m = torch.maximum(x.max(), -x.min())  # the largest magnitude
    s = m.float() / top
    return torch.where(m == 0, torch.ones_like(s), s)


def _scale_ok(scale, shape):
    if not torch.is_tensor(scale) or scale.dtype != torch.float32:
        raise ValueError("scale must be a float32 tensor")
    if scale.numel() and not (scale > 0).all():
        raise ValueError("scale must be positive")
    try:
        if torch.broadcast_shapes(scale.shape, shape) != shape:
            raise ValueError(f"scale of shape {tuple(scale.shape)} is bigger than {tuple(shape)}")
    except RuntimeError:
        raise ValueError(f"scale of shape {tuple(scale.shape)} does not broadcast to {tuple(shape)}") from None


def fp8_quantize(x, scale, fmt):
    dt, top = _fmt_of(fmt)
    if not torch.is_tensor(x) or not torch.is_floating_point(x):
        raise ValueError("x must be a floating-point tensor")
    _scale_ok(scale, x.shape)
    y = x.float() * torch.reciprocal(scale)  # float32, by the reciprocal
    return torch.clamp(y, min=-top, max=top).to(dt)


def fp8_dequantize(codes, scale, dtype=torch.float32):
    if not torch.is_tensor(codes) or codes.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError("codes must be an FP8 tensor")
    _scale_ok(scale, codes.shape)
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be a floating-point dtype, not {dtype!r}")
    return (codes.float() * scale).to(dtype)


class FP8KVCache:
    def __init__(self, fmt="e4m3", per_head=False, frozen=True):
        _fmt_of(fmt)
        for name, flag in (("per_head", per_head), ("frozen", frozen)):
            if type(flag) is not bool:
                raise ValueError(f"{name} must be a bool, not {flag!r}")
        self.fmt, self.per_head, self.frozen = fmt, per_head, frozen
        self.L = {}

    def update(self, layer, k_new, v_new):
        if type(layer) is not int or layer < 0:
            raise ValueError(f"layer must be a non-negative int, not {layer!r}")
        if not torch.is_tensor(k_new) or k_new.ndim != 4 or not torch.is_floating_point(k_new) or k_new.numel() == 0:
            raise ValueError("k_new must be a non-empty floating-point rank-4 tensor (B, Hkv, T, D)")
        if not torch.is_tensor(v_new) or v_new.shape != k_new.shape or v_new.dtype != k_new.dtype:
            raise ValueError("v_new must match k_new in shape and dtype")
        B, H, T, D = k_new.shape
        st = self.L.get(layer)
        if st is not None and (st["sig"] != (B, H, D) or st["dtype"] != k_new.dtype):
            raise ValueError(f"k_new: layer {layer} holds {st['sig']} {st['dtype']}")
        if st is None or not self.frozen:
            ks, vs = fp8_scale(k_new, self.fmt, self.per_head), fp8_scale(v_new, self.fmt, self.per_head)
        else:
            ks, vs = st["ks0"], st["vs0"]
        kc, vc = fp8_quantize(k_new, ks, self.fmt), fp8_quantize(v_new, vs, self.fmt)
        # a scale for every token: (1 or B?, H or 1, T, 1) broadcast to (1, H, T, 1)
        row = lambda s: s.reshape(-1).reshape(1, -1, 1, 1).expand(1, H, T, 1)  # noqa: E731
        if st is None:
            st = self.L[layer] = dict(sig=(B, H, D), dtype=k_new.dtype, n=0, ks0=ks, vs0=vs, kc=kc, vc=vc,
                                      kt=row(ks).clone(), vt=row(vs).clone())
        else:
            st["kc"], st["vc"] = torch.cat([st["kc"], kc], 2), torch.cat([st["vc"], vc], 2)
            st["kt"], st["vt"] = torch.cat([st["kt"], row(ks)], 2), torch.cat([st["vt"], row(vs)], 2)
        st["n"] += 1
        return fp8_dequantize(st["kc"], st["kt"], k_new.dtype), fp8_dequantize(st["vc"], st["vt"], k_new.dtype)

    def seq_len(self, layer=0):
        if type(layer) is not int or layer < 0:
            raise ValueError(f"layer must be a non-negative int, not {layer!r}")
        st = self.L.get(layer)
        return 0 if st is None else st["kc"].size(2)

    def nbytes(self, layer=None):
        if layer is None:
            return sum(self.nbytes(i) for i in list(self.L))
        if type(layer) is not int or layer < 0:
            raise ValueError(f"layer must be a non-negative int, not {layer!r}")
        st = self.L.get(layer)
        if st is None:
            return 0
        B, H, D = st["sig"]
        sets = 1 if self.frozen else st["n"]
        return 2 * st["kc"].numel() + 4 * sets * 2 * (H if self.per_head else 1)
