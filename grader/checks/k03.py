"""Hidden checks of kata 03 — grouped-query attention."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.engine import report
from grader.checks.support import devices, envelope, protocol
from grader.checks.support.common import (DTYPES, SEEDS, chunks, chunks_and_whole, count_rows,
                                          expect_bad_caches_refused, expect_pair, expect_value_error,
                                          expect_value_error_soon, hidden_states, load_linears, named, randn,
                                          run_chunks, two_sequences)
from grader.engine import Checks, Failure

CHECKS = Checks("03")


@st.composite
def kv_heads(draw):
    return {
        "batch": draw(st.integers(1, 2)),
        "n_kv_heads": draw(st.integers(1, 4)),
        "n_rep": draw(st.integers(1, 4)),
        "seq": draw(st.integers(1, 3)),
        "head_dim": draw(st.integers(1, 3)),
        "dtype": draw(DTYPES),
        "seed": draw(SEEDS),
    }


def _kv(ex, device):
    return randn(ex["seed"], ex["batch"], ex["n_kv_heads"], ex["seq"], ex["head_dim"], dtype=ex["dtype"], device=device)


@CHECKS.add("repeat_kv gives KV head h to query heads h*n_rep … h*n_rep + n_rep - 1", uses="repeat_kv")
def repeat_kv_interleaves(ctx):
    def pinned(c, ex):
        # Two KV heads holding 10 and 20, each serving a group of 3 query heads.
        x = torch.tensor([10.0, 20.0], dtype=torch.float64, device=c.device).view(1, 2, 1, 1)
        got = c.call(c.t.repeat_kv, x, 3)
        expected = torch.tensor([10.0, 10.0, 10.0, 20.0, 20.0, 20.0], dtype=torch.float64, device=c.device).view(1, 6, 1, 1)
        problem = report.compare(expected, got, "repeat_kv(x, 3) with x = [10, 20] on the head axis")
        if problem:
            c.fail(f"{problem}\n  query heads 0, 1, 2 share KV head 0 and query heads 3, 4, 5 share KV head 1", ex, got)

    ctx.case({"n_kv_heads": 2, "n_rep": 3, "values": [10, 20]}, pinned)
    ctx.forall(kv_heads(), lambda c, ex: c.differential(
        ex, lambda api, e: {f"repeat_kv(x, {e['n_rep']})": c.call(api.repeat_kv, _kv(e, c.device), e["n_rep"])},
        "repeat_kv(x, n_rep) with x of shape (batch, n_kv_heads, seq, head_dim)"), max_examples=20)

    def wide(c, ex):  # a repeat is a copy: exact in every dtype, for views too
        x = envelope.tensor(ex, ex["seed"], ex["batch"], ex["n_kv_heads"], ex["seq"], ex["head_dim"], device=c.device)
        c.differential(ex, lambda api, e: {f"repeat_kv(x, {e['n_rep']})": c.call(api.repeat_kv, x, e["n_rep"])},
                       "repeat_kv(x, n_rep) beyond the drawn inputs")
    envelope.run(ctx, REPEAT, ("large", "half", "strided"), wide, large={"n_kv_heads": 4, "n_rep": 4, "seq": 257})


REPEAT = {"batch": 2, "n_kv_heads": 2, "n_rep": 3, "seq": 5, "head_dim": 4, "dtype": torch.float32, "seed": 8}


@CHECKS.add("repeat_kv returns the caller's tensor: no later call changes it, and changing it changes no later "
            "repeat", uses="repeat_kv")
def repeat_kv_result_is_the_callers(ctx):
    def body(c, ex):
        x, other = _kv(ex, c.device), _kv({**ex, "seed": ex["seed"] + 1}, c.device)
        same = lambda api, e: c.call(api.repeat_kv, x, e["n_rep"])  # noqa: E731
        call = f"repeat_kv(x, {ex['n_rep']})"
        c.differential(ex, protocol.twice(same, call), f"{call} twice")
        c.differential(ex, protocol.changed_by_caller(same, same, f"{call} again"),
                       f"{call}, the result overwritten by the caller, then {call} again")
        c.differential(ex, protocol.kept(same, lambda api, e: c.call(api.repeat_kv, other, e["n_rep"]),
                                         f"the result of {call}", "repeat_kv of another x"),
                       f"{call}'s result held while the next call runs")

    # n_rep 2: a repeat of n_rep 1 may be x itself (nothing to copy), which the caller then owns already.
    ctx.case({"batch": 1, "n_kv_heads": 2, "n_rep": 2, "seq": 3, "head_dim": 4, "dtype": torch.float32, "seed": 3}, body)


@CHECKS.add("repeat_kv rejects bad input with a ValueError naming the argument", uses="repeat_kv")
def repeat_kv_rejects_bad_input(ctx):
    def body(c, ex):
        x = _kv(ex, c.device)
        for what, args, arg in (("x without a batch axis", (x[0], 2), "x"), ("n_rep = 0", (x, 0), "n_rep"),
                                ("n_rep = -1", (x, -1), "n_rep"), ("n_rep = 1.5", (x, 1.5), "n_rep"),
                                ("a 5-D x", (x[:, :, None], 2), "x"), ("x as nested lists", (x.tolist(), 2), "x"),
                                ("n_rep = '2'", (x, "2"), "n_rep")):
            expect_value_error(c, c.t.repeat_kv, *args, what=f"repeat_kv with {what}", names=(arg,), example=ex)

    ctx.forall(kv_heads(), body, max_examples=2)


@st.composite
def gqa_run(draw, min_rep: int = 1, explicit_head_dim: bool | None = None):
    n_kv, n_rep = draw(st.integers(1, 3)), draw(st.integers(min_rep, 3))  # n_rep 1 is MHA, n_kv 1 is MQA
    if explicit_head_dim is None:
        explicit_head_dim = draw(st.booleans())
    head_dim = draw(st.sampled_from([2, 4, 6])) if explicit_head_dim else None
    d_model = draw(st.sampled_from([4, 6, 8, 12])) if head_dim else n_kv * n_rep * draw(st.sampled_from([2, 4]))
    prefill, middle = draw(st.integers(1, 4)), draw(st.integers(0, 5))
    lengths = [prefill] + (chunks(middle, draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))) if middle else [])
    return {
        "batch": draw(st.integers(1, 2)),
        "d_model": d_model,
        "n_q_heads": n_kv * n_rep,
        "n_kv_heads": n_kv,
        "head_dim": head_dim,
        "rope_base": draw(st.sampled_from([10000.0, 100.0])),
        "lengths": lengths + [1] * draw(st.integers(0, 3)),
        "dtype": draw(DTYPES),
        "seed": draw(SEEDS),
    }


def _shapes(ex):
    d, hd = ex["d_model"], ex["head_dim"] or ex["d_model"] // ex["n_q_heads"]
    q, kv = ex["n_q_heads"] * hd, ex["n_kv_heads"] * hd
    return {"wq": (q, d), "wk": (kv, d), "wv": (kv, d), "wo": (d, q)}


def _layer(api, ex, device):
    extra = {} if ex["head_dim"] is None else {"head_dim": ex["head_dim"]}
    if ex["rope_base"] is not None:  # None: the default base
        extra["rope_base"] = ex["rope_base"]
    layer = api.GQAttention(ex["d_model"], ex["n_q_heads"], ex["n_kv_heads"], **extra)
    layer = layer.to(device=device, dtype=ex["dtype"])
    try:
        load_linears(layer, _shapes(ex), ex["seed"], "GQAttention")
    except Failure as failure:  # say which layer sizes were asked for
        extra = "" if ex["head_dim"] is None else f", head_dim={ex['head_dim']}"
        raise Failure(f"GQAttention(d_model={ex['d_model']}, n_q_heads={ex['n_q_heads']}, "
                      f"n_kv_heads={ex['n_kv_heads']}{extra}): {failure.message}\n  with head width D, wq is "
                      "(n_q_heads * D, d_model), wk and wv are (n_kv_heads * D, d_model), wo is (d_model, n_q_heads * D)",
                      failure.observed) from None
    return layer


def _chunked(api, ctx, ex):
    x = envelope.tensor(ex, ex["seed"] + 7, ex["batch"], sum(ex["lengths"]), ex["d_model"], device=ctx.device)
    return chunks_and_whole(_layer(api, ex, ctx.device), ctx, x, ex["lengths"])


@CHECKS.add("GQAttention declares wq, wk, wv, wo with the grouped-query shapes", uses="GQAttention")
def gqa_layer_shapes(ctx):
    def body(c, ex):
        layer = _layer(c.t, ex, c.device)  # fails with a clear message on a missing or misshapen layer
        biased = [name for name in ("wq", "wk", "wv", "wo") if getattr(layer, name).bias is not None]
        if biased:
            c.fail(f"{', '.join(biased)} {'has' if len(biased) == 1 else 'have'} a bias; the attention layers are "
                   "nn.Linear(..., bias=False)", ex, ("bias", tuple(biased)))

    ctx.forall(gqa_run(), body, max_examples=10)


@CHECKS.add("GQAttention rejects n_q_heads not divisible by n_kv_heads, naming n_kv_heads", uses="GQAttention")
def gqa_rejects_indivisible_heads(ctx):
    def body(c, ex):
        expect_value_error(c, c.t.GQAttention, ex["d_model"], ex["n_q_heads"], ex["n_kv_heads"],
                           what=f"GQAttention({ex['d_model']}, n_q_heads={ex['n_q_heads']}, n_kv_heads={ex['n_kv_heads']})",
                           names=("n_kv_heads",), example=ex)

    for n_q, n_kv in ((4, 3), (6, 4), (2, 4)):
        ctx.case({"d_model": 8 * n_q, "n_q_heads": n_q, "n_kv_heads": n_kv}, body)


@CHECKS.add("GQAttention prefill: causal attention over the prompt, MHA to MQA", uses="GQAttention.forward")
def gqa_prefill(ctx):
    ctx.forall(gqa_run(), lambda c, ex: c.differential(
        {**ex, "lengths": ex["lengths"][:1]}, lambda api, e: _chunked(api, c, e), "prefill: layer(x) with cache=None"),
        max_examples=10)


@CHECKS.add("GQAttention over chunks and decode steps equals the uncached forward", uses="GQAttention.forward")
def gqa_chunked(ctx):
    # The toy model: 4 query heads, 2 KV heads, head width 8; a 5-token prompt, then 3 decode steps.
    ctx.case({"batch": 1, "d_model": 32, "n_q_heads": 4, "n_kv_heads": 2, "head_dim": None, "rope_base": 10000.0,
              "lengths": [5, 1, 1, 1], "dtype": torch.float64, "seed": 3}, lambda c, ex: c.differential(
        ex, lambda api, e: _chunked(api, c, e), "prefill, then one-token steps that pass the returned cache back in"))
    ctx.forall(gqa_run().filter(lambda e: len(e["lengths"]) > 1), lambda c, ex: c.differential(
        ex, lambda api, e: _chunked(api, c, e),
        "a prompt fed in chunks, then one-token steps, each call passing the returned cache back in"), max_examples=15)
    # A head width that is not d_model // n_q_heads must be used everywhere it matters.
    ctx.forall(gqa_run(min_rep=2, explicit_head_dim=True).filter(lambda e: len(e["lengths"]) > 1),
               lambda c, ex: c.differential(ex, lambda api, e: _chunked(api, c, e),
                                            "the same, with head_dim given explicitly"), max_examples=5)

    def wide(c, ex):
        c.differential(ex, lambda api, e: _chunked(api, c, e),
                              "a prompt in chunks, then a decode step, with the default rope_base")
    base = {"batch": 2, "d_model": 16, "n_q_heads": 4, "n_kv_heads": 2, "head_dim": None, "rope_base": None,
            "lengths": [5, 2, 1], "dtype": torch.float32, "seed": 4}
    envelope.run(ctx, base, ("large", "half", "strided", "magnitude"), wide,
                 large={"batch": 1, "d_model": 64, "n_q_heads": 16, "n_kv_heads": 4, "lengths": [257, 1]})


@CHECKS.add("the cache holds n_kv_heads heads, not n_q_heads", uses="GQAttention.forward")
def gqa_cache_heads(ctx):
    def body(c, ex):
        layer, x = _layer(c.t, ex, c.device), hidden_states(ex, c.device)
        _, cache = run_chunks(layer, c, x, ex["lengths"])
        want = (ex["batch"], ex["n_kv_heads"], x.shape[1], ex["head_dim"] or ex["d_model"] // ex["n_q_heads"])
        pair = named(cache)
        if not isinstance(pair, dict):
            c.fail(f"forward returned {report.describe(cache)} as the cache, expected a pair (K, V)", ex,
                   ("cache", report.describe(cache)))
        for name, t in pair.items():
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else report.describe(t)
            if got != want:
                c.fail(f"after the calls {ex['lengths']} the cached {name} is {got}, expected {want} = (batch, "
                       f"n_kv_heads, seq, head_dim): store the n_kv_heads={ex['n_kv_heads']} KV heads and repeat them "
                       f"for the n_q_heads={ex['n_q_heads']} query heads only to compute attention", ex,
                       ("cache shape", name, got))

    ctx.forall(gqa_run(min_rep=2), body, max_examples=5)


@CHECKS.add("each call projects only its new tokens", uses="GQAttention.forward")
def gqa_projects_new_tokens(ctx):
    def body(c, ex):
        layer, x = _layer(c.t, ex, c.device), hidden_states(ex, c.device)
        cache, start = None, 0
        for n in ex["lengths"]:
            with count_rows(layer, ["wq", "wk", "wv"]) as rows:
                _, cache = layer(x[:, start:start + n], cache)
            extra = {name: r for name, r in rows.items() if r > ex["batch"] * n}
            if extra:
                call = "the prefill" if start == 0 else f"the call with {n} new token(s) after {start} cached"
                c.fail(f"{call} sent "
                       + ", ".join(f"{r} rows through {name}" for name, r in extra.items())
                       + f"; {n} new token(s) per sequence is {ex['batch'] * n} row(s). Project only the new tokens "
                       "and reuse the cached keys and values.", ex, ("rows", start, tuple(sorted(extra.items()))))
            start += n

    ctx.forall(gqa_run().filter(lambda e: len(e["lengths"]) > 1), body, max_examples=5)


@CHECKS.add("GQAttention rejects bad input with a ValueError", uses="GQAttention.forward")
def gqa_rejects_bad_input(ctx):
    def body(c, ex):
        layer, x = _layer(c.t, ex, c.device), hidden_states(ex, c.device)
        c.raises(ValueError, layer, x[0], what="forward with x missing the batch axis", example=ex)
        c.raises(ValueError, layer, torch.cat([x, x], -1), what="forward with x wider than d_model", example=ex)
        c.raises(ValueError, layer, x[..., :-1], what="forward with x narrower than d_model", example=ex)
        expect_value_error(c, layer, x[None], what="forward with x carrying an extra axis", names=("x",), example=ex)
        try:  # the smallest layer is valid: d_model 1, one head of width 2
            c.t.GQAttention(1, 1, 1, head_dim=2)
        except ValueError as exc:
            c.fail(f"GQAttention(d_model=1, n_q_heads=1, n_kv_heads=1, head_dim=2) raised ValueError({str(exc)!r}); "
                   "it is a valid layer", ex, ("rejected", "smallest"))

    ctx.forall(gqa_run(), body, max_examples=2)


@CHECKS.add("GQAttention keeps no position or cache of its own: two sequences through one layer",
            uses="GQAttention.forward")
def gqa_keeps_no_state(ctx):
    ctx.forall(gqa_run(min_rep=2).filter(lambda e: len(e["lengths"]) > 1), lambda c, ex: c.differential(
        ex, lambda api, e: two_sequences(_layer(api, e, c.device), c, e),
        "two sequences served by one layer, calls alternating, each passing its own cache back in "
        "(the past length comes from the cache, not from the layer)"), max_examples=3)


@CHECKS.add("GQAttention rejects a bad cache passed back in, and bad sizes", uses="GQAttention.forward")
def gqa_rejects_bad_cache(ctx):
    def body(c, ex):
        layer, x = _layer(c.t, ex, c.device), hidden_states(ex, c.device)
        P = ex["lengths"][0]
        expect_bad_caches_refused(c, layer, x, P, ex)
        d, n_q, n_kv = ex["d_model"], ex["n_q_heads"], ex["n_kv_heads"]
        width = {} if ex["head_dim"] is None else {"head_dim": ex["head_dim"]}  # so only one size is wrong
        sizes = [((d, 0, 1), width, ("n_q_heads",)), ((d, n_q, 0), width, ("n_kv_heads",)),
                 ((d, n_q, -n_kv), width, ("n_kv_heads",)), ((d, n_q, n_kv), {"head_dim": 3}, ("head_dim",)),
                 ((d, n_q, n_kv), {"head_dim": 0}, ("head_dim",)),
                 ((d, n_q, n_kv), {**width, "rope_base": 0.0}, ("rope_base", "base")),
                 ((0, n_q, n_kv), {}, ("d_model", "head_dim", "x"))]  # a zero-width layer: any x is wrong for it
        for args, kwargs, names in sizes:
            call = ", ".join([f"d_model={args[0]}", f"n_q_heads={args[1]}", f"n_kv_heads={args[2]}"]
                             + [f"{k}={v}" for k, v in kwargs.items()])
            expect_value_error_soon(c, lambda: c.t.GQAttention(*args, **kwargs).to(ex["dtype"]), x[:, :P],
                                    what=f"GQAttention({call})", names=names, example=ex)

    ctx.forall(gqa_run(min_rep=2).filter(lambda e: len(e["lengths"]) > 1), body, max_examples=2)


def _device_scenario(s):
    api = s.ctx.t
    s.call("repeat_kv(x, 2)", api.repeat_kv, s.put(randn(3, 1, 2, 3, 4)), 2)
    layer = devices.module_on(s, lambda: api.GQAttention(16, 4, 2))
    x = s.put(randn(4, 1, 4, 16, dtype=torch.float32))  # (B=1, T=4, d_model=16)
    _, cache = expect_pair(s.call("GQAttention.forward(x), a prefill of 3 tokens", layer, x[:, :3]), "forward(x)")
    s.call("GQAttention.forward(x, cache), a decode step", layer, x[:, 3:], cache)


@CHECKS.add("every function keeps the inputs' device (no tensor made on the CPU by accident)", uses="repeat_kv")
def keeps_the_device(ctx):
    ctx.case({"n_rep": 2, "d_model": 16, "n_q_heads": 4, "n_kv_heads": 2},
             lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))
