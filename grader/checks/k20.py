"""Hidden checks of kata 20 — a cache per layer type.

Counts, positions and masks are exact; the linear state is judged against its float64 run. The
programs (a window layer fed chunk after chunk, a hybrid cache driven layer by layer, a linear state
stepped) live in grader.checks.k20_programs; the bad inputs in grader.checks.k20_inputs.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks import k20_inputs as inputs
from grader.checks import k20_programs as p
from grader.checks.support import devices, envelope, protocol
from grader.checks.support.common import randn
from grader.engine import Checks, report

CHECKS = Checks("20")
GIB = 2**30
FULL, SLIDING, CHUNKED, SHARED, LINEAR = "full_attention", "sliding_attention", "chunked_attention", "shared", \
    "linear_attention"


# -- task 1: hybrid_cache_bytes -------------------------------------------------------------------
def _bytes(types, seq_len, heads, dim, window, **more):
    return {"layer_types": types, "seq_len": seq_len, "n_kv_heads": heads, "head_dim": dim, "window": window, **more}


GEMMA3 = [SLIDING] * 5 + [FULL]  # a sixth of the layers full
# Gemma 3 27B: 52 sliding + 10 full, 16 KV heads of 128; a token's K and V in bf16 are 8,192 bytes per layer.
G3_27B = GEMMA3 * 10 + [SLIDING] * 2
PINNED_BYTES = [
    (_bytes(G3_27B, 32768, 16, 128, 1024), 10 * 32768 * 8192 + 52 * 1023 * 8192,
     "Gemma 3 27B at 32k in bf16: 2.91 GiB (the full layers 2.5 GiB, each sliding one 1,023 tokens)"),
    (_bytes([FULL] * 62, 32768, 16, 128, 1024), 62 * 32768 * 8192, "the same 62 layers all full: 15.5 GiB"),
    (_bytes([SLIDING, FULL] * 18, 131072, 8, 64, 128), 18 * 131072 * 2048 + 18 * 127 * 2048,
     "gpt-oss (36 alternating layers, W 128, 8 KV heads of 64) at 128k"),
    (_bytes(([CHUNKED] * 3 + [FULL]) * 12, 131072, 8, 128, 8192), 12 * 131072 * 4096 + 36 * 8191 * 4096,
     "Llama 4 text (36 chunked layers of 8,192, 12 full) at 128k: a chunked layer holds what a sliding one does"),
    (_bytes([SLIDING, SLIDING, FULL], 3, 2, 4, 8), 3 * 3 * 2 * 2 * 4 * 2,
     "3 tokens, W 8: every layer holds all 3 while seq_len < W - 1"),
    (_bytes([SLIDING, FULL], 10, 2, 4, 1), 10 * 32, "W = 1: a sliding layer keeps nothing between steps"),
    (_bytes([SLIDING, FULL, SLIDING, SHARED], 10, {SLIDING: 2, FULL: 1}, {SLIDING: 4, FULL: 16}, 4),
     2 * 3 * 2 * 2 * 4 * 2 + 10 * 2 * 1 * 16 * 2,
     "Gemma 4 style: sliding layers 2 KV heads of 4, the full layer 1 of 16; the shared layer adds nothing"),
    (_bytes([LINEAR, LINEAR, LINEAR, FULL], 1000, 2, 8, 4, state_bytes=4096, dtype_bytes=2, batch=3),
     3 * (3 * 4096 + 1000 * 2 * 2 * 8 * 2), "Qwen3-Next style, batch 3: three fixed states and one full layer"),
    (_bytes([LINEAR, SHARED, FULL], 0, 2, 8, 4, state_bytes=100, dtype_bytes=4), 100,
     "seq_len 0: the state is counted as held, the attention layers hold nothing"),
    (_bytes([LINEAR, FULL], 5, 2, 4, 4), 5 * 2 * 2 * 4 * 2, "state_bytes left out: a linear layer counts 0"),
    (_bytes([], 9, 2, 4, 4), 0, "no layers at all: nothing held"),
    (_bytes((SLIDING, CHUNKED), 7, 3, 2, 5, dtype_bytes=1, batch=2), 2 * 2 * 4 * 2 * 3 * 2,
     "a tuple of kinds, one byte per number, batch 2: each window layer holds W - 1 = 4 of the 7 tokens"),
]


def _expect_bytes(c, ex, expected, what=""):
    got = c.call(c.t.hybrid_cache_bytes, ex["layer_types"], ex["seq_len"], **{k: v for k, v in ex.items()
                                                                               if k not in ("layer_types", "seq_len")})
    if type(got) is not int or got != expected:
        c.fail(f"hybrid_cache_bytes returned {report.describe(got)}, expected the int {expected:,} "
               f"({expected / GIB:.4g} GiB){': ' + what if what else ''}", ex, ("bytes", got))


@CHECKS.add("hybrid_cache_bytes gives the worked numbers of real layer patterns", uses="hybrid_cache_bytes")
def bytes_pinned(ctx):
    for ex, expected, what in PINNED_BYTES:
        ctx.case(ex, lambda c, e, expected=expected, what=what: _expect_bytes(c, e, expected, what))


@st.composite
def byte_configs(draw):
    types = draw(st.lists(st.sampled_from(p.ATTENTION + (SHARED, LINEAR)), min_size=0, max_size=8))
    per_kind = st.integers(1, 8)
    heads = draw(st.one_of(per_kind, st.fixed_dictionaries({k: per_kind for k in p.ATTENTION})))
    dims = draw(st.one_of(per_kind, st.fixed_dictionaries({k: per_kind for k in p.ATTENTION})))
    return _bytes(types, draw(st.integers(0, 40)), heads, dims, draw(st.integers(1, 12)),
                  state_bytes=draw(st.integers(0, 500)), dtype_bytes=draw(st.sampled_from([1, 2, 4])),
                  batch=draw(st.integers(1, 3)))


@CHECKS.add("hybrid_cache_bytes matches the sum by kind on random layer lists", uses="hybrid_cache_bytes")
def bytes_random(ctx):
    def body(c, ex):
        ref = c.ref.hybrid_cache_bytes(ex["layer_types"], ex["seq_len"],
                                       **{k: v for k, v in ex.items() if k not in ("layer_types", "seq_len")})
        _expect_bytes(c, ex, ref)

    ctx.forall(byte_configs(), body, max_examples=40)


@CHECKS.add("hybrid_cache_bytes rejects bad input with a ValueError naming the argument", uses="hybrid_cache_bytes")
def bytes_rejects_bad_input(ctx):
    inputs.bytes_cases(ctx)


# -- task 2: window_mask and SlidingLayer ------------------------------------------------------------
def _mask(kind, q, k, window):
    return {"kind": kind, "q_pos": q, "k_pos": k, "window": window, "seed": 0}


PINNED_MASKS = [  # (example, the grid by hand: rows are queries, columns keys)
    (_mask(SLIDING, [5, 6, 7], [2, 3, 4, 5, 6, 7], 4), ["111100", "011110", "001111"]),  # the README's picture
    (_mask(CHUNKED, [5, 6, 7], [2, 3, 4, 5, 6, 7], 4), ["001100", "001110", "001111"]),  # chunk 4 … 7 only
    (_mask(FULL, [5, 6, 7], [2, 3, 4, 5, 6, 7], 4), ["111100", "111110", "111111"]),  # no window at all
    (_mask(SLIDING, [0, 1, 2], [0, 1, 2], 1), ["100", "010", "001"]),  # W = 1: each token itself
    (_mask(CHUNKED, [3, 4], [0, 1, 2, 3, 4], 1), ["00010", "00001"]),  # chunks of 1: itself only
    (_mask(SLIDING, [9], [9, 8, 3, 6], 4), ["1101"]),  # keys out of order: 6 … 9 seen, 3 not
    (_mask(CHUNKED, [8], [6, 7, 8], 8), ["001"]),  # 8 starts a chunk: 6 and 7 were the last one's
]


def _as_tensors(ex, device):
    return (torch.tensor(ex["q_pos"], dtype=torch.long, device=device),
            torch.tensor(ex["k_pos"], dtype=torch.long, device=device))


def _expect_mask(c, ex, expected):
    q, k = _as_tensors(ex, c.device)
    got = c.call(c.t.window_mask, ex["kind"], q, k, ex["window"])
    call = f"window_mask({ex['kind']!r}, q_pos={ex['q_pos']}, k_pos={ex['k_pos']}, window={ex['window']})"
    if not isinstance(got, torch.Tensor) or got.dtype != torch.bool or tuple(got.shape) != tuple(expected.shape):
        c.fail(f"{call} returned {report.describe(got)}, expected a bool tensor of shape {tuple(expected.shape)}",
               ex, ("mask", report.describe(got)))
    problem = report.compare(expected.to(got.device), got, "mask")
    if problem:
        c.fail(f"{call}\n  {problem}", ex, got)


@CHECKS.add("window_mask draws the hand-worked grids of full, sliding and chunked layers", uses="window_mask")
def mask_pinned(ctx):
    for ex, rows in PINNED_MASKS:
        grid = torch.tensor([[ch == "1" for ch in row] for row in rows])
        ctx.case(ex, lambda c, e, grid=grid: _expect_mask(c, e, grid))


@st.composite
def mask_inputs(draw):
    start, T, window = draw(st.integers(0, 40)), draw(st.integers(1, 6)), draw(st.integers(1, 9))
    past = draw(st.integers(0, 8))
    keys = list(range(max(0, start - past), start + T))
    return _mask(draw(st.sampled_from(p.ATTENTION)), list(range(start, start + T)), keys, window)


@CHECKS.add("window_mask matches the rule on random positions, windows and chunks", uses="window_mask")
def mask_random(ctx):
    def body(c, ex):
        q, k = _as_tensors(ex, c.device)
        _expect_mask(c, ex, c.ref.window_mask(ex["kind"], q, k, ex["window"]).cpu())

    ctx.forall(mask_inputs(), body, max_examples=40)


@CHECKS.add("window_mask rejects bad input with a ValueError naming the argument", uses="window_mask")
def mask_rejects_bad_input(ctx):
    inputs.mask_cases(ctx)


# W = 4: a prefill of 5 stores 2, 3, 4; a chunk of 3 gets 2 … 7; then one token; then a chunk longer than W.
PINNED_WINDOW = {"window": 4, "batch": 1, "heads": 2, "head_dim": 4, "v_dim": 3, "chunks": [5, 3, 1, 6, 1],
                 "dtype": torch.float64, "seed": 3}
WIDE_WINDOW = {**PINNED_WINDOW, "dtype": torch.float32, "batch": 2}
LARGE_WINDOW = {"window": 64, "heads": 16, "head_dim": 8, "chunks": [300, 1, 40]}


@CHECKS.add("SlidingLayer returns W - 1 + T keys with their positions and keeps the last W - 1",
            uses="SlidingLayer")
def window_stream(ctx):
    def body(c, ex):
        c.differential(ex, lambda api, e: p.window_stream(c, api, e), "a new SlidingLayer, then update(k, v) chunk "
                       "after chunk: every step's (K, V, k_pos), len(layer), seen and nbytes()")

    ctx.case(PINNED_WINDOW, body)
    ctx.forall(p.window_streams(), body, max_examples=20)
    envelope.run(ctx, WIDE_WINDOW, ("large", "half", "strided"), body, large=LARGE_WINDOW)


@CHECKS.add("SlidingLayer rejects bad input with a ValueError naming the argument, and changes nothing",
            uses="SlidingLayer")
def window_rejects_bad_input(ctx):
    inputs.window_cases(ctx)


# -- task 3: HybridKVCache ----------------------------------------------------------------------------
# The study's model: sliding, full, sliding, a shared layer reading layer 2, a linear layer, full; W = 4.
SIX = {"layer_types": [SLIDING, FULL, SLIDING, SHARED, LINEAR, FULL], "shared_from": {3: 2}, "window": 4,
       "chunks": [5, 3, 1, 1, 1, 2], "reset_after": None, "batch": 1, "heads": 2, "head_dim": 2, "v_dim": 3,
       "dtype": torch.float64, "seed": 5}
PINNED_PROGRAMS = [
    SIX,
    {**SIX, "chunks": [13], "seed": 6},  # past the window in one prefill: 13 seen, sliding layers store 3
    {**SIX, "layer_types": [CHUNKED, SHARED, LINEAR, FULL], "shared_from": {1: 0}, "chunks": [3, 2, 4], "seed": 7},
    {**SIX, "layer_types": [SLIDING, SHARED, SLIDING], "shared_from": {1: 0}, "window": 1, "chunks": [2, 1, 3],
     "seed": 8},  # W = 1 and no full layer: the length is still tokens seen
    {**SIX, "reset_after": 2, "dtype": torch.float32, "seed": 9},  # a reset, then the request again
    {**SIX, "layer_types": [], "shared_from": {}, "chunks": [2], "seed": 10},  # no layers: nothing seen, nothing held
]


@CHECKS.add("HybridKVCache returns each layer's keys, what a shared layer's producer returned, and its counts",
            uses="HybridKVCache")
def hybrid_program(ctx):
    def body(c, ex):
        c.differential(ex, lambda api, e: p.hybrid_program(c, api, e), "a new HybridKVCache driven as a model "
                       "drives it (every layer in order per chunk: update, shared or state(layer).step), then "
                       "seq_len(), stored(layer) and nbytes() after each chunk")

    for ex in PINNED_PROGRAMS:
        ctx.case(ex, body)
    ctx.forall(p.programs(), body, max_examples=20)
    envelope.run(ctx, {**SIX, "dtype": torch.float32}, ("half", "strided"), body)


@CHECKS.add("HybridKVCache.nbytes() equals hybrid_cache_bytes of its layers after every chunk",
            uses="HybridKVCache.nbytes")
def hybrid_bytes_are_the_formula(ctx):
    def body(c, ex):
        cache = c.t.HybridKVCache(ex["layer_types"], window=ex["window"], shared_from=ex["shared_from"])
        state_bytes, seen = 0, 0
        for step, T in enumerate(ex["chunks"], start=1):
            for layer, kind in enumerate(ex["layer_types"]):
                p._layer_call(c, c.t, cache, ex, layer, T, 100 * step + 10 * layer)
                if kind == LINEAR:
                    state_bytes = ex["heads"] * ex["head_dim"] * ex["v_dim"] * ex["dtype"].itemsize
            seen += T
            want = c.ref.hybrid_cache_bytes(ex["layer_types"], seen, n_kv_heads=ex["heads"],
                                            head_dim=ex["head_dim"], window=ex["window"], state_bytes=state_bytes,
                                            dtype_bytes=ex["dtype"].itemsize, batch=ex["batch"])
            got = c.call(cache.nbytes)
            if got != want:
                c.fail(f"after chunk {step} ({seen} seen) cache.nbytes() is {got!r}, expected {want:,}: "
                       f"hybrid_cache_bytes of the same layers (value width = key width here)", ex, ("nbytes", got))

    ctx.case({**SIX, "v_dim": 2}, body)
    ctx.forall(p.programs().map(lambda e: {**e, "v_dim": e["head_dim"]}), body, max_examples=10)


@CHECKS.add("HybridKVCache rejects bad input with a ValueError naming the argument, and changes nothing",
            uses="HybridKVCache")
def hybrid_rejects_bad_input(ctx):
    inputs.hybrid_cases(ctx)


@CHECKS.add("two HybridKVCache instances share no storage, and held results survive the next update",
            uses="HybridKVCache")
def caches_share_no_storage(ctx):
    def turn(c):
        def run(api, ex, cache, i, n):
            k, v = p.kv(c, ex, ex["seed"] + 10 * n + 2 * i, ex["chunks"][n])
            return {"layer 0": p.snap(c.call(cache.update, 0, k, v)), "seq_len()": cache.seq_len()}
        return run

    def body(c, ex):
        make = lambda api, e, i: api.HybridKVCache(e["layer_types"], window=e["window"])  # noqa: E731
        c.differential(ex, protocol.interleaved(make, turn(c), len(ex["chunks"])),
                       "caches A and B, updated in turn")

    ctx.case({"layer_types": [SLIDING], "window": 3, "chunks": [4, 1, 2], "batch": 1, "heads": 1, "head_dim": 2,
              "v_dim": 2, "dtype": torch.float32, "seed": 1}, body)


@CHECKS.add("a returned k_pos, mask or linear output is the caller's: changing it changes no later answer",
            uses="SlidingLayer.update")
def results_are_the_callers(ctx):
    def body(c, ex):
        held = {}

        def positions(api, e):  # only k_pos: K and V may be views of the layer's storage (SPEC)
            held["layer"] = api.SlidingLayer(e["window"])
            return c.call(held["layer"].update, *p.kv(c, e, 1, 4))[2]

        def next_update(api, e):
            return p.snap(c.call(held["layer"].update, *p.kv(c, e, 3, 2)))

        c.differential(ex, protocol.changed_by_caller(positions, next_update, "the next update"),
                       "SlidingLayer(3).update of 4 tokens, its k_pos overwritten by the caller, then 2 more tokens")
        q, k = torch.arange(3, 6, device=c.device), torch.arange(0, 6, device=c.device)
        mask = lambda api, e: c.call(api.window_mask, "sliding_attention", q, k, 2)  # noqa: E731
        c.differential(ex, protocol.twice(mask, "window_mask('sliding_attention', 3 … 5, 0 … 5, 2)"),
                       "the same mask asked twice")
        c.differential(ex, protocol.changed_by_caller(mask, mask, "the same mask again"),
                       "a mask overwritten by the caller, then the same mask again (a memoized mask?)")

        def stepped(api, e):
            held["state"] = api.LinearState()
            return c.call(held["state"].step, *_linear_inputs(c, e, 1))

        def next_step(api, e):
            return {"out": p.snap(c.call(held["state"].step, *_linear_inputs(c, e, 2))),
                    "state": p.snap(held["state"].state)}

        c.differential(ex, protocol.changed_by_caller(stepped, next_step, "the next step"),
                       "LinearState.step, its output overwritten by the caller, then another step")

    ctx.case({**WIDE_WINDOW, "window": 3}, body)


def _linear_inputs(c, ex, seed):
    B, H, D = ex["batch"], ex["heads"], ex["head_dim"]
    q, k, v = (randn(seed + j, B, H, 2, D, dtype=ex["dtype"], device=c.device) for j in range(3))
    return q, k, v, torch.full((B, H, 2), 0.5, dtype=ex["dtype"], device=c.device)


# -- task 4: LinearState ------------------------------------------------------------------------------
WIDE_LINEAR = {"batch": 2, "heads": 2, "head_dim": 4, "v_dim": 3, "chunks": [3, 1, 2], "dtype": torch.float32,
               "seed": 12}
LARGE_LINEAR = {"batch": 1, "heads": 16, "head_dim": 8, "v_dim": 8, "chunks": [1, 299]}  # 1, then 300 tokens


@CHECKS.add("LinearState.step runs the recurrence: decay, write, read, token by token", uses="LinearState.step")
def linear_stream(ctx):
    def body(c, ex):
        c.differential(ex, lambda api, e: p.linear_stream(c, api, e), "a new LinearState, then step(q, k, v, decay) "
                       "chunk after chunk: every step's output, state, seen and nbytes()")

    ctx.case({**WIDE_LINEAR, "dtype": torch.float64}, body)
    ctx.forall(p.linear_streams(), body, max_examples=20)
    envelope.run(ctx, WIDE_LINEAR, ("large", "half", "strided", "magnitude"), body, large=LARGE_LINEAR)


@CHECKS.add("LinearState rejects bad input with a ValueError naming the argument, and changes nothing",
            uses="LinearState.step")
def linear_rejects_bad_input(ctx):
    inputs.linear_cases(ctx)


# -- every task: the device --------------------------------------------------------------------------
def _device_scenario(s):
    api = s.ctx.t
    k, v = (s.put(randn(i, 1, 2, 6, 4, dtype=torch.float32)) for i in range(2))  # (B=1, H=2, T=6, D=4)
    s.call("window_mask('sliding_attention', q_pos, k_pos, 3)", api.window_mask, "sliding_attention",
           s.put(torch.arange(4, 6)), s.put(torch.arange(0, 6)), 3)
    cache = api.HybridKVCache([SLIDING, FULL, SHARED, LINEAR], window=3, shared_from={2: 0})
    for start, T in ((0, 4), (4, 1), (5, 1)):
        for layer in (0, 1):
            s.call(f"cache.update({layer}, k, v), tokens {start} … {start + T - 1}", cache.update, layer,
                   k[:, :, start:start + T], v[:, :, start:start + T])
        s.call("cache.shared(2)", cache.shared, 2)
        s.call("cache.state(3).step(q, k, v, decay)", cache.state(3).step, k[:, :, start:start + T],
               k[:, :, start:start + T], v[:, :, start:start + T], s.put(torch.full((1, 2, T), 0.5)))


@CHECKS.add("every function keeps the inputs' device (no tensor made on the CPU by accident)",
            uses="HybridKVCache")
def keeps_the_device(ctx):
    ctx.case({"layers": 4}, lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))
