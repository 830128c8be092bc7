"""Hidden checks of kata 09 — quantized KV cache (KIVI).

Codes are judged exactly where the README fixes them: round((x - zero) / scale) in float32 (float64
for float64 x) from the file's own scale and zero, clamped; only where that value is within float32
rounding of a tie (… .5) may a code be the other neighbour (the rounding mode is free). Also: codes
in range, each element within half a step of its input with the SPEC's scale and zero, constant
slices exact (scale exactly 0), pack/unpack an exact pair (the bit order is free), and the cache
replayed over drawn programs (see k09_programs.py).
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.engine import report
from grader.checks.support import devices, envelope, protocol
from grader.checks.support.common import DTYPES, SEEDS, expect_value_error, randn
from grader.checks import k09_fp8_checks
from grader.checks.k09_programs import D_CHOICES, EPS, Replay, codes_problem, formula_nbytes, grid_problem, programs, stream
from grader.engine import Checks

CHECKS = Checks("09")
BITS = st.sampled_from([2, 4, 8])


@st.composite
def tensors(draw, constant: bool = False):
    """A tensor to quantize: rank 1-3, some slices scaled up (outliers), or constant along ``dim``."""
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    return {"shape": shape, "dim": draw(st.integers(-len(shape), len(shape) - 1)), "n_bits": draw(BITS),
            "dtype": draw(DTYPES), "outlier": draw(st.sampled_from([1.0, 30.0])), "constant": constant,
            "seed": draw(SEEDS)}


def _x(ex, device):
    x = randn(ex["seed"], *ex["shape"]) + 0.5
    x.view(-1)[ex["seed"] % x.numel()] *= ex["outlier"]
    if ex["constant"]:  # every slice along dim holds one value
        x = x.narrow(ex["dim"], 0, 1).expand_as(x).clone()
    if ex.get("strided"):  # the same values, stored with the first two axes swapped: a transposed view
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    return x.to(device=device, dtype=ex["dtype"])


def _quantize_body(c, ex):
    x, bits, dim = _x(ex, c.device), ex["n_bits"], ex["dim"]
    out = c.call(c.t.quantize, x, bits, dim)
    call = f"quantize(x, n_bits={bits}, dim={dim}) on x of shape {tuple(x.shape)}"
    if not (isinstance(out, (tuple, list)) and len(out) == 3 and all(isinstance(t, torch.Tensor) for t in out)):
        c.fail(f"{call} returned {report.describe(out)}; expected (codes, scale, zero)", ex, ("returned",))
    codes, scale, zero = out
    stat = list(x.shape)
    stat[dim] = 1
    for name, t, shape, dtype in (("codes", codes, list(x.shape), torch.uint8), ("scale", scale, stat, x.dtype),
                                  ("zero", zero, stat, x.dtype)):
        if list(t.shape) != shape or t.dtype != dtype:
            c.fail(f"{call}: {name} is {report.describe(t)}; expected shape {tuple(shape)} (size 1 on dim {dim}, "
                   f"the axis the statistics are taken over) and dtype {dtype}", ex, ("form", name))
    x64 = x.double().cpu()
    lo, hi, qmax = x64.amin(dim, keepdim=True), x64.amax(dim, keepdim=True), 2 ** bits - 1
    slack = 4 * EPS[x.dtype] * (hi.abs() + lo.abs())
    for name, got, want in (("zero", zero, lo), ("scale", scale, (hi - lo) / qmax)):
        problem = (got.double().cpu() - want).abs() > slack
        if problem.any():
            i = tuple(int(j) for j in problem.nonzero()[0])
            g, w = got[i].item(), want[i].item()
            digits = report.significant_digits([(g, w)])
            c.fail(f"{call}: {name} at {list(i)} is {g:.{digits}g}, expected {w:.{digits}g}; the README's "
                   f"zero = min and scale = (max - min) / (2**n_bits - 1) = (max - min) / {qmax}, over dim {dim}",
                   ex, (name, got))
    if int(codes.max()) > qmax:
        c.fail(f"{call}: a code of {int(codes.max())} is outside [0, {qmax}]", ex, ("codes", codes))
    flat = hi == lo  # (the shape of scale, checked above)
    if flat.any() and (scale.detach().cpu()[flat] != 0).any():
        i = tuple(int(j) for j in (flat & (scale.detach().cpu() != 0)).nonzero()[0])
        c.fail(f"{call}: the slice at {list(i)} is constant (max == min), so its scale must be exactly 0; got "
               f"{scale[i].item():.6g}. The README: a slice whose values are all equal has scale 0 and code 0",
               ex, ("constant scale", scale))
    found = grid_problem(x, codes.double() * scale.double() + zero.double(), dim, bits)
    if found:
        i, error, bound, why = found
        c.fail(f"{call}: codes * scale + zero at {list(i)} is {why}: input {x[i].item():.6g}, error {error:.3g}, "
               f"half a step {bound:.3g}", ex, ("round trip", codes))
    found = codes_problem(x, codes, scale, zero, bits)
    if found:
        i, got, want, y = found
        work = "float64" if x.dtype == torch.float64 else "float32"
        c.fail(f"{call}: the code at {list(i)} is {got}, expected {want}: (x - zero) / scale computed in {work} "
               f"from your own scale and zero is {y:.6f}, and the nearest code to it is {want}; a code may be the "
               f"other neighbour only where that value is within {work} rounding of a tie (… .5), where the "
               f"rounding mode is free. Compute the codes in {work} (the README, task 1), not in x's dtype "
               f"{x.dtype}", ex, ("codes", codes))


@CHECKS.add("quantize: min-max codes in range, the README's scale and zero, within half a step", uses="quantize")
def quantize_round_trips(ctx):
    # Worked case: 2 bits over [0, 1, 2, 3] gives scale 1, zero 0 and codes 0, 1, 2, 3 exactly.
    def worked(c, ex):
        x = torch.tensor([[0.0, 3.0, 1.0, 2.0]], dtype=torch.float64, device=c.device)
        codes, scale, zero = c.call(c.t.quantize, x, 2, 1)
        got = {"codes": codes, "scale": scale, "zero": zero}
        want = {"codes": torch.tensor([[0, 3, 1, 2]], dtype=torch.uint8, device=c.device),
                "scale": torch.ones(1, 1, dtype=torch.float64, device=c.device),
                "zero": torch.zeros(1, 1, dtype=torch.float64, device=c.device)}
        problem = report.compare(want, got, "quantize([[0, 3, 1, 2]], n_bits=2, dim=1)")
        if problem:
            c.fail(f"{problem}\n  scale = (3 - 0) / (2**2 - 1) = 1, zero = 0, so each code is the value itself",
                   ex, ("worked", tuple(got.values())))

    ctx.case({"x": [[0, 3, 1, 2]], "n_bits": 2, "dim": 1}, worked)
    ctx.forall(tensors(), _quantize_body, max_examples=30)
    # Beyond the drawn inputs, once each: keys of 16 heads over 300 tokens per channel (dim 2), half types,
    # a transposed view. The larger half cases have enough elements that codes computed in the half type
    # (off by one code near many ties, hidden inside a half-type round-trip tolerance) are met for sure.
    base = {"shape": [2, 3, 6], "dim": 1, "n_bits": 4, "dtype": torch.float32, "outlier": 30.0, "constant": False,
            "seed": 4}
    for wide in ({**base, "shape": [1, 16, 300, 8], "dim": 2, "n_bits": 2}, {**base, "dtype": torch.bfloat16},
                 {**base, "dtype": torch.float16, "n_bits": 8}, {**base, "strided": True, "dim": 0},
                 {**base, "shape": [4, 64], "dtype": torch.bfloat16},
                 {**base, "shape": [1, 16, 300, 8], "dim": 2, "dtype": torch.float16}):
        ctx.case(wide, _quantize_body)


@CHECKS.add("quantize computes float64 codes in float64", uses="quantize")
def quantize_float64_precision(ctx):
    # 2 bits over [0, 3]: scale 1, zero 0. 1.5 - 1e-9 is nearer 1 and 2.5 + 1e-9 nearer 3, but in
    # float32 both become exact halves, which round to 2 (half to even) or to 2 and 3 (half up).
    def body(c, ex):
        x = torch.tensor([ex["values"]], dtype=torch.float64, device=c.device)
        codes, scale, zero = c.call(c.t.quantize, x, 2, 1)
        back = codes.double() * scale.double() + zero.double()
        error = (back - x).abs().max().item()
        if error > 0.5 + 1e-12:
            c.fail(f"quantize(x, n_bits=2, dim=1) on float64 x = {ex['values']} gave codes {codes.tolist()}, "
                   f"{error:.10f} away from x: more than half a step (0.5). In float32, 1.5 - 1e-9 and 2.5 + 1e-9 "
                   "are exact halves; compute the codes of float64 x in float64", ex, ("round trip", codes))

    ctx.case({"values": [0.0, 3.0, 1.5 - 1e-9, 2.5 + 1e-9, 0.5 - 1e-9]}, body)


@CHECKS.add("quantize: a constant slice has scale 0, codes 0 and round-trips exactly", uses="quantize")
def quantize_constant_slices(ctx):
    def body(c, ex):
        _quantize_body(c, ex)
        x = _x(ex, c.device)
        codes, scale, zero = c.call(c.t.quantize, x, ex["n_bits"], ex["dim"])
        if not (torch.equal(codes, torch.zeros_like(codes)) and torch.equal(codes.to(x.dtype) * scale + zero, x)):
            c.fail(f"every slice along dim {ex['dim']} is constant, so scale must be 0, every code 0 and "
                   f"codes * scale + zero equal to x exactly; got codes {codes.flatten()[:8].tolist()} …",
                   ex, ("constant", codes))

    ctx.forall(tensors(constant=True), body, max_examples=10)


@CHECKS.add("quantize clamps: a scale rounded down (float16) cannot push a code past 2**n_bits - 1",
            uses="quantize")
def quantize_clamps_codes(ctx):
    # float16 steps of 2**-24 (subnormal): max - min = 21 steps gives scale = fl(21 / 15) = 1 step for
    # 4 bits, and 4 steps gives scale = fl(4 / 3) = 1 step for 2 bits: (max - min) / scale is 21 > 15, 4 > 3.
    def body(c, ex):
        x = torch.tensor(ex["steps"], dtype=torch.float16, device=c.device) * 2.0 ** -24
        codes, scale, zero = c.call(c.t.quantize, x, ex["n_bits"], 0)
        qmax = 2 ** ex["n_bits"] - 1
        if codes.dtype != torch.uint8 or int(codes.max()) > qmax:
            c.fail(f"quantize(x, n_bits={ex['n_bits']}, dim=0) on float16 x = {ex['steps']} × 2**-24 gave codes "
                   f"{codes.tolist()} ({codes.dtype}); scale {scale.item():.3g} rounded down in float16, so "
                   f"(max - min) / scale > {qmax}: clamp the codes to [0, {qmax}]", ex, ("codes", codes))

    ctx.case({"steps": [0.0, 7.0, 21.0, 3.0], "n_bits": 4}, body)
    ctx.case({"steps": [4.0, 0.0, 1.0], "n_bits": 2}, body)


@CHECKS.add("dequantize: codes * scale + zero, broadcast, in scale's dtype", uses="dequantize")
def dequantize_formula(ctx):
    def run(api, ex):
        g = torch.Generator().manual_seed(ex["seed"])
        codes = torch.randint(0, 2 ** ex["n_bits"], (2, 3, 4), generator=g).to(torch.uint8).to(ctx.device)
        stat = [2, 3, 4]
        stat[ex["dim"]] = 1
        scale = randn(ex["seed"] + 1, *stat, dtype=ex["dtype"], device=ctx.device).abs()
        zero = randn(ex["seed"] + 2, *stat, dtype=ex["dtype"], device=ctx.device)
        return {"dequantize(codes, scale, zero)": ctx.call(api.dequantize, codes, scale, zero)}

    ctx.forall(st.fixed_dictionaries({"n_bits": BITS, "dim": st.integers(0, 2), "dtype": DTYPES, "seed": SEEDS}),
               lambda c, ex: c.differential(ex, run, "codes (2, 3, 4) uint8, scale and zero of size 1 on dim"),
               max_examples=10)

    def half(c, ex):  # scale and zero in a half type: the result in it, within its rounding of the float64 one
        def run_half(api, e):
            g = torch.Generator().manual_seed(e["seed"])
            codes = torch.randint(0, 2 ** e["n_bits"], (2, 3, 4), generator=g).to(torch.uint8).to(c.device)
            scale = envelope.tensor(e, e["seed"] + 1, 2, 1, 4, device=c.device).abs()
            zero = envelope.tensor(e, e["seed"] + 2, 2, 1, 4, device=c.device)
            return {"dequantize(codes, scale, zero)": c.call(api.dequantize, codes, scale, zero)}
        c.differential(ex, run_half, "codes (2, 3, 4) uint8, scale and zero (2, 1, 4) in a half type")

    for dtype in envelope.HALF:
        ctx.case({"n_bits": 4, "dtype": dtype, "seed": 6}, half)


def _named(c, ex, what, fn, args, names):
    expect_value_error(c, fn, *args, what=what, names=names, example=ex)


@CHECKS.add("quantize and dequantize reject bad input with a ValueError naming the argument", uses="quantize")
def quantize_rejects_bad_input(ctx):
    def body(c, ex):
        x = randn(ex["seed"], 2, 4, dtype=ex["dtype"], device=c.device)
        codes, scale, zero = c.call(c.t.quantize, x, 4, 1)
        for what, fn, args, names in (
                ("quantize with n_bits=3", c.t.quantize, (x, 3, 1), ("n_bits",)),
                ("quantize with n_bits=16", c.t.quantize, (x, 16, 1), ("n_bits",)),
                ("quantize with dim=2 on a 2-axis x", c.t.quantize, (x, 4, 2), ("dim",)),
                ("quantize with an integer x", c.t.quantize, (x.long(), 4, 1), ("x",)),
                ("quantize with a 0-d x", c.t.quantize, (x[0, 0], 4, 0), ("x", "dim")),
                ("quantize with n_bits=1", c.t.quantize, (x, 1, 1), ("n_bits",)),
                ("quantize with n_bits='4'", c.t.quantize, (x, "4", 1), ("n_bits",)),
                ("quantize with dim=-3 on a 2-axis x", c.t.quantize, (x, 4, -3), ("dim",)),
                ("quantize with dim=1.5", c.t.quantize, (x, 4, 1.5), ("dim",)),
                ("quantize with x as nested lists", c.t.quantize, (x.tolist(), 4, 1), ("x",)),
                ("dequantize with codes as nested lists", c.t.dequantize, (codes.tolist(), scale, zero), ("codes",)),
                ("dequantize with scale of 3 rows against codes of 2", c.t.dequantize,
                 (codes, torch.ones(3, 1, dtype=x.dtype, device=c.device), zero), ("scale", "zero")),
                ("dequantize with float codes", c.t.dequantize, (codes.to(x.dtype), scale, zero), ("codes",)),
                ("dequantize with integer scale", c.t.dequantize, (codes, codes[:, :1], zero), ("scale",)),
                ("dequantize with integer scale and zero of one dtype", c.t.dequantize,
                 (codes, codes[:, :1], codes[:, :1]), ("scale",)),
                ("dequantize with zero in another dtype than scale", c.t.dequantize,
                 (codes, scale, zero.to(torch.float16)), ("zero",)),
                ("dequantize with zero of 3 rows against codes of 2", c.t.dequantize,
                 (codes, scale, torch.zeros(3, 1, dtype=x.dtype, device=c.device)), ("zero", "scale"))):
            _named(c, ex, what, fn, args, names)

    ctx.forall(st.fixed_dictionaries({"dtype": DTYPES, "seed": SEEDS}), body, max_examples=2)


@CHECKS.add("pack and unpack: 8 // n_bits codes per byte, an exact round trip", uses="pack")
def pack_round_trip(ctx):
    def body(c, ex):
        bits, per = ex["n_bits"], 8 // ex["n_bits"]
        shape = ex["lead"] + [ex["bytes"] * per]
        if ex["top"]:  # every bit set: a lost high bit cannot hide
            codes = torch.full(shape, 2 ** bits - 1, dtype=torch.uint8, device=c.device)
        else:
            g = torch.Generator().manual_seed(ex["seed"])
            codes = torch.randint(0, 2 ** bits, shape, generator=g).to(torch.uint8).to(c.device)
        packed = c.call(c.t.pack, codes, bits)
        want = tuple(ex["lead"] + [ex["bytes"]])
        if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or tuple(packed.shape) != want:
            c.fail(f"pack(codes of shape {tuple(shape)}, n_bits={bits}) returned {report.describe(packed)}; expected "
                   f"uint8 of shape {want}: {per} codes per byte along the last axis", ex,
                   ("packed", report.describe(packed)))
        back = c.call(c.t.unpack, packed, bits)
        problem = report.compare(codes, back, f"unpack(pack(codes, {bits}), {bits})")
        if problem:
            c.fail(f"{problem}\n  unpack must give back exactly the codes that were packed", ex, ("unpacked", back))

    for bits in (2, 4, 8):
        ctx.case({"n_bits": bits, "lead": [2], "bytes": 3, "top": True, "seed": 0}, body)
    ctx.forall(st.fixed_dictionaries({"n_bits": BITS, "lead": st.lists(st.integers(1, 3), max_size=2),
                                      "bytes": st.integers(1, 4), "top": st.just(False), "seed": SEEDS}),
               body, max_examples=15)


@CHECKS.add("pack and unpack reject bad input with a ValueError naming the argument", uses="pack")
def pack_rejects_bad_input(ctx):
    def body(c, ex):
        bits = ex["n_bits"]
        codes = torch.zeros(2, 8, dtype=torch.uint8, device=c.device)
        too_big = codes.clone()
        too_big[1, 5] = 2 ** bits if bits < 8 else 0
        cases = [("pack with n_bits=3", c.t.pack, (codes, 3), ("n_bits",)),
                 ("unpack with n_bits=5", c.t.unpack, (codes, 5), ("n_bits",)),
                 ("pack of float codes", c.t.pack, (codes.float(), bits), ("codes",)),
                 ("unpack of int64 packed bytes", c.t.unpack, (codes.long(), bits), ("packed",)),
                 ("pack of 0-d codes", c.t.pack, (codes[0, 0], bits), ("codes",)),
                 ("unpack of a 0-d packed byte", c.t.unpack, (codes[0, 0], bits), ("packed",)),
                 ("pack with n_bits=16", c.t.pack, (codes, 16), ("n_bits",)),
                 ("unpack with n_bits=1", c.t.unpack, (codes, 1), ("n_bits",)),
                 ("pack of codes as nested lists", c.t.pack, (codes.tolist(), bits), ("codes",)),
                 ("unpack of packed bytes as nested lists", c.t.unpack, (codes.tolist(), bits), ("packed",))]
        if bits < 8:
            cases += [(f"pack with a code of {2 ** bits} at n_bits={bits}", c.t.pack, (too_big, bits), ("codes",)),
                      (f"pack of 7 codes per row at n_bits={bits}", c.t.pack, (codes[:, :7], bits), ("codes",))]
        for what, fn, args, names in cases:
            _named(c, ex, what, fn, args, names)

    for bits in (2, 4, 8):
        ctx.case({"n_bits": bits}, body)


@CHECKS.add("QuantizedKVCache: drawn programs over several layers keep every promise", uses="QuantizedKVCache.update")
def cache_programs(ctx):
    ctx.forall(programs(), lambda c, ex: Replay(c, ex).run(), max_examples=25)
    for dtype in (torch.bfloat16, torch.float16):  # SPEC: every function keeps the dtype, half types included
        ctx.case({"n_bits": 4, "residual_len": 4, "layers": 2, "batch": 2, "heads": 2, "head_dim": 8, "dtype": dtype,
                  "ops": [(0, 3), (1, 9), (0, 1), (0, 5), (1, 1)], "seed": 5}, lambda c, ex: Replay(c, ex).run())


@CHECKS.add("QuantizedKVCache: the same state whatever the chunking", uses="QuantizedKVCache.update")
def cache_chunking_invariant(ctx):
    def state(api, ex, chunked):
        cache = api.QuantizedKVCache(n_bits=ex["n_bits"], residual_len=ex["residual_len"])
        k, v = stream(ex, 0, ex["total"], ctx.device)
        sizes = ex["chunks"] if chunked else [1] * ex["total"]
        start = 0
        for n in sizes:
            out = ctx.call(cache.update, 0, k[:, :, start:start + n], v[:, :, start:start + n])
            start += n
        return {"K": out[0], "V": out[1], "nbytes()": cache.nbytes()}

    def body(c, ex):
        one_by_one, chunked = state(c.t, ex, False), state(c.t, ex, True)
        problem = report.compare(one_by_one, chunked, "fed in chunks (got) against one at a time (expected)")
        if problem:
            c.fail(f"{ex['total']} tokens fed in chunks {ex['chunks']} leave another cache than the same tokens fed "
                   f"one at a time:\n  {problem}\n  flush every full group of R = {ex['residual_len']}, oldest first, "
                   "however many tokens one update brings", ex, ("chunked", chunked))

    @st.composite
    def runs(draw):
        ex = draw(programs(max_ops=1, layers=(1, 1)))
        R = ex["residual_len"]
        chunks = draw(st.lists(st.integers(1, 3 * R + 1), min_size=1, max_size=3))
        return {**{k: v for k, v in ex.items() if k != "ops"}, "total": sum(chunks), "chunks": chunks}

    ctx.forall(runs(), body, max_examples=12)


@CHECKS.add("keys with an outlier channel: quantized per channel, not per token", uses="QuantizedKVCache.update")
def keys_per_channel(ctx):
    def body(c, ex):
        R, D = ex["residual_len"], ex["head_dim"]
        cache = c.t.QuantizedKVCache(n_bits=4, residual_len=R)
        k, v = stream(ex, 0, R, c.device)  # channel seed % D is scaled by 25
        K, _ = c.call(cache.update, 0, k, v)
        normal = [d for d in range(D) if d != ex["seed"] % D]
        k64, K64 = k.double().cpu()[..., normal], K.double().cpu()[..., normal]
        step = (k64.amax(2) - k64.amin(2)) / 15  # per channel: (B, Hkv, channels)
        worst = ((K64 - k64).abs().amax(2) / step).max().item()  # in per-channel steps
        if worst > 0.5 + 1e-6:
            c.fail(f"on the channels without an outlier your keys are off by up to {worst:.1f} of their own "
                   f"per-channel steps (at most 0.5 expected). Quantizing keys per token stretches every token's "
                   f"range to the outlier channel's (× 25), so the normal channels lose almost all their bits.",
                   ex, ("normal channels", K.detach().cpu()))

    ctx.case({"residual_len": 8, "batch": 1, "heads": 2, "head_dim": 8, "dtype": torch.float32, "seed": 5}, body)
    ctx.case({"residual_len": 16, "batch": 2, "heads": 1, "head_dim": 4, "dtype": torch.float64, "seed": 2}, body)


@CHECKS.add("nbytes: packed codes, scales, zeros and the residual, exactly the README's formula",
            uses="QuantizedKVCache.nbytes")
def nbytes_formula(ctx):
    # Worked case: B 1, Hkv 2, D 8, R 4, 4 bits, float32, 10 tokens = 2 groups + 2 residual tokens:
    # 2 × (2·1·2·4·8·4/8 + 2·4·1·2·8 + 2·4·1·2·4) + 2·4·1·2·2·8 = 2 × (64 + 128 + 64) + 256 = 768 bytes.
    def body(c, ex):
        cache = c.t.QuantizedKVCache(n_bits=ex["n_bits"], residual_len=ex["residual_len"])
        R = ex["residual_len"]
        chunks = [ex["tokens"], 1, R + 1, 3 * R + 1]  # then past a group boundary, then several groups at once
        k, v = stream(ex, 0, sum(chunks), c.device)
        seen, S = [], 0
        for n in chunks:
            _, V = c.call(cache.update, 1, k[:, :, S:S + n], v[:, :, S:S + n])
            S += n
            seen.append((cache.nbytes(0), cache.nbytes(1), cache.nbytes(), cache.seq_len(0), cache.seq_len(1)))
            want = (0, formula_nbytes(ex, S), formula_nbytes(ex, S), 0, S)
            if seen[-1] != want or any(isinstance(n, bool) or not isinstance(n, int) for n in seen[-1]):
                c.fail(f"after updates of layer 1 with {chunks[:len(seen)]} tokens, (nbytes(0), nbytes(1), nbytes(), "
                       f"seq_len(0), seq_len(1)) = {seen[-1]!r}, expected {want}: {S // R} group(s) of packed codes "
                       f"+ their scales and zeros, {S % R} residual token(s); layer 0 was never updated and holds 0",
                       ex, ("nbytes", tuple(seen), V.detach().cpu()))

    ctx.case({"n_bits": 4, "residual_len": 4, "batch": 1, "heads": 2, "head_dim": 8, "dtype": torch.float32,
              "tokens": 10, "seed": 1}, body)
    ctx.forall(st.fixed_dictionaries({"n_bits": st.just(2), "residual_len": st.sampled_from([4, 8]),
                                      "batch": st.integers(1, 2), "heads": st.integers(1, 3),
                                      "head_dim": st.sampled_from(D_CHOICES[2]), "dtype": DTYPES,
                                      "tokens": st.integers(1, 20), "seed": SEEDS}), body, max_examples=8)


@CHECKS.add("QuantizedKVCache rejects bad input with a ValueError naming the argument", uses="QuantizedKVCache")
def cache_rejects_bad_input(ctx):
    def body(c, ex):
        api = c.t
        for what, args, names in (("n_bits=3", (3, 4), ("n_bits",)), ("n_bits=16", (16, 4), ("n_bits",)),
                                  ("n_bits=1", (1, 4), ("n_bits",)),
                                  ("residual_len=0", (4, 0), ("residual_len",)),
                                  ("residual_len=-2", (4, -2), ("residual_len",))):
            _named(c, ex, f"QuantizedKVCache({what})", api.QuantizedKVCache, args, names)
        cache = api.QuantizedKVCache(n_bits=4, residual_len=4)
        k, v = stream({**ex, "batch": 1, "heads": 2, "head_dim": 4}, 0, 6, c.device)
        c.call(cache.update, 0, k[:, :, :5], v[:, :, :5])
        other = torch.float32 if ex["dtype"] == torch.float64 else torch.float64
        for what, args, names in (
                ("update(-1, …)", (-1, k, v), ("layer",)),
                ("update(0.5, …)", (0.5, k, v), ("layer",)),
                ("update with k_new, v_new carrying an extra axis", (0, k[None], v[None]), ("k_new",)),
                ("update with v_new of 1 head and k_new of 2", (0, k, v[:, :1]), ("v_new",)),
                ("update with k_new missing the batch axis", (0, k[0], v[0]), ("k_new",)),
                ("update with v_new of 2 tokens and k_new of 1", (0, k[:, :, :1], v[:, :, :2]), ("v_new",)),
                ("update with v_new in another dtype than k_new", (0, k, v.to(other)), ("v_new",)),
                ("update of layer 0 (Hkv 2) with k_new, v_new of 1 head", (0, k[:, :1], v[:, :1]), ("k_new",)),
                ("update of layer 0 (B 1) with k_new, v_new of batch 2", (0, torch.cat([k, k]), torch.cat([v, v])),
                 ("k_new",)),
                ("update of layer 0 (D 4) with k_new, v_new of width 8", (0, torch.cat([k, k], 3),
                                                                          torch.cat([v, v], 3)), ("k_new",)),
                (f"update of layer 0 ({ex['dtype']}) with k_new, v_new in {other}", (0, k.to(other), v.to(other)),
                 ("k_new",))):
            _named(c, ex, what, cache.update, args, names)
        _named(c, ex, "seq_len(-1)", cache.seq_len, (-1,), ("layer",))
        _named(c, ex, "nbytes(-1)", cache.nbytes, (-1,), ("layer",))
        _named(c, ex, "seq_len('0')", cache.seq_len, ("0",), ("layer",))
        _named(c, ex, "nbytes(1.5)", cache.nbytes, (1.5,), ("layer",))
        try:  # the smallest group: R = 1 at 8 bits (one code per byte)
            smallest = api.QuantizedKVCache(n_bits=8, residual_len=1)
            c.call(smallest.update, 0, k[:, :, :2], v[:, :, :2])
        except ValueError as exc:
            c.fail(f"QuantizedKVCache(n_bits=8, residual_len=1), then an update of 2 tokens, raised "
                   f"ValueError({str(exc)!r}); R = 1 is the smallest valid group", ex, ("rejected", "smallest"))
        K, V = c.call(cache.update, 0, k[:, :, 5:], v[:, :, 5:])
        if cache.seq_len(0) != 6 or cache.seq_len() != 6 or not torch.equal(V[:, :, 4:], v[:, :, 4:]):
            c.fail(f"after the refused updates and one of 1 token, seq_len(0) is {cache.seq_len(0)!r}, expected 5 + 1 "
                   "= 6: a refused update must change nothing", ex, ("refused call changed", cache.seq_len(0)))

    ctx.forall(st.fixed_dictionaries({"dtype": DTYPES, "seed": SEEDS}), body, max_examples=2)


def _decode_through_one_buffer(api, c, ex):
    """QuantizedKVCache() with its defaults, fed one token at a time from one key and one value buffer that
    the caller refills before each update (as a decode loop does); what the cache returns and holds at the end."""
    k, v = stream(ex, 0, ex["tokens"], c.device)
    k_buf, v_buf = torch.empty_like(k[:, :, :1]), torch.empty_like(v[:, :, :1])
    cache = api.QuantizedKVCache()
    for t in range(ex["tokens"]):
        k_buf.copy_(k[:, :, t:t + 1])
        v_buf.copy_(v[:, :, t:t + 1])
        K, V = c.call(cache.update, 0, k_buf, v_buf)
    return {"K": K.detach().clone(), "V": V.detach().clone(), "seq_len()": cache.seq_len(), "nbytes()": cache.nbytes()}


@CHECKS.add("QuantizedKVCache() defaults to 4 bits and R 32, and keeps its own copy of what it is given",
            uses="QuantizedKVCache.update")
def cache_defaults_and_copies(ctx):
    ctx.case({"batch": 1, "heads": 2, "head_dim": 8, "dtype": torch.float32, "tokens": 40, "seed": 3},
             lambda c, ex: c.differential(ex, lambda api, e: _decode_through_one_buffer(api, c, e),
                                          "QuantizedKVCache(), then 40 one-token updates of layer 0, each from the "
                                          "same k_new and v_new buffers refilled by the caller"))


# -- results are the caller's -----------------------------------------------------------------------
def _own(c, ex, program, clean, what):
    """``program`` on the learner's code gives what ``clean`` (the same calls, nothing overwritten) gives: the
    codes' rounding is the learner's choice, so the comparison is with the learner's own clean run."""
    expected, got = clean(c.t, ex), program(c.t, ex)
    same_keys = expected.keys() == got.keys()
    problem = report.compare(expected if same_keys else list(expected.values()), got if same_keys else list(got.values()))
    if problem:
        c.fail(f"{what}\n  {problem}", ex, got)


