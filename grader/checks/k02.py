"""Hidden checks of kata 02 — position and mask offsets."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.engine import report
from grader.checks.support import devices, envelope, protocol
from grader.checks.support.common import (DTYPES, SEEDS, chunks, chunks_and_whole, expect_bad_caches_refused,
                                          expect_no_bias, expect_pair, expect_value_error, expect_value_error_soon,
                                          hidden_states, load_linears, named, run_chunks, two_sequences)
from grader.engine import Checks, Failure
from grader.nn import apply_rope

CHECKS = Checks("02")

LENGTHS = st.fixed_dictionaries({"past_len": st.integers(0, 12), "new_len": st.integers(0, 6)})


def _offsets(api, ctx, ex, name):
    fn = getattr(api, name)
    return {
        f"{name}({ex['past_len']}, {ex['new_len']}, device={ctx.device.type!r})":
            ctx.call(fn, ex["past_len"], ex["new_len"], device=ctx.device),
        f"{name}({ex['past_len']}, {ex['new_len']}) with no device (the CPU)": ctx.call(fn, ex["past_len"], ex["new_len"]),
    }


def _pinned(name, past_len, new_len, expected):
    """A case worked out by hand: ``expected`` is what ``name(past_len, new_len)`` must return."""
    def body(c, ex):
        got = c.call(getattr(c.t, name), past_len, new_len)
        problem = report.compare(expected, got, f"{name}({past_len}, {new_len})")
        if problem:
            c.fail(problem, ex, got)

    return {"past_len": past_len, "new_len": new_len}, body


@CHECKS.add("position_ids start at the cache length", uses="position_ids")
def position_ids_offset(ctx):
    # A cache holding 10 tokens puts the next token at position 10.
    for past, new, expected in ((10, 1, [10]), (5, 3, [5, 6, 7]), (0, 4, [0, 1, 2, 3])):
        ctx.case(*_pinned("position_ids", past, new, torch.tensor(expected)))
    ctx.forall(LENGTHS, lambda c, ex: c.differential(
        ex, lambda api, e: _offsets(api, c, e, "position_ids"), "the positions of new_len tokens after past_len cached ones"),
        max_examples=15)


@CHECKS.add("causal_mask rows start at the cache length and cover past + new keys", uses="causal_mask")
def causal_mask_offset(ctx):
    # After a 5-token prompt the first decode step sees all 6 keys: one row, nothing hidden.
    ctx.case(*_pinned("causal_mask", 5, 1, torch.ones(1, 6, dtype=torch.bool)))
    ctx.case(*_pinned("causal_mask", 2, 3, torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).bool()))
    ctx.case(*_pinned("causal_mask", 0, 3, torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool()))
    ctx.forall(LENGTHS, lambda c, ex: c.differential(
        ex, lambda api, e: _offsets(api, c, e, "causal_mask"), "the mask of new_len new tokens over past_len + new_len keys"),
        max_examples=15)


@CHECKS.add("negative or fractional lengths raise a ValueError naming the argument", uses="position_ids")
def lengths_rejected(ctx):
    def body(c, ex):
        for name in ("position_ids", "causal_mask"):
            fn = getattr(c.t, name)
            for past, new, arg in ((-1, 3, "past_len"), (4, -2, "new_len"), (2.5, 3, "past_len"), (4, 1.5, "new_len")):
                expect_value_error(c, fn, past, new, what=f"{name}({past}, {new})", names=(arg,), example=ex)

    ctx.case({"past_len": -1, "new_len": -2}, body)


@st.composite
def rope_run(draw, min_prefill: int = 1):
    heads = draw(st.integers(1, 3))
    prefill = draw(st.integers(min_prefill, 5))
    middle = draw(st.integers(0, 6))
    lengths = [prefill] + (chunks(middle, draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))) if middle else [])
    return {
        "batch": draw(st.integers(1, 2)),
        "d_model": heads * draw(st.sampled_from([2, 4, 8])),
        "n_heads": heads,
        "rope_base": draw(st.sampled_from([10000.0, 100.0])),
        "lengths": lengths + [1] * draw(st.integers(0, 3)),
        "dtype": draw(DTYPES),
        "seed": draw(SEEDS),
    }


def _layer(api, ex, device):
    d = ex["d_model"]
    base = {} if ex["rope_base"] is None else {"rope_base": ex["rope_base"]}  # None: the default base
    layer = api.RopeAttention(d, ex["n_heads"], **base).to(device=device, dtype=ex["dtype"])
    try:
        load_linears(layer, {name: (d, d) for name in ("wq", "wk", "wv", "wo")}, ex["seed"], "RopeAttention")
    except Failure as failure:  # say which layer sizes were asked for
        raise Failure(f"RopeAttention(d_model={d}, n_heads={ex['n_heads']}): {failure.message}",
                      failure.observed) from None
    return layer


def _chunked(api, ctx, ex):
    x = envelope.tensor(ex, ex["seed"] + 7, ex["batch"], sum(ex["lengths"]), ex["d_model"], device=ctx.device)
    return chunks_and_whole(_layer(api, ex, ctx.device), ctx, x, ex["lengths"])


@CHECKS.add("RopeAttention prefill: causal attention with RoPE from position 0", uses="RopeAttention.forward")
def rope_prefill(ctx):
    ctx.forall(rope_run(), lambda c, ex: c.differential(
        {**ex, "lengths": ex["lengths"][:1]}, lambda api, e: _chunked(api, c, e), "prefill: layer(x) with cache=None"),
        max_examples=8)


@CHECKS.add("RopeAttention over chunks and decode steps equals the uncached forward", uses="RopeAttention.forward")
def rope_chunked(ctx):
    # A 5-token prompt and 3 decode steps: the cached run must match the uncached one.
    ctx.case({"batch": 1, "d_model": 8, "n_heads": 2, "rope_base": 10000.0, "lengths": [5, 1, 1, 1],
              "dtype": torch.float64, "seed": 5}, lambda c, ex: c.differential(
        ex, lambda api, e: _chunked(api, c, e), "prefill, then one-token steps that pass the returned cache back in"))
    ctx.forall(rope_run().filter(lambda e: len(e["lengths"]) > 1), lambda c, ex: c.differential(
        ex, lambda api, e: _chunked(api, c, e),
        "a prompt fed in chunks (chunked prefill), then one-token steps, each call passing the returned cache back in"),
        max_examples=15)

    def wide(c, ex):
        c.differential(ex, lambda api, e: _chunked(api, c, e),
                              "a prompt in chunks, then a decode step, with the default rope_base")
    base = {"batch": 2, "d_model": 16, "n_heads": 2, "rope_base": None, "lengths": [5, 2, 1], "dtype": torch.float32,
            "seed": 6}
    envelope.run(ctx, base, ("large", "half", "strided", "magnitude"), wide,
                 large={"batch": 1, "d_model": 64, "n_heads": 16, "lengths": [257, 1]})


@CHECKS.add("the cache stores keys rotated at their true positions", uses="RopeAttention.forward")
def rope_cache_keys(ctx):
    def body(c, ex):
        layer, x = _layer(c.t, ex, c.device), hidden_states(ex, c.device)
        _, cache = run_chunks(layer, c, x, ex["lengths"])
        B, S, H = ex["batch"], x.shape[1], ex["n_heads"]
        with torch.no_grad():
            k = (x @ layer.wk.weight.T).view(B, S, H, -1).transpose(1, 2)  # (B, H, S, D)
            v = (x @ layer.wv.weight.T).view(B, S, H, -1).transpose(1, 2)  # (B, H, S, D)
            expected = {"K": apply_rope(k, torch.arange(S, device=c.device), ex["rope_base"]), "V": v}
        problem = report.compare(expected, named(cache))
        if problem:
            c.fail(f"after the calls {ex['lengths']}, the returned cache should hold every key rotated at its "
                   f"true position 0 … {S - 1} (apply_rope of x @ wk.weight.T, per head) and the values unrotated\n  "
                   f"{problem}", ex, named(cache))

    # A prefill of 2 or more tokens tells "keys never rotated" apart from "keys rotated from 0 in each call".
    ctx.forall(rope_run(min_prefill=2).filter(lambda e: len(e["lengths"]) > 1), body, max_examples=10)


@CHECKS.add("RopeAttention rejects bad input with a ValueError", uses="RopeAttention.forward")
def rope_rejects_bad_input(ctx):
    def body(c, ex):
        layer, x = _layer(c.t, ex, c.device), hidden_states(ex, c.device)
        c.raises(ValueError, layer, x[0], what="forward with x missing the batch axis", example=ex)
        c.raises(ValueError, layer, torch.cat([x, x], -1), what="forward with x wider than d_model", example=ex)
        c.raises(ValueError, layer, x[..., :1], what="forward with x narrower than d_model", example=ex)
        expect_value_error(c, layer, x[None], what="forward with x carrying an extra axis", names=("x",), example=ex)
        expect_no_bias(c, layer, ex)
        try:  # the smallest layer is valid: one head of width 2
            c.t.RopeAttention(2, 1)
        except ValueError as exc:
            c.fail(f"RopeAttention(d_model=2, n_heads=1) raised ValueError({str(exc)!r}); one head of width 2 "
                   "is a valid layer", ex, ("rejected", "smallest"))

    ctx.forall(rope_run(), body, max_examples=2)


@CHECKS.add("position_ids is a LongTensor and causal_mask a BoolTensor, exact at any length", uses="position_ids")
def offsets_types(ctx):
    def body(c, ex):
        past, new = ex["past_len"], ex["new_len"]
        for name, want in (("position_ids", torch.long), ("causal_mask", torch.bool)):
            if name == "causal_mask" and past > 64:
                continue  # a mask that wide would only cost memory
            got = c.call(getattr(c.t, name), past, new)
            if not isinstance(got, torch.Tensor) or got.dtype != want:
                c.fail(f"{name}({past}, {new}) returned {report.describe(got)}; expected a tensor of dtype {want} "
                       f"({'index tensors are LongTensor' if want == torch.long else 'True = may attend'})", ex,
                       ("dtype", name, str(getattr(got, "dtype", type(got).__name__))))
        expected = torch.tensor([past + i for i in range(new)], dtype=torch.long)  # Python ints: exact
        got = c.call(c.t.position_ids, past, new).cpu()
        problem = report.compare(expected, got, f"position_ids({past}, {new})")
        if problem:
            c.fail(problem, ex, ("positions", got))  # the values: any wrong positions would fail alike

    for past, new in ((0, 0), (7, 0), (3, 1), (2**31 - 2, 4), (2**53 + 1, 2)):
        ctx.case({"past_len": past, "new_len": new}, body)


@CHECKS.add("RopeAttention keeps no position or cache of its own: two sequences through one layer",
            uses="RopeAttention.forward")
def rope_keeps_no_state(ctx):
    ctx.forall(rope_run().filter(lambda e: len(e["lengths"]) > 1), lambda c, ex: c.differential(
        ex, lambda api, e: two_sequences(_layer(api, e, c.device), c, e),
        "two sequences served by one layer, calls alternating, each passing its own cache back in "
        "(the past length comes from the cache, not from the layer)"), max_examples=3)


@CHECKS.add("RopeAttention rejects a bad cache passed back in, and bad sizes", uses="RopeAttention.forward")
def rope_rejects_bad_cache(ctx):
    def body(c, ex):
        layer, x = _layer(c.t, ex, c.device), hidden_states(ex, c.device)
        P = ex["lengths"][0]
        expect_bad_caches_refused(c, layer, x, P, ex)
        d, h = ex["d_model"], ex["n_heads"]
        for args in ((d, d + 1), (d, 0), (0, h), (2 * h, 2 * h)):  # the last: an odd head width of 1
            expect_value_error(c, c.t.RopeAttention, *args, what=f"RopeAttention(d_model={args[0]}, n_heads={args[1]})",
                               names=("d_model", "n_heads"), example=ex)
        for base in (0.0, -10000.0):
            expect_value_error_soon(c, lambda: c.t.RopeAttention(d, h, rope_base=base).to(ex["dtype"]), x[:, :P],
                                    what=f"RopeAttention(d_model={d}, n_heads={h}, rope_base={base})",
                                    names=("rope_base", "base"), example=ex)

    ctx.forall(rope_run().filter(lambda e: len(e["lengths"]) > 1), body, max_examples=2)


def _offset_call(ctx, name, past, new):
    return lambda api, ex: ctx.call(getattr(api, name), past, new, device=ctx.device)


@CHECKS.add("position_ids and causal_mask return the caller's tensors: no later call changes them, and changing "
            "them changes no later result", uses="causal_mask")
def offsets_are_the_callers(ctx):
    def body(c, ex):
        for name in ("position_ids", "causal_mask"):
            same = _offset_call(c, name, ex["past_len"], ex["new_len"])
            other = _offset_call(c, name, ex["past_len"] + 1, ex["new_len"])
            call = f"{name}({ex['past_len']}, {ex['new_len']})"
            c.differential(ex, protocol.twice(same, call), f"{call} twice")
            c.differential(ex, protocol.changed_by_caller(same, same, f"{call} again"),
                           f"{call}, the result overwritten by the caller, then {call} again (a memoized result?)")
            c.differential(ex, protocol.kept(same, other, f"the result of {call}", f"{name}({ex['past_len'] + 1}, "
                                             f"{ex['new_len']})"), f"{call}'s result held while the next call runs")

    ctx.case({"past_len": 3, "new_len": 4}, body)


def _device_scenario(s):
    api = s.ctx.t
    for name in ("position_ids", "causal_mask"):
        s.call(f"{name}(3, 2, device=<the test device>)", getattr(api, name), 3, 2, device=s.device)
    layer = devices.module_on(s, lambda: api.RopeAttention(8, 2))
    x = s.put(torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(2)))  # (B=1, T=6, d_model=8)
    _, cache = expect_pair(s.call("RopeAttention.forward(x), a prefill of 3 tokens", layer, x[:, :3]), "forward(x)")
    _, cache = expect_pair(s.call("RopeAttention.forward(x, cache), a chunk of 2 tokens", layer, x[:, 3:5], cache),
                           "forward(x, cache)")
    s.call("RopeAttention.forward(x, cache), a decode step", layer, x[:, 5:], cache)


@CHECKS.add("every function keeps the device it is given or the inputs' (no tensor made on the CPU by accident)",
            uses="position_ids")
def keeps_the_device(ctx):
    ctx.case({"past_len": 3, "new_len": 2, "d_model": 8, "n_heads": 2},
             lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))
