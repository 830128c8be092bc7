"""Hidden checks of kata 12 — speculative decoding with cache rollback.

``RollbackKVCache`` is replayed against a plain model (a list of chunks per layer) on drawn
programs of updates and crops. ``speculative_generate`` drives a tiny float64 target Llama with
four kinds of draft — identical, perturbed, a smaller random model, and one that is always
wrong — and its tokens are checked against the target's plain greedy generation (uncached
forwards, ties within 1e-9 accepted). The spies of ``speculative_spy`` watch every forward:
positions, what each cache held, the logits, the number of target calls and proposals.
"""
from __future__ import annotations

import math

import torch

from grader.checks.support import devices, envelope, protocol
from grader.checks.support.common import expect_value_error, randn
from grader.checks.support.models import DEVICE_MODEL, greedy_alone
from grader.checks.k12_programs import bad_calls, cache_step, new_cache, programs, replay
from grader.checks.k12_runs import (HALF_TIE, LARGE_TARGET, SMALL_DRAFT, counting_to_eos, models, prompt_of,
                                    protocol_call, result, run, runs, verify)
from grader.checks.k12_spy import count_rounds, replay_calls, spy_model
from grader.engine import Checks
from grader.nn import Llama, LlamaConfig

CHECKS = Checks("12")


# -- RollbackKVCache -----------------------------------------------------------------------------------------
@CHECKS.add("RollbackKVCache: updates and crops match a plain list of chunks per layer", uses="RollbackKVCache")
def cache_matches_a_plain_model(ctx):
    def body(c, ex):
        fresh = c.t.RollbackKVCache()
        if fresh.seq_len() != 0:
            c.fail(f"a fresh cache should hold nothing: seq_len() = {fresh.seq_len()}", ex, ("fresh", fresh.seq_len()))
        replay(c, ex)

    base = {"layers": 2, "batch": 1, "heads": 2, "head_dim": 4, "dtype": torch.float64,
            "ops": [("update", 3), ("update", 4), ("crop", 5), ("update", 1), ("crop", 0), ("update", 2)], "seed": 1}
    ctx.case(base, body)
    # crop(seq_len()) and crop(0), the two ends of the valid range, each followed by an update
    ctx.case({**base, "ops": [("update", 3), ("crop", 3), ("update", 2), ("crop", 0), ("update", 1)], "seed": 2}, body)
    ctx.forall(programs(), body, max_examples=15)
    envelope.run(ctx, base, ("large", "half", "strided"), body,
                 large={"heads": 16, "ops": [("update", 257), ("crop", 200), ("update", 60), ("crop", 260),
                                             ("update", 1)]})


@CHECKS.add("RollbackKVCache: bad layer, shapes and crop lengths raise ValueError naming them, changing nothing",
            uses="RollbackKVCache")
def cache_rejects_bad_input(ctx):
    def body(c, ex):
        cache = c.t.RollbackKVCache()
        k = randn(ex["seed"], 1, 2, 3, 4, device=c.device)
        for layer in range(2):
            cache.update(layer, k, k.clone())
        tries = bad_calls(cache, k, randn(ex["seed"] + 1, 2, 3, 3, 8, device=c.device))
        for what, call, names in tries:
            expect_value_error(c, call, what=what, names=names, example=ex)
            held = (cache.seq_len(0), cache.seq_len(1), cache.seq_len(2))
            if held != (3, 3, 0):
                c.fail(f"after the refused {what}, layers 0, 1 and 2 hold {held} tokens instead of (3, 3, 0): check "
                       "the input before changing anything", ex, ("changed", what))

    ctx.case({"seed": 0}, body)


@CHECKS.add("two RollbackKVCache instances driven in turn behave as each alone (two caches never share storage)",
            uses="RollbackKVCache")
def caches_are_apart(ctx):
    def body(c, ex):
        run_both = protocol.interleaved(new_cache, cache_step, steps=4)
        c.differential(ex, lambda api, e: run_both(api, {**e, "device": c.device}),
                       "two caches A and B, each updated and cropped in turn")

    ctx.case({"seed": 4}, body)


# -- speculative_generate ---------------------------------------------------------------------------------
@CHECKS.add("the tokens equal the target's plain greedy generation, whatever the draft", uses="speculative_generate")
def tokens_equal_plain_greedy(ctx):
    def body(c, ex):
        target, _, _, prompt, tokens, _ = run(c, ex)
        verify(c, target, prompt, tokens, ex)

    ctx.case({"draft": "perturbed", "prompt_len": 5, "max_new_tokens": 12, "k": 3, "seed": 4}, body)
    ctx.case({"draft": "random", "prompt_len": 3, "max_new_tokens": 9, "k": 4, "seed": 7}, body)
    ctx.case({"draft": "perturbed", "prompt": [0, 47, 10, 47, 0], "max_new_tokens": 8, "k": 2, "seed": 13}, body)
    ctx.forall(runs(), body, max_examples=8)


