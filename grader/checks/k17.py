"""Hidden checks of kata 17 — the encoder–decoder cross-attention cache.

``EncoderDecoderKVCache`` runs drawn programs next to the reference (``k17_programs``), its whole state
compared after every call, lengths and bytes included: an appended or cropped cross part leaves attention
outputs unchanged, so only those show it. ``CrossAttention`` gets seeded weights and is compared with the
reference over chunkings of decoder tokens and padded sources, while hooks count the rows through ``wk`` and
``wv``. ``generate_seq2seq`` drives a tiny float64 encoder–decoder whose spies read every call
(``k17_runs``); each row is judged against its source decoded alone.
"""
from __future__ import annotations

import torch

from grader.checks.support import devices, envelope, protocol
from grader.checks.support.common import expect_no_bias, expect_value_error, expect_value_error_soon, randn
from grader.checks.k17_inputs import (bad_forward_calls, bad_generate_calls, bad_sizes, cross_projections,
                                      device_scenario, fed_to_the_encoder, model_for, truth_tokens)
from grader.checks.k17_programs import (bad_calls, cache_step, empty_reorder, new_cache, only_cross, programs,
                                        run_program)
from grader.checks.k17_runs import (Counting, attention_examples, attention_run, build_layer, counted, generate,
                                    projection_rows, runs, spy_model, tokens_of, verify)
from grader.engine import Checks

CHECKS = Checks("17")


# -- EncoderDecoderKVCache --------------------------------------------------------------------------------
@CHECKS.add("EncoderDecoderKVCache: updates, set_cross, crops, reorders and resets match the reference, lengths "
            "and bytes included", uses="EncoderDecoderKVCache")
def cache_matches_the_reference(ctx):
    def body(c, ex):
        c.differential({**ex, "device": c.device}, run_program, "the cache's results and state after every call")

    base = {"layers": 2, "batch": 2, "heads": 2, "head_dim": 4, "dtype": torch.float64, "seed": 1,
            "ops": [("update", 3), ("cross", 0, 5), ("cross", 1, 5), ("update", 1), ("crop", 2), ("update", 1),
                    ("reorder", [1, 1, 0]), ("update", 2), ("reset",), ("cross", 1, 4), ("update", 1)]}
    ctx.case(base, body)
    # one layer's cross part set, the other's not; crop(seq_len()) and crop(0); a reorder that drops a row
    ctx.case({**base, "seed": 2, "ops": [("cross", 0, 3), ("update", 2), ("crop", 2), ("reorder", [1]),
                                         ("update", 1), ("crop", 0), ("cross", 1, 3), ("update", 1)]}, body)
    # only cross parts, then reordered (the batch is theirs); reset into another batch; crop(0) then update
    ctx.case({**base, "seed": 3, "ops": [("cross", 0, 4), ("reorder", [1, 1, 0]), ("cross", 1, 2), ("update", 2),
                                         ("reset", 1), ("update", 1), ("crop", 0), ("update", 2), ("reset", 3),
                                         ("cross", 0, 2), ("update", 1)]}, body)
    ctx.forall(programs(), body, max_examples=15)
    envelope.run(ctx, base, ("large", "half", "strided"), body,
                 large={"heads": 16, "ops": [("cross", 0, 300), ("cross", 1, 300), ("update", 257), ("update", 1),
                                             ("crop", 200), ("reorder", [1, 0]), ("update", 60)]})


@CHECKS.add("EncoderDecoderKVCache: bad layers, shapes, batches, crop lengths and indices raise ValueError naming "
            "them, changing nothing", uses="EncoderDecoderKVCache")
