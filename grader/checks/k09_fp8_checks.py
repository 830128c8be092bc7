"""Hidden checks of kata 09, task 6 — an FP8 cache (registered on kata 09's CHECKS by ``register``).

Scales are judged against amax / max in float64 within float32 rounding; quantized values by
grader.checks.k09_fp8.fp8_problem (on the grid, nearest, saturated); the cache by drawn programs whose
chunks are 0, 1, 3 or 40 times the size of the first (a zero calibration, a frozen scale overrun).
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks.k09_fp8 import FP8, FP8_MAX, HALVES, TIE, chunk, formula_nbytes, fp8_problem, fp8_programs, want_scale
from grader.checks.support.common import SEEDS, expect_value_error, randn
from grader.engine import report


def _scale_body(c, ex):
    x = chunk(ex, 0, 3, ex["gain"], c.device)[0]
    if ex.get("negative"):  # the largest magnitude is negative: amax of |x|, not of x
        x = -x.abs()
    call = f"fp8_scale(x of shape {tuple(x.shape)} in {x.dtype}, {ex['fmt']!r}, per_head={ex['per_head']})"
    args = (x, ex["fmt"], True) if ex["per_head"] else (x, ex["fmt"])  # per tensor: the default
    got = c.call(c.t.fp8_scale, *args)
    want = want_scale(x, ex["fmt"], ex["per_head"])
    if not isinstance(got, torch.Tensor) or got.dtype != torch.float32 or tuple(got.shape) != tuple(want.shape):
        c.fail(f"{call} returned {report.describe(got)}; expected float32 of shape {tuple(want.shape)} (() per "
               "tensor, (1, Hkv, 1, 1) per head: one scale per KV head, shared by the batch)", ex, ("form", got))
    bad = (got.detach().double().cpu() - want).abs() > TIE * want
    if bad.any():
        i = tuple(int(j) for j in bad.nonzero()[0])
        c.fail(f"{call}: scale at {list(i)} is {got[i].item():.7g}, expected {want[i].item():.7g} = amax(|x|) / "
               f"{FP8_MAX[ex['fmt']]:g} (1.0 where amax is 0)", ex, ("scale", got.detach().cpu()))


def _quantize_body(c, ex):
    x = randn(ex["seed"], *ex["shape"]) * ex["gain"]
    x.view(-1)[0] = ex.get("first", x.view(-1)[0].item())
    x = x.to(device=c.device, dtype=ex["dtype"])
    scale = torch.tensor(ex["scale"], dtype=torch.float32, device=c.device)
    call = f"fp8_quantize(x of shape {tuple(x.shape)} in {x.dtype}, scale {ex['scale']}, {ex['fmt']!r})"
    codes = c.call(c.t.fp8_quantize, x, scale, ex["fmt"])
    if not isinstance(codes, torch.Tensor) or codes.dtype != FP8[ex["fmt"]] or codes.shape != x.shape:
        c.fail(f"{call} returned {report.describe(codes)}; expected {FP8[ex['fmt']]} of x's shape", ex,
               ("form", report.describe(codes)))
    found = fp8_problem(x, codes.float() * scale, scale.double().cpu(), ex["fmt"])
    if found:
        i, g, n, why = found
        c.fail(f"{call}: the code at {list(i)} is {g:.6g} for x / scale = {x[i].item() / ex['scale']:.6g}: {why}; "
               f"expected {n:.6g}. The README: x / scale in float32, clamped to ±{FP8_MAX[ex['fmt']]:g}, then cast",
               ex, ("codes", codes.float().cpu()))


def _dequantize_body(c, ex):
    g = torch.Generator().manual_seed(ex["seed"])
    codes = (torch.randn(2, 3, 4, generator=g) * 50).to(FP8[ex["fmt"]]).to(c.device)
    scale = torch.rand(1, 3, 1, generator=g).add(0.1).to(torch.float32).to(c.device)
    got = c.call(c.t.fp8_dequantize, codes, scale, ex["dtype"])
    want = codes.double().cpu() * scale.double().cpu()
    call = f"fp8_dequantize(codes {ex['fmt']} (2, 3, 4), scale float32 (1, 3, 1), {ex['dtype']})"
    if not isinstance(got, torch.Tensor) or got.dtype != ex["dtype"] or tuple(got.shape) != (2, 3, 4):
        c.fail(f"{call} returned {report.describe(got)}; expected {ex['dtype']} of shape (2, 3, 4)", ex, ("form",))
    slack = (2 * TIE + 2 * EPS_OF[ex["dtype"]]) * want.abs()
    bad = (got.detach().double().cpu() - want).abs() > slack
    if bad.any():
        i = tuple(int(j) for j in bad.nonzero()[0])
        c.fail(f"{call}: at {list(i)} got {got[i].item():.7g}, expected codes * scale = {want[i].item():.7g}", ex,
               ("dequantized", got.detach().cpu()))


EPS_OF = {torch.float64: 2.0 ** -52, torch.float32: 2.0 ** -23, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def _replay(c, ex):
    """Run ``ex["ops"]`` on the file's FP8KVCache, judging every returned token, seq_len and nbytes."""
    settings = {k: ex[k] for k in ("fmt", "per_head", "frozen")}
    cache = c.t.FP8KVCache(**settings) if not ex.get("defaults") else c.t.FP8KVCache()
    held = {layer: [] for layer in range(ex["layers"])}  # layer -> its updates' (k, v)
    for step, (layer, n, gain) in enumerate(ex["ops"]):
        k, v = chunk(ex, step, n, gain, c.device)
        out = c.call(cache.update, layer, k, v)
        held[layer].append((k, v))
        S = sum(x.shape[2] for x, _ in held[layer])
        where = f"after update {step} (layer {layer}, {n} token(s) × {gain:g}) of FP8KVCache({settings})"
        if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(
                isinstance(t, torch.Tensor) and t.dtype == ex["dtype"] and t.shape == (k.shape[0], k.shape[1], S,
                                                                                          k.shape[3]) for t in out)):
            c.fail(f"{where}: update returned {report.describe(out)}; expected (K, V) of shape (B, Hkv, {S}, D) in "
                   f"{ex['dtype']}", ex, ("returned", report.describe(out)))
        _judge_layer(c, ex, where, held[layer], out)
        want = tuple(formula_nbytes(ex, sum(x.shape[2] for x, _ in held[j]), len(held[j])) for j in held)
        got = tuple(cache.nbytes(j) for j in held)
        lens = tuple(cache.seq_len(j) for j in held) + (cache.seq_len(),)
        seen = tuple(sum(x.shape[2] for x, _ in held[j]) for j in held)
        if got != want or cache.nbytes() != sum(want) or lens != seen + seen[:1]:
            c.fail(f"{where}: nbytes per layer {got}, nbytes() {cache.nbytes()!r}, seq_len per layer {lens}; "
                   f"expected seq_len {seen} (seq_len() is layer 0's) and nbytes {want} (a byte per code, 4 per float32 scale; a frozen layer holds one set of "
                   "scales, otherwise one set per update)", ex, ("nbytes", got, cache.nbytes(), lens))


