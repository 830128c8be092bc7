"""Hidden checks of kata 19 — multi-head latent attention.

The formulas are compared with the reference on drawn sizes and DeepSeek's pinned ones. ``LatentKVCache``
runs drawn update programs next to the reference, every return, length and byte count compared, and the
storage it holds is weighed. ``MLAttention`` gets seeded weights by transformers' names and is driven over
chunkings, each call naive or absorbed, through the checks' own cache that notes what reaches ``update``
(``k19_runs``); hooks count the rows through ``kv_b_proj`` and a FLOP counter the matrix products of an
absorbed decode step.
"""
from __future__ import annotations

import torch

from grader.checks.k19_inputs import (CACHE, DEEPSEEK, LAYER, bad_cache_calls, bad_forward_calls, bad_sizes,
                                      bytes_held, cache_programs, device_scenario, flops_sizes, formula_sizes,
                                      run_program)
from grader.checks.k19_runs import (Recorder, build, call_options, chunked, flops_of, inputs, layers, own_tensors,
                                    projection_flops, spans)
from grader.checks.support import devices, envelope
from grader.checks.support.common import count_rows, expect_value_error, randn
from grader.engine import Checks

CHECKS = Checks("19")


# -- the formulas -------------------------------------------------------------------------------------------
@CHECKS.add("mla_cache_bytes and gqa_groups: DeepSeek's numbers and drawn sizes", uses="mla_cache_bytes")
def formulas(ctx):
    def pinned(c, ex):
        c.differential(ex, lambda api, e: {
            "mla_cache_bytes(60, 1, 512, 64, 1) (DeepSeek-V2, elements a token)": c.call(api.mla_cache_bytes, 60, 1, 512, 64, 1),
            "mla_cache_bytes(60, 1, 512, 64, 0.75) (6-bit elements)": c.call(api.mla_cache_bytes, 60, 1, 512, 64, 0.75),
            "mla_cache_bytes(61, 131072, 512, 64) (DeepSeek-V3, 128k tokens, bf16)": c.call(api.mla_cache_bytes, 61, 131072, 512, 64),
            "gqa_groups(512, 64, 128)": c.call(api.gqa_groups, 512, 64, 128)}, "DeepSeek's sizes")

    ctx.case(DEEPSEEK, pinned)
    ctx.forall(formula_sizes(), lambda c, ex: c.differential(ex, lambda api, e: {
        f"mla_cache_bytes({e['layers']}, {e['seq']}, {e['rank']}, {e['rope']}, {e['bytes']}, {e['batch']})":
            c.call(api.mla_cache_bytes, e["layers"], e["seq"], e["rank"], e["rope"], e["bytes"], e["batch"]),
        f"mla_cache_bytes({e['layers']}, {e['seq']}, {e['rank']}, {e['rope']}) (the defaults)":
            c.call(api.mla_cache_bytes, e["layers"], e["seq"], e["rank"], e["rope"]),
        f"gqa_groups({e['rank']}, {e['rope']}, {e['head_dim']})": c.call(api.gqa_groups, e["rank"], e["rope"], e["head_dim"])},
        "the latent cache's bytes and its GQA equivalent"), max_examples=15)


@CHECKS.add("mla_cache_bytes and gqa_groups reject bad sizes with a ValueError naming them", uses="mla_cache_bytes")
def formulas_reject_bad_input(ctx):
    def body(c, ex):
        good = {"n_layers": 2, "seq_len": 3, "kv_lora_rank": 4, "qk_rope_dim": 2, "dtype_bytes": 2, "batch": 1}
        for name, bad in (("n_layers", 0), ("seq_len", -1), ("kv_lora_rank", 0), ("qk_rope_dim", 0),
                          ("dtype_bytes", 0), ("dtype_bytes", "2"), ("batch", 0), ("n_layers", 2.5), ("batch", True)):
            expect_value_error(c, c.t.mla_cache_bytes, **{**good, name: bad}, what=f"mla_cache_bytes with {name}={bad!r}",
                               names=(name,), example=ex)
        for name, bad in (("kv_lora_rank", 0), ("qk_rope_dim", -2), ("head_dim", 0), ("head_dim", 1.5)):
            args = {"kv_lora_rank": 512, "qk_rope_dim": 64, "head_dim": 128, name: bad}
            expect_value_error(c, c.t.gqa_groups, **args, what=f"gqa_groups with {name}={bad!r}", names=(name,), example=ex)
        c.differential(ex, lambda api, e: {"mla_cache_bytes(1, 0, 4, 2)": c.call(api.mla_cache_bytes, 1, 0, 4, 2)},
                       "an empty cache (seq_len 0) is 0 bytes, not an error")

    ctx.case({"sizes": "bad"}, body)


