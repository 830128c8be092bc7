"""Kata 09, written from its README: round half down (ceil(y - 0.5)), min/max by sort, a strided bit layout (byte j holds codes j, j+M, j+2M, ... of the last axis), a preallocated residual buffer of R tokens filled chunk by chunk, groups in preallocated doubling buffers."""
from __future__ import annotations

import torch


def _bad(name, expected, got):
    return ValueError(f"{name}: expected {expected}, got {got}")


def _check_nbits(n_bits):
    if isinstance(n_bits, bool) or not isinstance(n_bits, int) or n_bits not in {2, 4, 8}:
        raise _bad("n_bits", "2, 4 or 8", repr(n_bits))


def quantize(x, n_bits, dim):
    _check_nbits(n_bits)
    if not isinstance(x, torch.Tensor) or not (x.dtype.is_floating_point):
        raise _bad("x", "a floating-point tensor", getattr(x, "dtype", type(x).__name__))
    if isinstance(dim, bool) or not isinstance(dim, int) or not (-x.dim() <= dim < x.dim()):
        raise _bad("dim", f"an axis in [-{x.dim()}, {x.dim() - 1}]", repr(dim))
    qmax = 2 ** n_bits - 1
    ordered = torch.sort(x, dim=dim).values
    lo = ordered.narrow(dim, 0, 1)
    hi = ordered.narrow(dim, x.shape[dim] - 1, 1)
    scale = (hi - lo) / qmax
    zero = lo.contiguous()
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    num = x.to(ct) - zero.to(ct)
    den = scale.to(ct)
    codes = torch.zeros(x.shape, dtype=ct, device=x.device)
    nz = (den != 0).expand_as(num)
    q = num / den.expand_as(num)
    codes[nz] = torch.ceil(q[nz] - 0.5)
    codes = codes.clamp(min=0, max=qmax).to(torch.uint8)
    return codes, scale, zero


def dequantize(codes, scale, zero):
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise _bad("codes", "a uint8 tensor", getattr(codes, "dtype", type(codes).__name__))
    if not isinstance(scale, torch.Tensor) or not scale.dtype.is_floating_point:
        raise _bad("scale", "a floating-point tensor", getattr(scale, "dtype", type(scale).__name__))
    if not isinstance(zero, torch.Tensor) or zero.dtype != scale.dtype:
        raise _bad("zero", f"a tensor of dtype {scale.dtype}", getattr(zero, "dtype", type(zero).__name__))
    try:
        torch.broadcast_shapes(codes.shape, scale.shape)
    except RuntimeError:
        raise _bad("scale", f"a shape broadcasting with codes {tuple(codes.shape)}", tuple(scale.shape)) from None
    try:
        torch.broadcast_shapes(codes.shape, scale.shape, zero.shape)
    except RuntimeError:
        raise _bad("zero", f"a shape broadcasting with codes {tuple(codes.shape)}", tuple(zero.shape)) from None
    out = codes.to(scale.dtype)
    out = out * scale
    return out + zero


def pack(codes, n_bits):
    _check_nbits(n_bits)
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise _bad("codes", "a uint8 tensor", getattr(codes, "dtype", type(codes).__name__))
    k = 8 // n_bits
    if codes.dim() < 1 or codes.shape[-1] % k:
        raise _bad("codes", f"a last axis whose length is a multiple of {k}", tuple(codes.shape))
    if codes.numel() and int(codes.max()) > 2 ** n_bits - 1:
        raise _bad("codes", f"codes < {2 ** n_bits}", int(codes.max()))
    m = codes.shape[-1] // k
    out = torch.zeros((*codes.shape[:-1], m), dtype=torch.uint8, device=codes.device)
    for i in range(k):  # strided: code i*m + j goes to byte j, bits i*n_bits ...
        out = out + codes[..., i * m:(i + 1) * m] * (2 ** (i * n_bits))
    return out


def unpack(packed, n_bits):
    _check_nbits(n_bits)
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise _bad("packed", "a uint8 tensor", getattr(packed, "dtype", type(packed).__name__))
    if packed.dim() < 1:
        raise _bad("packed", "a tensor with at least one axis", "a 0-d tensor")
    k = 8 // n_bits
    chunks = [torch.bitwise_and(torch.bitwise_right_shift(packed, i * n_bits), 2 ** n_bits - 1) for i in range(k)]
    return torch.cat(chunks, dim=-1)