def cache_rejects_bad_input(ctx):
    def body(c, ex):
        cache = c.t.EncoderDecoderKVCache()
        k = randn(ex["seed"], 1, 2, 3, 4, device=c.device)  # (B=1, Hkv=2, T=3, D=4)
        kc = randn(ex["seed"] + 1, 1, 2, 5, 4, device=c.device)  # 5 encoder frames
        for layer in range(2):
            cache.update(layer, k, k.clone())
        cache.set_cross(0, kc, kc.clone())
        want = (3, 3, 0, 5, 0, 2 * 2 * 2 * 4 * 8 * 3 + 2 * 2 * 5 * 4 * 8)
        for what, call, names in bad_calls(cache, k, kc, randn(ex["seed"] + 2, 2, 3, 3, 8, device=c.device)):
            expect_value_error(c, call, what=what, names=names, example=ex)
            held = (cache.seq_len(0), cache.seq_len(1), cache.seq_len(2), cache.cross_len(0), cache.cross_len(1),
                    cache.nbytes())
            if held != want:
                c.fail(f"after the refused {what}, (seq_len(0), seq_len(1), seq_len(2), cross_len(0), cross_len(1), "
                       f"nbytes()) = {held} instead of {want}: check the input before changing anything",
                       ex, ("changed", what))

    ctx.case({"seed": 0}, body)
    ctx.case({"seed": 1, "case": "a cache holding only a cross part"}, only_cross)
    ctx.case({"seed": 2, "case": "reorder of a cache that holds nothing"}, empty_reorder)


@CHECKS.add("two EncoderDecoderKVCache instances driven in turn behave as each alone (no shared storage)",
            uses="EncoderDecoderKVCache")
def caches_are_apart(ctx):
    def body(c, ex):
        run_both = protocol.interleaved(new_cache, cache_step, steps=4)
        c.differential(ex, lambda api, e: run_both(api, {**e, "device": c.device}),
                       "two caches A and B, each updated, set, cropped and reordered in turn")

    ctx.case({"seed": 4}, body)


# -- CrossAttention ------------------------------------------------------------------------------------
@CHECKS.add("CrossAttention: outputs match the reference over chunks of decoder tokens, padded frames hidden, "
            "K and V from the encoder output", uses="CrossAttention")
def cross_attention_matches_the_reference(ctx):
    def body(c, ex):
        c.differential({**ex, "device": c.device}, attention_run, "one layer over chunks of decoder tokens")

    base = {"batch": 2, "heads": 4, "kv_heads": 2, "head_dim": 4, "src": 6, "lengths": [3, 1, 2], "layer": 1,
            "mask": True, "pads": [0, 2], "dtype": torch.float64, "seed": 3}
    ctx.case(base, body)
    ctx.case({**base, "kv_heads": None, "mask": False, "lengths": [1, 1], "layer": 0, "seed": 5}, body)
    ctx.case({**base, "layer": None, "seed": 6}, body)  # layer not given: forward's default, 0
    ctx.forall(attention_examples(), body, max_examples=12)
    envelope.run(ctx, base, ("large", "half", "strided", "magnitude"), body,
                 large={"heads": 16, "kv_heads": 4, "src": 300, "pads": [0, 37], "lengths": [5, 1]})


@CHECKS.add("CrossAttention: wk and wv run once per request, on the encoder output; never again while the cache "
            "holds them", uses="CrossAttention")
def cross_projected_once(ctx):
    def body(c, ex):
        c.differential({**ex, "device": c.device}, projection_rows,
                       "rows (tokens x batch) through wq, wk, wv and wo, counted by forward hooks")

    ctx.case({"batch": 2, "heads": 4, "kv_heads": 2, "head_dim": 4, "src": 5, "lengths": [2, 1, 1], "layer": 0,
              "mask": True, "pads": [1, 0], "dtype": torch.float64, "seed": 6}, body)
    ctx.case({"batch": 1, "heads": 4, "kv_heads": None, "head_dim": 2, "src": 3, "lengths": [1, 1, 1, 1],
              "layer": 2, "mask": False, "pads": [0], "dtype": torch.float64, "seed": 7}, body)


@CHECKS.add("CrossAttention: wq, wk, wv, wo without bias; bad sizes, inputs and masks raise ValueError naming them",
            uses="CrossAttention")