@CHECKS.add("decode_flops counts each path's matrix products: DeepSeek-V3's numbers and drawn sizes",
            uses="decode_flops")
def decode_flops_counts(ctx):
    def run(api, e):
        args = (e["seq"], e["heads"], e["rank"], e["nope"], e["rope"], e["v"])
        return {f"decode_flops{args}, absorbed={flag}": ctx.call(api.decode_flops, *args, absorbed=flag) for flag in (False, True)}

    for seq in (1024, 4096):
        ctx.case({"seq": seq, "heads": 128, "rank": 512, "nope": 128, "rope": 64, "v": 128},
                 lambda c, ex: c.differential(ex, run, "DeepSeek-V3's attention shapes"))
    ctx.forall(flops_sizes(), lambda c, ex: c.differential(ex, run, "drawn sizes (N, R, V and C all different)"),
               max_examples=15)

    def bad(c, ex):
        good = {"seq_len": 8, "n_heads": 2, "kv_lora_rank": 4, "qk_nope_dim": 2, "qk_rope_dim": 2, "v_head_dim": 3}
        for name, value in (("seq_len", 0), ("n_heads", 0), ("kv_lora_rank", -1), ("qk_nope_dim", 0),
                            ("qk_rope_dim", 0), ("v_head_dim", 0), ("n_heads", 2.0), ("absorbed", 1), ("absorbed", None)):
            args = {**good, "absorbed": True, name: value}
            expect_value_error(c, c.t.decode_flops, **args, what=f"decode_flops with {name}={value!r}", names=(name,),
                               example=ex)

    ctx.case({"sizes": "bad"}, bad)


# -- LatentKVCache ------------------------------------------------------------------------------------------
@CHECKS.add("LatentKVCache: updates over layers return every token held; seq_len and nbytes match the reference",
            uses="LatentKVCache")
def cache_matches_the_reference(ctx):
    ctx.forall(cache_programs(), lambda c, ex: c.differential(ex, lambda api, e: run_program(api, c, e),
                                                              "update, seq_len and nbytes after each call"), max_examples=15)
    envelope.run(ctx, CACHE, ("large", "half", "strided"), lambda c, ex: c.differential(
        ex, lambda api, e: run_program(api, c, e), "beyond the drawn inputs"), large={"updates": [(0, 300), (0, 1), (2, 257)], "rank": 64})


@CHECKS.add("LatentKVCache holds one latent and one rotary key a token: the bytes of mla_cache_bytes, no head "
            "axis, no second copy, nothing the caller can change", uses="LatentKVCache")
def cache_holds_the_latent_only(ctx):
    ctx.forall(cache_programs(), bytes_held, max_examples=8)


@CHECKS.add("LatentKVCache rejects bad updates with a ValueError naming the argument", uses="LatentKVCache")
def cache_rejects_bad_input(ctx):
    def body(c, ex):
        for what, program, names in bad_cache_calls(ex, c.device):
            cache = c.t.LatentKVCache()
            *first, last = program
            for args in first:
                c.call(cache.update, *args)
            expect_value_error(c, cache.update, *last, what=what, names=names, example=ex)

    ctx.case({**CACHE, "dtype": torch.float32}, body)