@CHECKS.add("a float64 target whose top two logits are 1e-8 apart: the larger one wins every time",
            uses="speculative_generate")
def near_ties_read_in_the_models_dtype(ctx):
    def body(c, ex):
        target, _, _, prompt, tokens, _ = run(c, ex)
        verify(c, target, prompt, tokens, ex)

    ctx.case({"draft": "identical", "near_tie": True, "prompt_len": 4, "max_new_tokens": 10, "k": 3, "seed": 6}, body)


@CHECKS.add("bfloat16 and float16 target and draft: the target's greedy tokens within the half type's rounding",
            uses="speculative_generate")
def half_precision_models(ctx):
    def body(c, ex):
        target, _, log, prompt, tokens, stats = run(c, ex)
        _stats_as_seen(c, ex, log, prompt, stats)
        verify(c, target.to(torch.float64), prompt, tokens, ex, tie=HALF_TIE[ex["dtype"]])

    envelope.run(ctx, {"draft": "random", "prompt_len": 5, "max_new_tokens": 8, "k": 3, "seed": 14}, ("half",), body)


@CHECKS.add("a draft that is never right: still the target's tokens, nothing accepted", uses="speculative_generate")
def always_wrong_draft(ctx):
    def body(c, ex):
        target, _, _, prompt, tokens, stats = run(c, ex)
        verify(c, target, prompt, tokens, ex)
        if stats["accepted"] != 0:
            c.fail(f"the draft's greedy token is never the target's, yet stats say {stats['accepted']} proposals were "
                   f"accepted (stats {stats}); accepted counts proposals equal to the target's own choice",
                   ex, ("accepted", stats["accepted"]))

    ctx.case({"draft": "wrong", "prompt_len": 4, "max_new_tokens": 7, "k": 3, "seed": 2}, body)
    ctx.forall(runs(drafts=("wrong",)), body, max_examples=2)


@CHECKS.add("at every forward of either model the cache holds only accepted tokens, at the right positions",
            uses="speculative_generate")
def caches_hold_only_accepted_tokens(ctx):
    def body(c, ex):
        target, _, log, prompt, tokens, _ = run(c, ex)
        verify(c, target, prompt, tokens, ex)
        problem = replay_calls(log, prompt + tokens, len(prompt))
        if problem:
            c.fail(problem[0], ex, problem[1])

    ctx.case({"draft": "perturbed", "prompt_len": 4, "max_new_tokens": 12, "k": 4, "seed": 11}, body)
    ctx.case({"draft": "random", "prompt_len": 2, "max_new_tokens": 8, "k": 4, "seed": 3}, body)
    ctx.forall(runs(drafts=("perturbed", "random", "identical"), max_new=(2, 14), ks=(2, 5)), body, max_examples=6)
    # positions past 256 and 16 query heads: the prompt fills the caches, the rounds crop and extend them
    envelope.run(ctx, {"draft": "random", "prompt_len": 4, "max_new_tokens": 4, "k": 2, "seed": 16}, ("large",),
                 body, large={"prompt_len": 260, "target": LARGE_TARGET})


@CHECKS.add("an identical draft: every proposal accepted, k proposals checked in one target forward",
            uses="speculative_generate")
def identical_draft_accepts_everything(ctx):
    def body(c, ex):
        target, _, log, prompt, tokens, stats = run(c, ex)
        verify(c, target, prompt, tokens, ex)
        seen, N, k = count_rounds(log, len(prompt)), ex["max_new_tokens"], ex["k"]
        bound, given = math.ceil(N / (k + 1)) + 1, " (k not given: the default is 4)" if ex.get("k_default") else ""
        if max(seen["per_forward"], default=0) > k:
            c.fail(f"a target forward checked {max(seen['per_forward'])} draft tokens; at most k = {k}{given} per "
                   "round", ex, ("too many proposals", max(seen["per_forward"])))
        if seen["target_forwards"] > bound:
            c.fail(f"with a draft identical to the target, {N} tokens at k = {k}{given} should take at most "
                   f"ceil({N} / {k + 1}) + 1 = {bound} target forwards; yours ran {seen['target_forwards']} "
                   f"(tokens fed per forward: {[call['ids'].shape[1] for call in log if call['model'] is target]}). "
                   "The pending token and all k proposals go through the target in one forward, and when all k "
                   "agree the target's own next token comes for free.", ex, ("target forwards", seen["target_forwards"]))
        if stats["accepted"] != stats["proposed"]:
            c.fail(f"with an identical draft every proposal agrees with the target, yet stats say "
                   f"{stats['accepted']} of {stats['proposed']} accepted", ex, ("accepted", stats["accepted"]))

    ctx.case({"draft": "identical", "prompt_len": 3, "max_new_tokens": 12, "k": 3, "seed": 5}, body)
    ctx.case({"draft": "identical", "prompt_len": 3, "max_new_tokens": 15, "k": 4, "k_default": True, "seed": 8}, body)
    ctx.forall(runs(drafts=("identical",), max_new=(1, 16)), body, max_examples=4)