def _judge_layer(c, ex, where, updates, out):
    start = 0
    first_k, first_v = updates[0]
    for u, (k, v) in enumerate(updates):
        n = k.shape[2]
        for name, x, got, calib in (("keys", k, out[0], first_k), ("values", v, out[1], first_v)):
            scale = want_scale(calib if ex["frozen"] else x, ex["fmt"], ex["per_head"])
            found = fp8_problem(x, got[:, :, start:start + n], scale, ex["fmt"])
            if found:
                i, g, nearest, why = found
                rule = ("frozen: the scale of the layer's first update, kept" if ex["frozen"]
                        else "not frozen: this update's own scale")
                c.fail(f"{where}: {name} of update {u} (positions {start} … {start + n - 1}) at {list(i)}: "
                       f"returned / scale = {g:.6g}, {why}; expected {nearest:.6g}, with the scale amax(|x|) / "
                       f"{FP8_MAX[ex['fmt']]:g} ({rule}; per head: {ex['per_head']})", ex,
                       (name, u, got[:, :, start:start + n].detach().cpu()))
        start += n


def _copies(c, ex):
    """The file's cache fed one token at a time from one refilled buffer, against fresh tensors each time."""
    def run(refill):
        cache = c.t.FP8KVCache(ex["fmt"], ex["per_head"], ex["frozen"])
        kb, vb = chunk(ex, 99, 1, 1.0, c.device)
        for t in range(ex["tokens"]):
            k, v = chunk(ex, t, 1, 1.0 + t, c.device)
            if refill:
                kb.copy_(k)
                vb.copy_(v)
                k, v = kb, vb
            K, V = c.call(cache.update, 0, k, v)
        return {"K": K.detach().clone(), "V": V.detach().clone()}

    problem = report.compare(run(False), run(True), "one buffer refilled by the caller (got) against fresh tensors")
    if problem:
        c.fail(f"{problem}\n  the cache must keep its own copy of what it is given (and of its scales)", ex,
               ("aliased",))