def _held(c, ex, program, what):
    """A ``protocol.kept`` program on the learner's code: what was held must read as it was returned."""
    got = program(c.t, ex)
    before, after = list(got)[:2]
    problem = report.compare(got[before], got[after], after)
    if problem:
        c.fail(f"{what}\n  {problem}", ex, got)


@CHECKS.add("quantize, dequantize, pack and unpack return the caller's tensors", uses="quantize")
def results_are_the_callers(ctx):
    def body(c, ex):
        x = _x(ex, c.device)
        calls = {"quantize(x, 4, 1)": lambda api, e: c.call(api.quantize, x, 4, 1)}
        codes, scale, zero = c.call(c.ref.quantize, x, 4, 1)
        calls["dequantize(codes, scale, zero)"] = lambda api, e: c.call(api.dequantize, codes, scale, zero)
        calls["pack(codes, 4)"] = lambda api, e: c.call(api.pack, codes, 4)
        packed = c.call(c.ref.pack, codes, 4)
        calls["unpack(packed, 4)"] = lambda api, e: c.call(api.unpack, packed, 4)
        for call, same in calls.items():
            clean = lambda api, e, same=same: {"first": protocol.snapshot(same(api, e))}  # noqa: E731
            _own(c, ex, protocol.twice(same, call), lambda api, e, same=same: {
                "a": protocol.snapshot(same(api, e)), "b": protocol.snapshot(same(api, e))}, f"{call} twice")
            _own(c, ex, protocol.changed_by_caller(same, same, f"{call} again"), clean,
                 f"{call}, its result overwritten by the caller, then {call} again (a result kept inside?)")
            other = lambda api, e: c.call(api.quantize, x.flip(1), 4, 1)  # noqa: E731
            _held(c, ex, protocol.kept(same, other, f"the result of {call}", "quantize(x reversed, 4, 1)"),
                  f"the result of {call}, held while another call runs")

    ctx.case({"shape": [2, 8], "dim": 1, "n_bits": 4, "dtype": torch.float32, "outlier": 1.0, "constant": False,
              "seed": 2}, body)