def cross_attention_rejects_bad_input(ctx):
    def body(c, ex):
        ok = build_layer(c.t, {"heads": 4, "kv_heads": 2, "head_dim": 4, "seed": 1, "dtype": torch.float64}, c.device)
        expect_no_bias(c, ok, ex)
        x = randn(1, 2, 3, 16, device=c.device)
        enc = randn(2, 2, 5, 16, device=c.device)
        for what, make, name in bad_sizes(c.t.CrossAttention):
            expect_value_error_soon(c, make, x, what, (name,), ex)
        mask = torch.ones(2, 5, dtype=torch.bool, device=c.device)
        for what, args, name in bad_forward_calls(x, enc, mask):
            expect_value_error(c, ok, *args, what=f"forward with {what}", names=(name,), example=ex)
        for what, args in (("CrossAttention(16, 16, 1) (one head of width 1 per query, MQA)", (16, 16, 1)),
                           ("CrossAttention(4, 1)", (4, 1))):
            layer = c.t.CrossAttention(*args).to(device=c.device, dtype=torch.float64)
            out = layer(randn(3, 1, 2, args[0], device=c.device), randn(4, 1, 1, args[0], device=c.device))
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, 2, args[0]):
                c.fail(f"{what} on x (1, 2, {args[0]}) and a one-frame encoder_out returned "
                       f"{getattr(out, 'shape', out)}; expected (1, 2, {args[0]})", ex, ("boundary", what))

    ctx.case({"seed": 0}, body)


# -- generate_seq2seq -------------------------------------------------------------------------------------
@CHECKS.add("generate_seq2seq: each row equals its source decoded alone, without padding or cache",
            uses="generate_seq2seq")
def rows_equal_each_source_alone(ctx):
    def body(c, ex):
        _, tokens = generate(c, ex)
        verify(c, ex, tokens)

    ctx.case({"sources": [[5, 6, 7, 8, 9], [1, 2], [3]], "max_new_tokens": 8, "start": 1, "seed": 3}, body)
    ctx.case({"sources": [[0, 47, 10], [47]], "max_new_tokens": 6, "start": 0, "seed": 9}, body)  # ids 0 and 47
    ctx.forall(runs(), body, max_examples=8)
    # a 300-frame source next to a 4-frame one, 16 query heads over 4 KV heads
    ctx.case({"sources": [[(7 * i) % 48 for i in range(300)], [4, 3, 2, 1]], "max_new_tokens": 3, "start": 2,
              "seed": 11, "model": {"hidden_size": 64, "num_attention_heads": 16, "num_key_value_heads": 4}}, body)


@CHECKS.add("generate_seq2seq: the encoder runs once; each layer's wk and wv once, on the padded encoder output",
            uses="generate_seq2seq")
def encoder_and_projections_run_once(ctx):
    def body(c, ex):
        model = spy_model(c, ex)
        B, width = len(ex["sources"]), max(len(s) for s in ex["sources"])
        with cross_projections(model) as counted_rows:
            generate(c, ex, model)
            rows = [dict(r) for r in counted_rows]
        if len(model.encodes) != 1:
            c.fail(f"model.encode ran {len(model.encodes)} times for one call; the encoder output does not change "
                   "while the decoder generates, so it runs once", ex, ("encodes", len(model.encodes)))
        fed_to_the_encoder(c, ex, model.encodes[0])
        for layer, seen in enumerate(rows):
            if seen["wk"] != B * width or seen["wv"] != B * width:
                c.fail(f"decoder layer {layer}'s cross-attention wk and wv took {seen['wk']} and {seen['wv']} rows "
                       f"over {len(model.decodes)} decode calls; projecting the encoder output once is "
                       f"{B} x {width} = {B * width} rows each: K and V are projected on the first call and read "
                       "from the cache afterwards", ex, ("projected rows", layer, seen["wk"], seen["wv"]))

    ctx.case({"sources": [[5, 6, 7, 8, 9], [1, 2]], "max_new_tokens": 5, "start": 1, "seed": 3}, body)
    ctx.case({"sources": [[5, 6, 7], [1], [8, 9]], "max_new_tokens": 3, "start": 2, "pad": 47, "seed": 5}, body)
    ctx.forall(runs(max_new=(2, 6)), body, max_examples=3)


