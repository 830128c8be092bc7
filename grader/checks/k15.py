"""Hidden checks of kata 15 — packed variable-length batches.

``cu_seqlens``, ``pack``, ``varlen_mask`` and ``varlen_attention`` are compared with the reference on
drawn mixed rows (prefill chunks next to single decode tokens, each sequence with its own past length);
``pack``'s ``Packed`` is read into a dict of its fields first (plain data). ``PackedKVCache`` runs drawn
programs of rows and frees next to the reference, with rows the grader builds. ``packed_generate``
drives a spied tiny Llama and its tokens are judged against plain greedy decoding of each prompt alone.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks import k15_rows as rows
from grader.checks.k15_bad import bad_attention, bad_cache, bad_generate, bad_pack, bad_mask
from grader.checks.k15_programs import cache_step, new_cache, programs, run_program
from grader.checks.k15_runs import run, row_problem, runs, verify
from grader.checks.support import devices, envelope, protocol
from grader.checks.support.common import randn
from grader.checks.support.models import DEVICE_MODEL, successor_model
from grader.engine import Checks
from grader.nn import Llama, LlamaConfig

CHECKS = Checks("15")

MIXED = {"lengths": [3, 1, 2], "past": [0, 3, 4], "seed": 3}  # the README's picture
ADJACENT = {"lengths": [1, 1, 1], "past": [3, 4, 5], "seed": 5}  # decode tokens at consecutive positions
LARGE = {"lengths": [150, 1, 140, 9], "past": [0, 300, 110, 0], "seed": 9}  # 300 tokens, positions past 256


# -- task 1: cu_seqlens and pack ------------------------------------------------------------------------------
@CHECKS.add("cu_seqlens: int32 offsets [0, l0, l0 + l1, ...] on the device asked for", uses="cu_seqlens")
def cu_seqlens_offsets(ctx):
    def body(c, ex):
        c.differential(ex, lambda api, e: api.cu_seqlens(list(e["lengths"]), device=c.device),
                       "cu_seqlens(lengths, device)")
        c.differential(ex, lambda api, e: api.cu_seqlens(tuple(e["lengths"])), "cu_seqlens(a tuple of lengths)")

    for lengths in ([1], [5], [3, 1, 2], [1, 1, 1, 1], [500, 5, 17]):
        ctx.case({"lengths": lengths}, body)
    ctx.forall(st.fixed_dictionaries({"lengths": st.lists(st.integers(1, 40), min_size=1, max_size=8)}), body,
               max_examples=10)


def _pack(api, ex, device):
    past = None if ex.get("no_past") else list(ex["past"])
    ids = ex.get("ids")
    return rows.fields(api.pack(rows.tokens(ex), past, None if ids is None else list(ids), device=device))


@CHECKS.add("pack: the row's ids, positions restarting at each past length, both cu_seqlens, exact maxima, ids",
            uses="pack")
def pack_builds_the_row(ctx):
    def body(c, ex):
        c.differential(ex, lambda api, e: _pack(api, e, c.device), "pack(seqs, past_lens, seq_ids, device)")

    ctx.case(MIXED, body)
    ctx.case(ADJACENT, body)
    ctx.case({**MIXED, "no_past": True}, body)  # past_lens left out: every sequence starts at 0
    ctx.case({"lengths": [4], "past": [0], "seed": 1}, body)  # one sequence: a plain causal row
    ctx.case({**MIXED, "ids": ("req-7", 12, "x")}, body)
    ctx.case(LARGE, body)
    ctx.forall(rows.rows(), body, max_examples=12)


@CHECKS.add("pack's result is the caller's: the same call twice, or after the caller overwrote the first, is equal",
            uses="pack")
def pack_results_are_the_callers(ctx):
    def body(c, ex):
        call = (lambda api, e: _pack(api, e, c.device))
        for what, program in (("the same pack twice", protocol.twice(call, "pack")),
                              ("pack again after the caller overwrote the first result",
                               protocol.changed_by_caller(call, call, "pack"))):
            c.differential(ex, program, what)

    ctx.case(MIXED, body)


@CHECKS.add("cu_seqlens and pack: bad lengths, sequences, past lengths and ids raise ValueError naming them",
            uses="pack")
def pack_rejects_bad_input(ctx):
    ctx.case({"seed": 0}, bad_pack)


# -- task 2: varlen_mask and varlen_attention ----------------------------------------------------------------
def _mask(api, ex, device, explicit):
    cu_q, cu_k = rows.cu(ex["lengths"], device), rows.cu(rows.key_lengths(ex), device)
    return api.varlen_mask(cu_q, cu_k, device=device) if explicit else api.varlen_mask(cu_q, cu_k)


@CHECKS.add("varlen_mask: block-diagonal, causal inside each block, aligned bottom-right", uses="varlen_mask")
def varlen_mask_blocks(ctx):
    def body(c, ex):
        c.differential(ex, lambda api, e: _mask(api, e, c.device, False), "varlen_mask(cu_seqlens_q, cu_seqlens_k)")
        c.differential(ex, lambda api, e: _mask(api, e, c.device, True), "varlen_mask(..., device=the inputs' device)")
        program = protocol.changed_by_caller(lambda api, e: _mask(api, e, c.device, False),
                                             lambda api, e: _mask(api, e, c.device, False), "varlen_mask")
        c.differential(ex, program, "varlen_mask again after the caller overwrote the first mask")

    for ex in (MIXED, ADJACENT, {"lengths": [4], "past": [0], "seed": 0}, {"lengths": [1, 1, 1, 1], "past": [0] * 4},
               {"lengths": [2, 3], "past": [0, 0]}, LARGE):
        ctx.case(ex, body)
    ctx.forall(rows.rows(), body, max_examples=12)


def _attend(api, ex, device):
    q, k, v = rows.qkv(ex, device)
    cu_q, cu_k = rows.cu(ex["lengths"], device), rows.cu(rows.key_lengths(ex), device)
    max_q, max_k = rows.maxima(ex)
    kwargs = {key: ex[key] for key in ("causal", "scale") if key in ex}
    return api.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)


@CHECKS.add("varlen_attention: each sequence attends to its own keys only, as it would alone (GQA, causal or not)",
            uses="varlen_attention")
def varlen_attention_per_sequence(ctx):
    def body(c, ex):
        c.differential(ex, lambda api, e: _attend(api, e, c.device),
                       "varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)")

    base = {**MIXED, "hq": 4, "hkv": 2, "d": 8, "dtype": torch.float64}
    ctx.case(base, body)
    ctx.case({**ADJACENT, "hq": 2, "hkv": 2, "d": 4, "dtype": torch.float32, "seed": 2}, body)
    ctx.case({"lengths": [5], "past": [0], "hq": 3, "hkv": 1, "d": 4, "dtype": torch.float64, "seed": 4}, body)
    ctx.case({**base, "slack": 7}, body)  # maxima above the true ones: accepted, same result
    ctx.case({**base, "scale": 0.3}, body)
    ctx.case({"lengths": [3, 2], "k_lengths": [1, 4], "past": [0, 0], "causal": False, "hq": 2, "hkv": 1, "d": 4,
              "dtype": torch.float64, "seed": 6}, body)  # not causal: fewer keys than queries is fine
    ctx.forall(rows.attention_rows(), body, max_examples=12)
    envelope.run(ctx, base, ("large", "half", "strided", "magnitude"), body,
                 large={**LARGE, "hq": 16, "hkv": 4, "d": 8})


@CHECKS.add("varlen_mask and varlen_attention: bad offsets, shapes, maxima, causal and scale raise ValueError "
            "naming them; the exact maxima are accepted", uses="varlen_attention")
def attention_rejects_bad_input(ctx):
    ctx.case({"seed": 0}, bad_mask)
    ctx.case({"seed": 1}, bad_attention)


# -- task 3: PackedKVCache ------------------------------------------------------------------------------------
@CHECKS.add("PackedKVCache: rows and frees match a plain dict of sequences; each row comes back in row order",
            uses="PackedKVCache")
def cache_matches_a_plain_model(ctx):
    def body(c, ex):
        c.differential(ex, lambda api, e: run_program(api, e, c.device), "a program of packed rows and frees")

    base = {"layers": 2, "hkv": 2, "d": 4, "dtype": torch.float64, "seed": 1,
            "ops": (("row", ((0, 3), (1, 2))), ("row", ((1, 1), (0, 1))), ("free", 0), ("row", ((0, 2), (1, 1))),
                    ("row", ((2, 1), (1, 1), (0, 1))))}
    ctx.case(base, body)
    ctx.case({**base, "ops": (("row", (("x", 4),)), ("free", "x"), ("row", (("x", 1),)), ("row", (("x", 1),)))},
             body)  # an id freed, then admitted again from 0
    ctx.forall(programs(), body, max_examples=12)
    envelope.run(ctx, base, ("large", "half", "strided"), body,
                 large={"hkv": 16, "ops": (("row", ((0, 257), (1, 40))), ("row", ((1, 1), (0, 1))),
                                          ("row", ((0, 3), (1, 1))))})


@CHECKS.add("two PackedKVCache instances driven in turn behave as each alone (two caches never share storage)",
            uses="PackedKVCache")
def caches_are_apart(ctx):
    def body(c, ex):
        program = protocol.interleaved(new_cache, cache_step, steps=4)
        c.differential(ex, lambda api, e: program(api, {**e, "device": c.device}), "two caches A and B in turn")

    ctx.case({"hkv": 2, "d": 4, "dtype": torch.float64, "seed": 4}, body)


@CHECKS.add("PackedKVCache: a wrong past length, update before begin, bad layer, k, v and ids raise ValueError "
            "naming them, changing nothing", uses="PackedKVCache")
def cache_rejects_bad_input(ctx):
    ctx.case({"seed": 0}, bad_cache)


# -- task 4: packed_generate ----------------------------------------------------------------------------------
@CHECKS.add("packed_generate: each prompt gets exactly its own greedy tokens", uses="packed_generate")
def tokens_equal_each_prompt_alone(ctx):
    def body(c, ex):
        model, prompts, eos, tokens = run(c, ex)
        verify(c, model, prompts, eos, tokens, ex)

    ctx.case({"lengths": [3, 1, 5], "max_new_tokens": 6, "seed": 1}, body)
    ctx.case({"lengths": [1], "max_new_tokens": 4, "seed": 2}, body)  # one prompt: plain greedy decoding
    ctx.case({"lengths": [1, 1, 1, 1], "max_new_tokens": 3, "seed": 3}, body)
    ctx.case({"prompts": [[0, 47, 10], [47], [5, 0]], "max_new_tokens": 5, "seed": 4}, body)
    ctx.case({"lengths": [3, 1, 5], "max_new_tokens": 5, "near_tie": True, "seed": 5}, body)  # picks in float64
    ctx.forall(runs(), body, max_examples=8)


@CHECKS.add("packed_generate: one packed row per model call, finished sequences leave it, block-diagonal mask",
            uses="packed_generate")
def rows_are_packed(ctx):
    def body(c, ex):
        model, prompts, eos, tokens = run(c, ex)
        verify(c, model, prompts, eos, tokens, ex)
        problem = row_problem(model.calls, prompts, tokens)
        if problem:
            c.fail(problem[0], ex, problem[1])
        cache = model.calls[-1]["cache"] if model.calls else None
        held = [cache.seq_len(i) for i in range(len(prompts))] if hasattr(cache, "seq_len") else []
        if any(held):
            c.fail(f"after every sequence finished, the cache still holds {held} tokens for the prompts 0 … "
                   f"{len(prompts) - 1} (their seq_ids); free each sequence when it finishes", ex, ("not freed", tuple(held)))

    ctx.case({"lengths": [4, 2, 6], "max_new_tokens": 5, "eos": True, "seed": 5}, body)
    ctx.case({"lengths": [2, 3], "max_new_tokens": 4, "seed": 6}, body)
    ctx.forall(runs(), body, max_examples=6)


@CHECKS.add("packed_generate: an EOS ends its sequence and is kept (id 0 too); budgets 0 and 1; [] gives []",
            uses="packed_generate")
def eos_and_budgets(ctx):
    def counting(c, ex):
        model = successor_model(16, c.device)
        got = c.t.packed_generate(model, [list(p) for p in ex["prompts"]], ex["max_new_tokens"],
                                  eos_token_id=ex["eos_token_id"])
        want = []
        for p in ex["prompts"]:
            seq = []
            while len(seq) < ex["max_new_tokens"] and (not seq or seq[-1] != ex["eos_token_id"]):
                seq.append(((seq or p)[-1] + 1) % 16)
            want.append(seq)
        if got != want:
            c.fail(f"a model that continues every token t with t + 1 (mod 16), EOS {ex['eos_token_id']}: prompts "
                   f"{list(ex['prompts'])} should give {want}, got {got!r}", ex, ("tokens", repr(got)))

    ctx.case({"prompts": ([13], [5, 6], [14]), "max_new_tokens": 6, "eos_token_id": 0}, counting)
    ctx.case({"prompts": ([1], [2, 3]), "max_new_tokens": 0, "eos_token_id": None}, counting)
    ctx.case({"prompts": ([1], [9, 3]), "max_new_tokens": 1, "eos_token_id": 2}, counting)
    ctx.case({"prompts": (), "max_new_tokens": 3, "eos_token_id": None}, counting)
    ctx.case({"prompts": ([7], [15]), "max_new_tokens": 5, "eos_token_id": 15}, counting)


@CHECKS.add("packed_generate: bad prompts, budgets and EOS ids raise ValueError naming them",
            uses="packed_generate")
def generate_rejects_bad_input(ctx):
    ctx.case({"seed": 0}, bad_generate)


@CHECKS.add("the tokens are the caller's: kept while the next call runs, or overwritten, they change nothing",
            uses="packed_generate")
def results_are_the_callers(ctx):
    def body(c, ex):
        def call(prompts):
            return lambda api, e: api.packed_generate(successor_model(16, c.device), [list(p) for p in prompts], 4)
        first, other = call([[3], [4, 5]]), call([[9, 1]])
        for what, program in (("the tokens of one call, held while another call runs", protocol.kept(first, other)),
                              ("the caller overwrites the tokens, then makes the same call again",
                               protocol.changed_by_caller(first, first, "the same call"))):
            c.differential(ex, program, what)

    ctx.case({"seed": 0}, body)


# -- the device -----------------------------------------------------------------------------------------------
def _device_scenario(s):
    api = s.ctx.t
    s.call("cu_seqlens([3, 1, 2], device=the test device)", api.cu_seqlens, [3, 1, 2], device=s.device)
    packed = s.call("pack(seqs, [0, 3, 4], device=the test device)", api.pack, [[1, 2, 3], [4], [5, 6]], [0, 3, 4],
                    device=s.device)
    s.expect_on([getattr(packed, name, None) for name in rows.FIELDS[:4]], "pack(...)", "put into Packed")
    cu_q, cu_k = s.put(rows.cu([3, 1, 2])), s.put(rows.cu([3, 4, 6]))
    s.call("varlen_mask(cu_seqlens_q, cu_seqlens_k) of tensors on the test device", api.varlen_mask, cu_q, cu_k)
    q, k, v = (s.put(randn(i, n, h, 4)) for i, (n, h) in enumerate(((6, 2), (13, 1), (13, 1))))
    s.call("varlen_attention on the test device", api.varlen_attention, q, k, v, cu_q, cu_k, 3, 6)
    cache = api.PackedKVCache()
    cache.begin(rows.row([3, 1], [0, 0], [0, 1], s.device))
    s.call("PackedKVCache().update(0, k, v) after begin(row), k and v on the test device", cache.update, 0,
           s.put(randn(7, 1, 1, 4, 4)), s.put(randn(8, 1, 1, 4, 4)))
    model = devices.module_on(s, lambda: Llama(LlamaConfig(**DEVICE_MODEL)), dtype=torch.float64)
    s.call("packed_generate(model, [[5, 9, 2], [3]], 3), the model on the test device", api.packed_generate, model,
           [[5, 9, 2], [3]], 3)


@CHECKS.add("every function keeps its tensors on the inputs' (or the model's) device", uses="pack")
def keeps_the_device(ctx):
    ctx.case({"prompts": [[5, 9, 2], [3]], "max_new_tokens": 3},
             lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))