# -- split_kv_b ---------------------------------------------------------------------------------------------
@CHECKS.add("split_kv_b cuts kv_b_proj head by head into W_UK (H, N, C) and W_UV (H, V, C)", uses="split_kv_b")
def split_per_head(ctx):
    def run(api, e):
        rows = e["heads"] * (e["nope"] + e["v"])
        w = envelope.tensor(e, e["seed"], rows, e["rank"], device=ctx.device)
        return {f"split_kv_b(weight {tuple(w.shape)}, {e['heads']}, {e['nope']}, {e['v']})":
                ctx.call(api.split_kv_b, w, e["heads"], e["nope"], e["v"])}

    base = {"heads": 3, "nope": 2, "v": 3, "rank": 4, "dtype": torch.float64, "seed": 1}
    ctx.case({**base, "values": "row numbers"}, lambda c, ex: c.differential(ex, lambda api, e: {
        "split_kv_b(arange(15 * 4).view(15, 4), 3, 2, 3)": c.call(
            api.split_kv_b, torch.arange(60, dtype=torch.float64, device=c.device).view(15, 4), 3, 2, 3)},
        "rows numbered: head h's W_UK is rows 5h, 5h+1 and its W_UV rows 5h+2 … 5h+4"))
    ctx.forall(flops_sizes(tensors=True), lambda c, ex: c.differential(ex, run, "drawn sizes"), max_examples=10)
    envelope.run(ctx, base, ("half", "strided"), lambda c, ex: c.differential(ex, run, "beyond the drawn inputs"))

    def bad(c, ex):
        w = randn(2, 15, 4, device=c.device)
        for what, args in (("a weight with one row too many", (torch.cat([w, w[:1]]), 3, 2, 3)),
                           ("a weight without H * (N + V) rows", (w, 3, 3, 3)), ("a 1-D weight", (w[0], 3, 2, 3)),
                           ("a 3-D weight with H * (N + V) rows", (w[..., None], 3, 2, 3)),
                           ("a weight as nested lists", (w.tolist(), 3, 2, 3))):
            expect_value_error(c, c.t.split_kv_b, *args, what=f"split_kv_b with {what}", names=("weight",), example=ex)
        for name, args in (("n_heads", (w, 0, 2, 3)), ("qk_nope_dim", (w, 3, 0, 5)), ("v_head_dim", (w, 3, 5, 0))):
            expect_value_error(c, c.t.split_kv_b, *args, what=f"split_kv_b with {name}=0", names=(name, "weight"),
                               example=ex)

    ctx.case({"weight": "bad"}, bad)


# -- MLAttention --------------------------------------------------------------------------------------------
@CHECKS.add("MLAttention declares transformers' parameters with the README's shapes, no bias, nothing else",
            uses="MLAttention")
def layer_parameters(ctx):
    ctx.forall(layers(), lambda c, ex: build(c.t, ex, c.device), max_examples=6)
    ctx.case({**LAYER, "q_rank": 6}, lambda c, ex: build(c.t, ex, c.device))


@CHECKS.add("naive and absorbed calls over chunks equal the uncached forward; the latent reaches the cache "
            "normalized and unrotated, the rotary key rotated in interleaved pairs", uses="MLAttention")
def layer_matches_the_reference(ctx):
    ctx.case(LAYER, lambda c, ex: c.differential(ex, lambda api, e: chunked(api, c, e), "a prefill, then steps"))
    ctx.forall(layers(), lambda c, ex: c.differential(ex, lambda api, e: chunked(api, c, e),
                                                      "drawn chunkings, each call naive or absorbed"), max_examples=20)
    large = {"heads": 16, "lengths": [262, 1, 1], "start": 300, "absorbed": [False, True, False]}
    envelope.run(ctx, LAYER, ("large", "half", "strided", "magnitude"), lambda c, ex: c.differential(
        ex, lambda api, e: chunked(api, c, e), "beyond the drawn inputs (large: positions past 256)"), large=large)


@CHECKS.add("kv_b_proj runs over every latent in naive calls and never in absorbed ones", uses="MLAttention.forward")
def kv_b_proj_rows(ctx):
    def body(c, ex):
        layer, (x, pos) = build(c.t, ex, c.device), inputs(ex, c.device)
        cache = Recorder()
        for (start, n), flag in zip(spans(ex["lengths"]), ex["absorbed"]):
            with count_rows(layer, ["kv_b_proj"]) as rows:
                c.call(layer, x[:, start:start + n], pos[:, start:start + n], cache, **call_options(ex["layer"], flag))
            want = 0 if flag else ex["batch"] * (start + n)
            if rows["kv_b_proj"] != want:
                why = ("absorbed calls read kv_b_proj.weight through split_kv_b and never run the layer" if flag else
                       "naive calls up-project every latent the cache returned")
                c.fail(f"the {'absorbed' if flag else 'naive'} call with {n} token(s) after {start} sent "
                       f"{rows['kv_b_proj']} rows through kv_b_proj, expected {want}: {why}", ex,
                       ("kv_b_proj rows", flag, rows["kv_b_proj"] > want))

    ctx.forall(layers(min_calls=2), body, max_examples=8)