@CHECKS.add("generate_seq2seq: one token per row per step at the step's position; the cache's self part grows "
            "by one, its cross part stays the source's length", uses="generate_seq2seq")
def decoder_steps_and_cache_lengths(ctx):
    def body(c, ex):
        model, tokens = generate(c, ex)
        B, width, L = len(ex["sources"]), max(len(s) for s in ex["sources"]), model.config.num_hidden_layers
        per = 2 * 8 * model.config.num_key_value_heads * model.config.head_dim * L * B  # bytes per cached position
        steps = max(len(r) for r in tokens)
        if len(model.decodes) != steps:
            c.fail(f"model.decode ran {len(model.decodes)} times for rows of at most {steps} tokens: one call per "
                   "step, none after every row is done", ex, ("decodes", len(model.decodes), steps))
        for s, call in enumerate(model.decodes):
            want = {"ids": (B, 1), "positions": [[s]] * B, "seq_len": [s + 1] * L, "cross_len": [width] * L,
                    "nbytes": per * (s + 1 + width)}
            got = {"ids": tuple(call["ids"].shape), "positions": call["positions"].tolist()}
            if call["cache"] is not None:
                got.update(seq_len=call["cache"][0], cross_len=call["cache"][1], nbytes=call["cache"][2])
            bad = [key for key in want if got.get(key) != want[key]]
            if bad:
                c.fail(f"decode call {s + 1}: {bad[0]} is {got.get(bad[0], 'not known (no cache given)')}, expected "
                       f"{want[bad[0]]} (all rows start together: the start token at position 0, then one token a "
                       f"step; each layer's cross part holds the {width} padded frames once, in float64 "
                       f"{per} bytes per cached position)", ex, ("step", s, bad[0], str(got.get(bad[0]))))

    ctx.case({"sources": [[5, 6, 7, 8, 9], [1, 2], [3]], "max_new_tokens": 6, "start": 1, "seed": 3}, body)
    ctx.forall(runs(max_new=(1, 6)), body, max_examples=3)


@CHECKS.add("generate_seq2seq: a row stops after its EOS (kept, any id, 0 included); the loop stops when every row "
            "is done", uses="generate_seq2seq")
def eos_stops_and_is_kept(ctx):
    def with_eos(c, ex):
        truth = truth_tokens(c, ex)
        eos = next((t for r in truth for i, t in enumerate(r) if i >= 1 and t not in r[:i]), truth[0][-1])
        _, tokens = generate(c, ex, eos=eos)
        verify(c, ex, tokens, eos=eos)

    def counting(c, ex):
        model = Counting(ex["vocab"], c.device)
        _, tokens = generate(c, ex, model)
        want = counted(ex["sources"], ex["start"], ex["max_new_tokens"], ex["vocab"], ex.get("eos"))
        if tokens != want:
            c.fail(f"with a model that continues token t with t + len(source) mod {ex['vocab']} and EOS "
                   f"{ex.get('eos')}, expected {want}, got {tokens}", ex, ("tokens", str(tokens)))
        steps = max(len(r) for r in want)
        if model.encodes != 1 or model.decodes != steps:
            c.fail(f"expected 1 encode and {steps} decode calls, saw {model.encodes} and {model.decodes}", ex,
                   ("calls", model.encodes, model.decodes))

    ctx.case({"sources": [[5, 6, 7], [1, 2], [3, 4, 5, 6, 7]], "max_new_tokens": 10, "start": 1, "seed": 4}, with_eos)
    # EOS 0: the rows reach it at different steps (3 + 1·len, …), one never does
    ctx.case({"sources": [[1, 2, 3, 4], [5, 6], [7, 8, 9]], "max_new_tokens": 7, "start": 12, "eos": 0,
              "vocab": 16}, counting)
    ctx.case({"sources": [[1, 2, 3, 4], [9]], "max_new_tokens": 9, "start": 0, "eos": 4, "pad": 15,
              "vocab": 16}, counting)


@CHECKS.add("generate_seq2seq: max_new_tokens 0 gives empty rows without running the model; one-frame sources",
            uses="generate_seq2seq")