def _rejects(c, ex):
    x = randn(ex["seed"], 1, 2, 3, 4, device=c.device, dtype=torch.float32)
    s = torch.tensor(0.5, device=c.device)
    codes = x.to(torch.float8_e4m3fn)
    api = c.t
    cases = [("fp8_scale with fmt='e3m4'", api.fp8_scale, (x, "e3m4"), ("fmt",)),
             ("fp8_scale of an integer x", api.fp8_scale, (x.long(), "e4m3"), ("x",)),
             ("fp8_scale per head of a 2-D x", api.fp8_scale, (x[0, 0], "e4m3", True), ("x",)),
             ("fp8_scale per head of a 5-D x", api.fp8_scale, (x[None], "e4m3", True), ("x",)),
             ("fp8_scale of an empty x", api.fp8_scale, (x[:, :, :0], "e4m3"), ("x",)),
             ("fp8_quantize of a 0-d x with 2 scales", api.fp8_quantize,
              (x[0, 0, 0, 0], torch.full((2,), 0.5, device=c.device), "e4m3"), ("scale",)),
             ("fp8_quantize with fmt='int8'", api.fp8_quantize, (x, s, "int8"), ("fmt",)),
             ("fp8_quantize with a float64 scale", api.fp8_quantize, (x, s.double(), "e4m3"), ("scale",)),
             ("fp8_quantize with a scale of 0", api.fp8_quantize, (x, s * 0, "e4m3"), ("scale",)),
             ("fp8_quantize with a scale of 3 heads for x of 2", api.fp8_quantize,
              (x, torch.ones(1, 3, 1, 1, device=c.device), "e4m3"), ("scale",)),
             ("fp8_quantize of x as nested lists", api.fp8_quantize, (x.tolist(), s, "e4m3"), ("x",)),
             ("fp8_dequantize of float32 codes", api.fp8_dequantize, (x, s, torch.float32), ("codes",)),
             ("fp8_dequantize with a float16 scale", api.fp8_dequantize, (codes, s.half(), torch.float32), ("scale",)),
             ("fp8_dequantize to int64", api.fp8_dequantize, (codes, s, torch.int64), ("dtype",)),
             ("FP8KVCache('e4m3fnuz')", api.FP8KVCache, ("e4m3fnuz",), ("fmt",)),
             ("FP8KVCache(per_head='yes')", api.FP8KVCache, ("e4m3", "yes"), ("per_head",)),
             ("FP8KVCache(frozen=1)", api.FP8KVCache, ("e4m3", False, 1), ("frozen",))]
    for what, fn, args, names in cases:
        expect_value_error(c, fn, *args, what=what, names=names, example=ex)
    cache = api.FP8KVCache(frozen=ex["frozen"])
    c.call(cache.update, 0, x, x)
    for what, args, names in (("update(-1, …)", (-1, x, x), ("layer",)),
                              ("update with a 3-D k_new", (0, x[0], x[0]), ("k_new",)),
                              ("update with 0 new tokens", (0, x[:, :, :0], x[:, :, :0]), ("k_new",)),
                              ("update with v_new of 1 head", (0, x, x[:, :1]), ("v_new",)),
                              ("update with v_new in float64", (0, x, x.double()), ("v_new",)),
                              ("update of layer 0 with k_new, v_new of 1 head", (0, x[:, :1], x[:, :1]), ("k_new",)),
                              ("update of layer 0 with k_new, v_new in float64", (0, x.double(), x.double()),
                               ("k_new",)),
                              ("update of layer 0 (B 1) with k_new, v_new of batch 2", (0, torch.cat([x, x]),
                                                                                        torch.cat([x, x])), ("k_new",)),
                              ("update of layer 0 (D 4) with k_new, v_new of width 8",
                               (0, torch.cat([x, x], 3), torch.cat([x, x], 3)), ("k_new",))):
        expect_value_error(c, cache.update, *args, what=what, names=names, example=ex)
    expect_value_error(c, cache.seq_len, -1, what="seq_len(-1)", names=("layer",), example=ex)
    expect_value_error(c, cache.nbytes, 1.5, what="nbytes(1.5)", names=("layer",), example=ex)
    if cache.seq_len(0) != 3 or cache.nbytes(0) != 2 * 24 + 8:
        c.fail(f"after refused updates, seq_len(0) is {cache.seq_len(0)!r} and nbytes(0) {cache.nbytes(0)!r}; "
               "expected 3 and 56: a refused update changes nothing", ex, ("refused call changed",))


def device_scenario(s):
    """Task 6's calls for kata 09's keeps_the_device."""
    api = s.ctx.t
    x = s.put(randn(0, 1, 2, 3, 4))
    scale = s.call("fp8_scale(x, 'e4m3', per_head=True)", api.fp8_scale, x, "e4m3", True)
    codes = s.call("fp8_quantize(x, scale, 'e4m3')", api.fp8_quantize, x, scale, "e4m3")
    s.call("fp8_dequantize(codes, scale)", api.fp8_dequantize, codes, scale)
    cache = api.FP8KVCache("e5m2", True, False)
    s.call("FP8KVCache('e5m2', True, False).update(0, k, v)", cache.update, 0, x, x)
    s.call("a second update(0, k, v)", cache.update, 0, x, x)