@CHECKS.add("stats count what the calls show: forwards of each model, proposals, accepted prefixes",
            uses="speculative_generate")
def stats_match_the_calls(ctx):
    def body(c, ex):
        _, _, log, prompt, tokens, stats = run(c, ex)
        _stats_as_seen(c, ex, log, prompt, stats)

    ctx.case({"draft": "perturbed", "prompt_len": 6, "max_new_tokens": 13, "k": 3, "seed": 9}, body)
    # wrong at every third position: after a mismatch the next proposals agree with the target's rows again
    ctx.case({"draft": "sometimes", "prompt_len": 5, "max_new_tokens": 12, "k": 4, "seed": 10}, body)
    ctx.forall(runs(drafts=("perturbed", "random", "identical")), body, max_examples=4)


def _stats_as_seen(c, ex, log, prompt, stats):
    seen = count_rounds(log, len(prompt))
    for key in ("target_forwards", "draft_forwards", "proposed", "accepted"):
        if stats[key] != seen[key]:
            c.fail(f"stats[{key!r}] = {stats[key]}, but the models saw {seen[key]} (stats {stats}; what the calls "
                   f"show: { {k: v for k, v in seen.items() if k != 'per_forward'} }). proposed counts draft tokens "
                   "sent to the target, accepted the agreeing prefix of each round (the target's own extra token "
                   "is not a proposal, nor is a later proposal that agrees after a rejected one)",
                   ex, ("stats", key, stats[key], seen[key]))


@CHECKS.add("an EOS stops the output and is kept", uses="speculative_generate")
def eos_stops_and_is_kept(ctx):
    def body(c, ex):
        target, _, _ = models(ex, c.device)
        prompt = prompt_of(ex, target.config.vocab_size)
        path = greedy_alone(target, prompt, ex["max_new_tokens"])
        eos = next((t for i, t in enumerate(path) if i >= 2 and t not in path[:i]), path[-1])
        target, _, _, prompt, tokens, _ = run(c, ex, eos=eos)
        verify(c, target, prompt, tokens, ex, eos=eos)

    ctx.case({"draft": "identical", "prompt_len": 3, "max_new_tokens": 14, "k": 4, "seed": 1}, body)
    ctx.forall(runs(drafts=("identical", "perturbed"), max_new=(4, 14)), body, max_examples=3)
    ctx.case({"prompt": [13], "max_new_tokens": 8, "k": 4, "eos_token_id": 0}, counting_to_eos)
    ctx.case({"prompt": [6, 9], "max_new_tokens": 12, "k": 3, "eos_token_id": 15}, counting_to_eos)


@CHECKS.add("max_new_tokens 0 gives [], 1 gives the target's first token", uses="speculative_generate")
def edge_budgets(ctx):
    def body(c, ex):
        if ex["max_new_tokens"] == 0:
            target, draft, _ = models(ex, c.device)
            got = c.t.speculative_generate(target, draft, prompt_of(ex, 48), 0, ex["k"])
            tokens, _ = result(c, got, ex)
            if tokens != []:
                c.fail(f"max_new_tokens = 0 should give [], got {tokens}", ex, ("tokens", tokens))
            return
        target, _, _, prompt, tokens, _ = run(c, ex)
        verify(c, target, prompt, tokens, ex)

    for ex in ({"draft": "perturbed", "prompt_len": 3, "max_new_tokens": 0, "k": 2, "seed": 1},
               {"draft": "perturbed", "prompt_len": 1, "max_new_tokens": 1, "k": 4, "seed": 2},
               {"draft": "identical", "prompt_len": 1, "max_new_tokens": 2, "k": 1, "seed": 3},
               {"draft": "perturbed", "prompt_len": 2, "max_new_tokens": 6, "k": 20, "seed": 4}):  # k > the budget
        ctx.case(ex, body)