def edge_budgets(ctx):
    def body(c, ex):
        if ex["max_new_tokens"] == 0:
            model = Counting(16, c.device)
            _, tokens = generate(c, ex, model)
            if tokens != [[] for _ in ex["sources"]] or model.encodes or model.decodes:
                c.fail(f"max_new_tokens = 0 should give {[[] for _ in ex['sources']]} without calling the model; got "
                       f"{tokens} after {model.encodes} encode and {model.decodes} decode calls", ex,
                       ("zero", str(tokens), model.encodes, model.decodes))
            return
        _, tokens = generate(c, ex)
        verify(c, ex, tokens)

    ctx.case({"sources": [[3], [1, 2]], "max_new_tokens": 0, "start": 1}, body)
    ctx.case({"sources": [[3], [40]], "max_new_tokens": 1, "start": 5, "seed": 2}, body)
    ctx.case({"sources": [[0]], "max_new_tokens": 4, "start": 47, "seed": 5}, body)


@CHECKS.add("generate_seq2seq: two logits 1e-8 apart in a float64 model: the larger wins", uses="generate_seq2seq")
def near_ties_read_in_the_models_dtype(ctx):
    def body(c, ex):
        model = Counting(ex["vocab"], c.device, gap=1e-8)
        _, tokens = generate(c, ex, model)
        want = counted(ex["sources"], ex["start"], ex["max_new_tokens"], ex["vocab"])
        if tokens != want:
            c.fail(f"the chosen token beats the id just below it by 1e-8 in float64; expected {want}, got {tokens}: "
                   "read the argmax from the logits in the model's dtype (a cast to float32 merges them)",
                   ex, ("near tie", str(tokens)))

    ctx.case({"sources": [[1, 2, 3], [4, 5]], "max_new_tokens": 5, "start": 2, "vocab": 48}, body)


@CHECKS.add("generate_seq2seq: bad sources, budgets and token ids raise ValueError naming them",
            uses="generate_seq2seq")
def rejects_bad_input(ctx):
    def body(c, ex):
        model = Counting(16, c.device)
        good = {"decoder_start_token_id": 1}
        for what, args, kwargs, name in bad_generate_calls(good):
            expect_value_error(c, c.t.generate_seq2seq, model, *args, what=f"generate_seq2seq with {what}",
                               names=(name,), example=ex, **kwargs)
        for what, kwargs in (("decoder_start_token_id = 15 (the last id)", {"decoder_start_token_id": 15}),
                             ("pad_token_id = 15 and eos_token_id = 0", {**good, "pad_token_id": 15,
                                                                         "eos_token_id": 0})):
            tokens_of(c, c.t.generate_seq2seq(model, [[15], [1, 2]], 2, **kwargs), {"sources": [[15], [1, 2]]})

    ctx.case({"seed": 0}, body)


@CHECKS.add("generate_seq2seq: the returned lists are the caller's; kept or overwritten, they change nothing",
            uses="generate_seq2seq")
def results_are_the_callers(ctx):
    def body(c, ex):
        def call(sources):
            def run(api, e):
                model = model_for(api, e, c.device)
                return api.generate_seq2seq(model, sources, e["max_new_tokens"], decoder_start_token_id=e["start"])
            return run

        first, other = call([[5, 6, 7], [1]]), call([[9, 8], [2, 3, 4]])
        for what, program in (("the tokens of one call, held while a call on other sources runs",
                               protocol.kept(first, other, "the tokens of the first call", "a second call")),
                              ("the caller overwrites the tokens of one call, then makes the same call again",
                               protocol.changed_by_caller(first, first, "the same call")),
                              ("the same call twice", protocol.twice(other))):
            c.differential(ex, program, what)

    ctx.case({"max_new_tokens": 4, "start": 1, "seed": 8}, body)


@CHECKS.add("the cache, CrossAttention and generate_seq2seq keep every tensor on the inputs' device",
            uses="EncoderDecoderKVCache")
def keeps_the_device(ctx):
    ctx.case({"sources": [[5, 9, 2], [3]], "max_new_tokens": 3},
             lambda c, ex: devices.keeps_the_device(c, ex, device_scenario))