class _Store:
    """One layer: preallocated, doubling group buffers and a residual buffer of R tokens."""

    def __init__(self, B, H, D, dtype, device, R, n_bits):
        self.B, self.H, self.D, self.dtype, self.device, self.R, self.nb = B, H, D, dtype, device, R, n_bits
        self.res_k = torch.empty(B, H, R, D, dtype=dtype, device=device)
        self.res_v = torch.empty(B, H, R, D, dtype=dtype, device=device)
        self.r = 0
        self.G = 0
        self.cap = 0
        self._alloc(1)

    def _alloc(self, cap):
        B, H, D, R, dt, dev = self.B, self.H, self.D, self.R, self.dtype, self.device
        pd = D // (8 // self.nb)
        new = dict(kc=torch.empty(cap, B, H, R, pd, dtype=torch.uint8, device=dev),
                   vc=torch.empty(cap, B, H, R, pd, dtype=torch.uint8, device=dev),
                   ks=torch.empty(cap, B, H, 1, D, dtype=dt, device=dev),
                   kz=torch.empty(cap, B, H, 1, D, dtype=dt, device=dev),
                   vs=torch.empty(cap, B, H, R, 1, dtype=dt, device=dev),
                   vz=torch.empty(cap, B, H, R, 1, dtype=dt, device=dev))
        if self.cap:
            for name, t in new.items():
                t[:self.G] = getattr(self, name)[:self.G]
        for name, t in new.items():
            setattr(self, name, t)
        self.cap = cap

    def push(self, k, v):
        """k, v (B, H, t, D) with t <= R - r."""
        t = k.shape[2]
        self.res_k[:, :, self.r:self.r + t] = k
        self.res_v[:, :, self.r:self.r + t] = v
        self.r += t
        if self.r == self.R:
            if self.G == self.cap:
                self._alloc(2 * self.cap)
            kc, ks, kz = quantize(self.res_k, self.nb, dim=-2)
            vc, vs, vz = quantize(self.res_v, self.nb, dim=-1)
            g = self.G
            self.kc[g], self.ks[g], self.kz[g] = pack(kc, self.nb), ks, kz
            self.vc[g], self.vs[g], self.vz[g] = pack(vc, self.nb), vs, vz
            self.G += 1
            self.r = 0

    def read(self):
        B, H, D, R, G = self.B, self.H, self.D, self.R, self.G
        K = torch.empty(B, H, G * R + self.r, D, dtype=self.dtype, device=self.device)
        V = torch.empty_like(K)
        for g in range(G):
            K[:, :, g * R:(g + 1) * R] = dequantize(unpack(self.kc[g], self.nb), self.ks[g], self.kz[g])
            V[:, :, g * R:(g + 1) * R] = dequantize(unpack(self.vc[g], self.nb), self.vs[g], self.vz[g])
        K[:, :, G * R:] = self.res_k[:, :, :self.r]
        V[:, :, G * R:] = self.res_v[:, :, :self.r]
        return K, V