@CHECKS.add("an absorbed decode step's matrix products cost no more than its projections plus decode_flops",
            uses="MLAttention.forward")
def absorbed_decode_flops(ctx):
    def body(c, ex):
        layer, (x, pos) = build(c.t, ex, c.device), inputs(ex, c.device)
        cache, S = Recorder(), ex["lengths"][0]
        c.call(layer, x[:, :S], pos[:, :S], cache, ex["layer"], absorbed=False)
        for step in range(S, S + 2):
            _, got = flops_of(c.call, layer, x[:, step:step + 1], pos[:, step:step + 1], cache, ex["layer"], absorbed=True)
            bound = ex["batch"] * (projection_flops(ex) + c.ref.decode_flops(
                step + 1, ex["heads"], ex["rank"], ex["nope"], ex["rope"], ex["v"], absorbed=True))
            if got > bound:
                c.fail(f"the absorbed decode step after {step} tokens ran matrix products of {got} FLOPs; at most "
                       f"{bound} (the new token's projections plus decode_flops(absorbed=True), times batch "
                       f"{ex['batch']}): fold W_UK into the query and apply W_UV once per head after the sum, "
                       "never to every cached latent", ex, ("flops", "over"))

    ctx.case({**LAYER, "lengths": [6, 1, 1]}, body)
    ctx.forall(layers(), lambda c, ex: body(c, {**ex, "lengths": [ex["lengths"][0] + 2, 1, 1]}), max_examples=6)


@CHECKS.add("MLAttention keeps no cache, position or tensor of its own: two sequences through one layer",
            uses="MLAttention.forward")
def layer_keeps_no_state(ctx):
    def body(c, ex):
        def two(api, e):
            layer = build(api, e, c.device)
            xa, pa = inputs(e, c.device)
            xb, pb = inputs({**e, "seed": e["seed"] + 5, "start": e["start"] + 2}, c.device)
            caches, seen = {"A": Recorder(), "B": Recorder()}, {}
            for (start, n), flag in zip(spans(e["lengths"]), e["absorbed"]):
                for name, x, p in (("A", xa, pa), ("B", xb, pb)):
                    seen[f"sequence {name}, {n} token(s) after {start}"] = c.call(
                        layer, x[:, start:start + n], p[:, start:start + n], caches[name], e["layer"], absorbed=flag)
            seen["tensors the layer keeps between calls"] = [name for name, _ in own_tensors(layer)]
            return seen

        c.differential(ex, two, "two sequences whose calls alternate, each with its own cache")

    ctx.forall(layers(min_calls=2), body, max_examples=4)


@CHECKS.add("MLAttention rejects bad input and bad sizes with a ValueError naming them", uses="MLAttention.forward")
def layer_rejects_bad_input(ctx):
    def body(c, ex):
        layer, (x, pos) = build(c.t, ex, c.device), inputs(ex, c.device)
        for what, args, names in bad_forward_calls(x, pos):
            expect_value_error(c, layer, *args, what=f"forward with {what}", names=names, example=ex)
        for what, build_bad, names in bad_sizes(c.t, ex):
            expect_value_error(c, build_bad, what=what, names=names, example=ex)
        try:  # the smallest layer is valid, and any positive base
            c.t.MLAttention(1, 1, 1, 1, 2, 1, q_lora_rank=1, rope_base=0.5)
        except ValueError as exc:
            c.fail(f"MLAttention(1, 1, 1, 1, 2, 1, q_lora_rank=1, rope_base=0.5) raised ValueError({str(exc)!r}); "
                   "it is a valid layer", ex, ("rejected", "smallest"))

    ctx.case(LAYER, body)


@CHECKS.add("every function keeps the inputs' device (no tensor made on the CPU by accident)", uses="MLAttention")
def keeps_the_device(ctx):
    ctx.case({**LAYER, "device": "stand-in"}, lambda c, ex: devices.keeps_the_device(c, ex, device_scenario))