SCALE_BASE = {"fmt": "e4m3", "per_head": False, "batch": 2, "heads": 3, "head_dim": 4, "dtype": torch.float32,
              "gain": 1.0, "seed": 3}
PINNED = {"fmt": "e4m3", "per_head": False, "frozen": True, "layers": 2, "batch": 2, "heads": 2, "head_dim": 4,
          "dtype": torch.float32, "seed": 11}


def register(CHECKS) -> None:
    """Add task 6's checks to kata 09's ``CHECKS``."""
    @CHECKS.add("fp8_scale: amax(|x|) / the format's max in float32, per tensor or per head, 1 for zeros",
                uses="fp8_scale")
    def fp8_scale_values(ctx):
        for case in ({}, {"fmt": "e5m2"}, {"per_head": True}, {"per_head": True, "fmt": "e5m2", "negative": True},
                     {"negative": True}, {"gain": 0.0}, {"gain": 0.0, "per_head": True},
                     {"dtype": torch.bfloat16, "per_head": True}, {"dtype": torch.float16, "gain": 3.0}):
            ctx.case({**SCALE_BASE, **case}, _scale_body)

    @CHECKS.add("fp8_quantize: x / scale in float32, saturated at ±max (also inf), cast to the nearest FP8 value",
                uses="fp8_quantize")
    def fp8_quantize_nearest(ctx):
        ctx.forall(st.fixed_dictionaries({
            "fmt": st.sampled_from(sorted(FP8)), "shape": st.lists(st.integers(1, 6), min_size=1, max_size=3),
            "gain": st.sampled_from([1.0, 100.0, 1e5]), "scale": st.sampled_from([1.0, 0.01, 2.0 ** -10]),
            "dtype": st.sampled_from([torch.float64, torch.float32, *HALVES]), "seed": SEEDS}),
            _quantize_body, max_examples=25)
        big = {"shape": [64, 64], "gain": 1.0, "scale": 0.01, "seed": 5}
        for case in ({"fmt": "e5m2", "dtype": torch.float32, "first": 1e9},
                     {"fmt": "e5m2", "dtype": torch.float32, "first": float("-inf")},
                     {"fmt": "e4m3", "dtype": torch.float32, "first": float("inf")},
                     {"fmt": "e4m3", "dtype": torch.bfloat16}, {"fmt": "e5m2", "dtype": torch.float16},
                     {"fmt": "e4m3", "dtype": torch.float64, "scale": 3e-6}):
            ctx.case({**big, **case}, _quantize_body)

    @CHECKS.add("fp8_dequantize: codes * scale, in the dtype asked for", uses="fp8_dequantize")
    def fp8_dequantize_values(ctx):
        ctx.forall(st.fixed_dictionaries({"fmt": st.sampled_from(sorted(FP8)), "seed": SEEDS,
                                          "dtype": st.sampled_from([torch.float64, torch.float32, *HALVES])}),
                   _dequantize_body, max_examples=8)

    _register_cache(CHECKS)


def _register_cache(CHECKS) -> None:
    @CHECKS.add("FP8KVCache: drawn programs, frozen and per-update scales, saturation, seq_len and nbytes",
                uses="FP8KVCache")
    def fp8_cache_programs(ctx):
        ctx.forall(fp8_programs(), _replay, max_examples=30)
        # Pinned: defaults; a frozen scale overrun 40 times; a first update of zeros (scale 1); half types.
        ops = [(0, 3, 1.0), (1, 2, 0.0), (0, 1, 40.0), (1, 4, 3.0), (0, 2, 1.0)]
        for case in ({"defaults": True}, {"frozen": False}, {"per_head": True, "fmt": "e5m2"},
                     {"dtype": torch.bfloat16, "per_head": True}, {"dtype": torch.float16, "frozen": False},
                     {"fmt": "e5m2", "dtype": torch.float64}):
            ctx.case({**PINNED, "ops": ops, **case}, _replay)

    @CHECKS.add("FP8KVCache keeps its own copy of what it is given", uses="FP8KVCache")
    def fp8_cache_copies(ctx):
        for frozen in (True, False):
            ctx.case({**PINNED, "frozen": frozen, "tokens": 4}, _copies)

    @CHECKS.add("task 6 rejects bad input with a ValueError naming the argument", uses="FP8KVCache")
    def fp8_rejects_bad_input(ctx):
        for frozen in (True, False):
            ctx.case({"frozen": frozen, "seed": 4}, _rejects)