class QuantizedKVCache:
    def __init__(self, n_bits=4, residual_len=32):
        _check_nbits(n_bits)
        if isinstance(residual_len, bool) or not isinstance(residual_len, int) or residual_len < 1:
            raise _bad("residual_len", "an int of at least 1", repr(residual_len))
        self.n_bits = n_bits
        self.residual_len = residual_len
        self.layers = {}

    @staticmethod
    def _layer(layer):
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise _bad("layer", "an int >= 0", repr(layer))

    def update(self, layer, k_new, v_new):
        self._layer(layer)
        if not isinstance(k_new, torch.Tensor) or k_new.dim() != 4:
            raise _bad("k_new", "a tensor of rank 4 (B, Hkv, T, D)",
                       f"rank {k_new.dim()}" if isinstance(k_new, torch.Tensor) else type(k_new).__name__)
        if not k_new.dtype.is_floating_point:
            raise _bad("k_new", "a floating-point dtype", k_new.dtype)
        if not isinstance(v_new, torch.Tensor) or tuple(v_new.shape) != tuple(k_new.shape) or v_new.dtype != k_new.dtype:
            raise _bad("v_new", f"shape {tuple(k_new.shape)} and dtype {k_new.dtype} like k_new",
                       f"{tuple(v_new.shape)}, {v_new.dtype}" if isinstance(v_new, torch.Tensor) else type(v_new).__name__)
        B, H, T, D = k_new.shape
        st = self.layers.get(layer)
        if st is not None and ((st.B, st.H, st.D) != (B, H, D) or st.dtype != k_new.dtype):
            raise _bad("k_new", f"(B, Hkv, D) = {(st.B, st.H, st.D)} and dtype {st.dtype} as layer {layer} holds",
                       f"{(B, H, D)} and {k_new.dtype}")
        if st is None:
            st = self.layers[layer] = _Store(B, H, D, k_new.dtype, k_new.device, self.residual_len, self.n_bits)
        i = 0
        while i < T:
            t = min(T - i, self.residual_len - st.r)
            st.push(k_new[:, :, i:i + t], v_new[:, :, i:i + t])
            i += t
        return st.read()

    def seq_len(self, layer=0):
        self._layer(layer)
        st = self.layers.get(layer)
        return 0 if st is None else st.G * self.residual_len + st.r

    def nbytes(self, layer=None):
        if layer is None:
            return sum(self.nbytes(l) for l in self.layers)
        self._layer(layer)
        st = self.layers.get(layer)
        if st is None:
            return 0
        e = torch.finfo(st.dtype).bits // 8
        B, H, D, R = st.B, st.H, st.D, self.residual_len
        group = 2 * B * H * R * D * self.n_bits // 8 + 2 * e * B * H * D + 2 * e * B * H * R
        return st.G * group + 2 * e * B * H * st.r * D


# -- task 6: preallocated FP8 buffers that double, a token -> update index for the scales ------------------
_FP8 = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


def _fp8(fmt):
    if fmt not in ("e4m3", "e5m2") or not isinstance(fmt, str):
        raise _bad("fmt", "'e4m3' or 'e5m2'", fmt)
    return _FP8[fmt]


def fp8_scale(x, fmt, per_head=False):
    top = _fp8(fmt)[1]
    if not isinstance(per_head, bool):
        raise _bad("per_head", "a bool", per_head)
    if not (torch.is_tensor(x) and x.dtype.is_floating_point and x.numel() > 0):
        raise _bad("x", "a non-empty floating-point tensor", x)
    if per_head and x.dim() != 4:
        raise _bad("x", "a (B, Hkv, T, D) tensor for a scale per head", tuple(x.shape))
    a = x.abs()
    amax = a.amax(dim=(0, 2, 3)).view(1, -1, 1, 1) if per_head else a.max()
    amax = amax.float()
    return torch.where(amax == 0, torch.tensor(1.0, device=x.device), amax / top)


def _scale(scale, shape):
    if not (torch.is_tensor(scale) and scale.dtype == torch.float32):
        raise _bad("scale", "a float32 tensor", scale)
    if scale.numel() and float(scale.min()) <= 0:
        raise _bad("scale", "scales > 0", float(scale.min()))
    try:
        ok = list(torch.broadcast_shapes(scale.shape, shape)) == list(shape)
    except RuntimeError:
        ok = False
    if not ok:
        raise _bad("scale", f"a shape broadcasting to {tuple(shape)}", tuple(scale.shape))


def fp8_quantize(x, scale, fmt):
    dtype, top = _fp8(fmt)
    if not (torch.is_tensor(x) and x.dtype.is_floating_point):
        raise _bad("x", "a floating-point tensor", x)
    _scale(scale, x.shape)
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    y = torch.div(x.to(torch.float32), scale)
    y = torch.minimum(torch.maximum(y, torch.tensor(-top, device=x.device)), torch.tensor(top, device=x.device))
    out.copy_(y)  # the cast, into the preallocated output
    return out


def fp8_dequantize(codes, scale, dtype=torch.float32):
    if not (torch.is_tensor(codes) and codes.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)):
        raise _bad("codes", "an FP8 tensor", codes)
    _scale(scale, codes.shape)
    if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise _bad("dtype", "a floating-point dtype", dtype)
    return (codes.to(torch.float32) * scale).to(dtype)