def _updates(c):
    def step(api, ex, cache, i, n):
        k, v = stream(ex, 100 * i + n, ex["chunks"][n], c.device)
        return {"(K, V)": c.call(cache.update, n % 2, k, v), "seq_len": cache.seq_len(n % 2), "nbytes()": cache.nbytes()}
    return step


@CHECKS.add("two QuantizedKVCache instances share no storage: each behaves as it would alone",
            uses="QuantizedKVCache.update")
def caches_share_no_storage(ctx):
    def body(c, ex):
        make = lambda api, e, i: api.QuantizedKVCache(n_bits=ex["n_bits"], residual_len=ex["residual_len"])  # noqa
        step, n = _updates(c), len(ex["chunks"])
        both = protocol.interleaved(make, step, n)
        alone = [protocol.interleaved(lambda api, e, i, j=j: make(api, e, j),
                                      lambda api, e, cache, i, m, j=j: step(api, e, cache, j, m), n, names=(name,))
                 for j, name in enumerate("AB")]

        def each_alone(api, e):
            a, b = (run(api, e) for run in alone)
            return {k: v for pair in zip(a.items(), b.items()) for k, v in pair}
        _own(c, ex, both, each_alone,
             "caches A and B updated in turn, against each updated alone (two caches never share storage)")
        held = {}

        def first(api, e):
            held["A"], held["B"] = make(api, e, 0), make(api, e, 1)
            return step(api, e, held["A"], 0, 0)
        _held(c, ex, protocol.kept(first, lambda api, e: step(api, e, held["B"], 1, 1), "cache A's update result",
                                   "cache B's update"), "cache A's returned (K, V), held while another cache is updated")

    ctx.case({"n_bits": 4, "residual_len": 4, "batch": 1, "heads": 2, "head_dim": 8, "dtype": torch.float32,
              "chunks": [3, 5, 1, 4, 2], "seed": 9}, body)