@CHECKS.add("k < 1, max_new_tokens < 0, an empty prompt, a draft of another vocabulary: ValueError naming it",
            uses="speculative_generate")
def rejects_bad_input(ctx):
    def body(c, ex):
        log: list = []
        target = spy_model(ex["seed"], c.device, "target", log)
        draft = spy_model(ex["seed"] + 1, c.device, "draft", log, **SMALL_DRAFT)
        fewer = spy_model(ex["seed"] + 2, c.device, "draft", log, vocab_size=40, **SMALL_DRAFT)
        more = spy_model(ex["seed"] + 3, c.device, "draft", log, vocab_size=56, **SMALL_DRAFT)
        for what, args, kwargs, name in (("k = 0", (target, draft, [1, 2], 4), {"k": 0}, "k"),
                                         ("k = -2", (target, draft, [1, 2], 4), {"k": -2}, "k"),
                                         ("k = 2.5", (target, draft, [1, 2], 4), {"k": 2.5}, "k"),
                                         ("max_new_tokens = -1", (target, draft, [1, 2], -1), {}, "max_new_tokens"),
                                         ("max_new_tokens = 2.5", (target, draft, [1, 2], 2.5), {}, "max_new_tokens"),
                                         ("an empty prompt", (target, draft, [], 4), {}, "prompt"),
                                         ("prompt None", (target, draft, None, 4), {}, "prompt"),
                                         ("the token id 48 in the prompt of a 48-token vocabulary",
                                          (target, draft, [1, 48], 4), {}, "prompt"),
                                         ("the token id -1 in the prompt", (target, draft, [-1, 2], 4), {}, "prompt"),
                                         ("the token 2.0 (a float) in the prompt", (target, draft, [1, 2.0], 4), {},
                                          "prompt"),
                                         ("a draft with 40 tokens for a target with 48", (target, fewer, [1, 2], 4),
                                          {}, "draft"),
                                         ("a draft with 56 tokens for a target with 48", (target, more, [1, 2], 4),
                                          {}, "draft")):
            expect_value_error(c, c.t.speculative_generate, *args, what=f"speculative_generate with {what}",
                               names=(name,), example=ex, **kwargs)

    ctx.case({"seed": 0}, body)


@CHECKS.add("the returned tokens are the caller's: kept while the next call runs, or overwritten, they change nothing",
            uses="speculative_generate")
def results_are_the_callers(ctx):
    def body(c, ex):
        pair = models(ex, c.device)[:2]
        first, other, whole = protocol_call(pair, 4), protocol_call(pair, 7), protocol_call(pair, 4, tokens_only=False)
        for what, program in (("the tokens of one call, held while a call on another prompt runs",
                               protocol.kept(first, other, "the tokens of the first call", "a second call")),
                              ("the caller overwrites the tokens and stats of one call, then makes the same call again",
                               protocol.changed_by_caller(whole, first, "the same call")),
                              ("the same call twice", protocol.twice(protocol_call(pair, 5)))):
            c.differential(ex, program, what)

    ctx.case({"draft": "random", "max_new_tokens": 5, "k": 3, "seed": 17}, body)


# -- the device -------------------------------------------------------------------------------
def _device_scenario(s):
    api = s.ctx.t
    cache = api.RollbackKVCache()
    kv = [s.put(randn(i, 1, 2, n, 4)) for i, n in enumerate((3, 3, 2, 2))]  # (B=1, Hkv=2, T, D=4)
    s.call("RollbackKVCache().update(0, k, v) with 3 tokens", cache.update, 0, kv[0], kv[1])
    cache.crop(1)
    s.call("update(0, k, v) with 2 tokens after crop(1)", cache.update, 0, kv[2], kv[3])
    target = devices.module_on(s, lambda: Llama(LlamaConfig(**DEVICE_MODEL)), dtype=torch.float64)
    draft = devices.module_on(s, lambda: Llama(LlamaConfig(**dict(DEVICE_MODEL, hidden_size=8))), dtype=torch.float64)
    s.call("speculative_generate(target, draft, [5, 9, 2], 4, k=2), both models on the test device",
           api.speculative_generate, target, draft, [5, 9, 2], 4, k=2)


@CHECKS.add("the cache and speculative_generate keep every tensor on the models' device", uses="RollbackKVCache")
def keeps_the_device(ctx):
    ctx.case({"prompt": [5, 9, 2], "max_new_tokens": 4, "k": 2},
             lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))