class _FP8Store:
    """Codes in preallocated (B, H, cap, D) buffers; scales (updates_cap, 1, H or 1, 1, 1) and token -> update."""

    def __init__(self, B, H, D, dtype, device, f8, heads):
        self.B, self.H, self.D, self.dtype, self.n, self.u = B, H, D, dtype, 0, 0
        self.k = torch.empty(B, H, 4, D, dtype=f8, device=device)
        self.v = torch.empty_like(self.k)
        self.ks = torch.empty(4, 1, heads, 1, 1, device=device)
        self.vs = torch.empty_like(self.ks)
        self.which = torch.empty(4, dtype=torch.long, device=device)

    def push(self, kc, vc, ks, vs, new_scales):
        T = kc.shape[2]
        while self.n + T > self.k.shape[2]:
            for name in ("k", "v"):
                old = getattr(self, name)
                grown = torch.empty(self.B, self.H, 2 * old.shape[2], self.D, dtype=old.dtype, device=old.device)
                grown[:, :, :self.n] = old[:, :, :self.n]
                setattr(self, name, grown)
            which = torch.empty(2 * self.which.shape[0], dtype=torch.long, device=self.which.device)
            which[:self.n] = self.which[:self.n]
            self.which = which
        if new_scales:
            if self.u == self.ks.shape[0]:
                self.ks, self.vs = torch.cat([self.ks, torch.empty_like(self.ks)]), torch.cat([self.vs, torch.empty_like(self.vs)])
            self.ks[self.u] = ks.reshape(1, -1, 1, 1)
            self.vs[self.u] = vs.reshape(1, -1, 1, 1)
            self.u += 1
        self.k[:, :, self.n:self.n + T] = kc
        self.v[:, :, self.n:self.n + T] = vc
        self.which[self.n:self.n + T] = self.u - 1
        self.n += T

    def read(self):
        idx = self.which[:self.n]
        ks = self.ks[idx].squeeze(-1).squeeze(-1).permute(1, 2, 0).unsqueeze(-1)  # (1, H or 1, S, 1)
        vs = self.vs[idx].squeeze(-1).squeeze(-1).permute(1, 2, 0).unsqueeze(-1)
        K = (self.k[:, :, :self.n].to(torch.float32) * ks).to(self.dtype)
        V = (self.v[:, :, :self.n].to(torch.float32) * vs).to(self.dtype)
        return K, V


class FP8KVCache:
    def __init__(self, fmt="e4m3", per_head=False, frozen=True):
        self.f8, _ = _fp8(fmt)
        if not isinstance(per_head, bool):
            raise _bad("per_head", "a bool", per_head)
        if not isinstance(frozen, bool):
            raise _bad("frozen", "a bool", frozen)
        self.fmt, self.per_head, self.frozen = fmt, per_head, frozen
        self.store = {}

    def update(self, layer, k_new, v_new):
        QuantizedKVCache._layer(layer)
        if not (torch.is_tensor(k_new) and k_new.dtype.is_floating_point and k_new.dim() == 4 and k_new.numel()):
            raise _bad("k_new", "a non-empty floating-point (B, Hkv, T, D) tensor", k_new)
        if not (torch.is_tensor(v_new) and v_new.shape == k_new.shape and v_new.dtype == k_new.dtype):
            raise _bad("v_new", "k_new's shape and dtype", v_new)
        B, H, _, D = k_new.shape
        s = self.store.get(layer)
        if s is not None and ((s.B, s.H, s.D) != (B, H, D) or s.dtype != k_new.dtype):
            raise _bad("k_new", f"(B, Hkv, D) = {(s.B, s.H, s.D)} in {s.dtype}", (tuple(k_new.shape), k_new.dtype))
        fresh = s is None or not self.frozen
        if fresh:
            ks, vs = fp8_scale(k_new, self.fmt, self.per_head), fp8_scale(v_new, self.fmt, self.per_head)
        else:
            ks, vs = s.ks[0].reshape(1, -1, 1, 1), s.vs[0].reshape(1, -1, 1, 1)
        if s is None:
            s = self.store[layer] = _FP8Store(B, H, D, k_new.dtype, k_new.device, self.f8, H if self.per_head else 1)
        s.push(fp8_quantize(k_new, ks, self.fmt), fp8_quantize(v_new, vs, self.fmt), ks, vs, fresh)
        return s.read()

    def seq_len(self, layer=0):
        QuantizedKVCache._layer(layer)
        return self.store[layer].n if layer in self.store else 0

    def nbytes(self, layer=None):
        if layer is None:
            return sum(self.nbytes(i) for i in self.store)
        QuantizedKVCache._layer(layer)
        if layer not in self.store:
            return 0
        s = self.store[layer]
        return 2 * s.B * s.H * s.n * s.D + 4 * s.u * 2 * s.ks.shape[2]