# -- the device -------------------------------------------------------------------------------
def _device_scenario(s):
    api = s.ctx.t
    x = s.put(randn(0, 1, 2, 8, 4))  # (B=1, Hkv=2, S=8, D=4)
    codes, scale, zero = s.call("quantize(x, 4, dim=2)", api.quantize, x, 4, 2)
    s.call("dequantize(codes, scale, zero)", api.dequantize, codes, scale, zero)
    packed = s.call("pack(codes, 4)", api.pack, codes, 4)
    s.call("unpack(packed, 4)", api.unpack, packed, 4)
    cache = api.QuantizedKVCache(n_bits=4, residual_len=4)
    kv = [s.put(randn(i, 1, 2, n, 4)) for i, n in enumerate((3, 3, 4, 4, 1, 1))]  # (B, Hkv, T, D)
    s.call("QuantizedKVCache(4, 4).update(0, k_new, v_new) with 3 tokens", cache.update, 0, kv[0], kv[1])
    s.call("update(0, k_new, v_new) with 4 more tokens (one group quantized)", cache.update, 0, kv[2], kv[3])
    s.call("update(0, k_new, v_new) with 1 more token (a second group)", cache.update, 0, kv[4], kv[5])
    k09_fp8_checks.device_scenario(s)


@CHECKS.add("every function, task 6's FP8 cache included, keeps the inputs' device", uses="FP8KVCache")
def keeps_the_device(ctx):
    ctx.case({"x": (1, 2, 8, 4), "n_bits": 4, "residual_len": 4},
             lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))


k09_fp8_checks.register(CHECKS)  # task 6, the FP8 cache
