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
import numbers

import torch
from hypothesis import strategies as st

from grader.checks.support import devices
from grader.checks.support.common import SEEDS, expect_value_error, randn
from grader.checks.support.models import DEVICE_MODEL, TIE, first_wrong, greedy_alone
from grader.checks.k12_programs import programs, replay
from grader.checks.k12_spy import WrongDraft, count_rounds, perturbed, replay_calls, spy_model
from grader.engine import Checks, report
from grader.nn import Llama, LlamaConfig

CHECKS = Checks("12")

TARGET = dict(num_hidden_layers=3)
SMALL_DRAFT = dict(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
NOISE = 0.1  # the perturbed draft: agrees with the target on about half its proposals


# -- the models ---------------------------------------------------------------------------------
def _models(ex: dict, device):
    """The target and the draft of the example, sharing one call log."""
    log: list = []
    target = spy_model(ex["seed"], device, "target", log, **TARGET)
    kind = ex["draft"]
    if kind == "identical":
        draft = spy_model(ex["seed"], device, "draft", log, **TARGET)
    elif kind == "perturbed":
        draft = perturbed(target, ex["seed"] + 1, NOISE)
    elif kind == "random":
        draft = spy_model(ex["seed"] + 1, device, "draft", log, **SMALL_DRAFT)
    else:
        draft = WrongDraft(target)
    return target, draft, log


def _prompt(ex: dict, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(ex["seed"] + 2)
    return torch.randint(0, vocab, (ex["prompt_len"],), generator=g).tolist()


@st.composite
def runs(draw, drafts=("identical", "perturbed", "random", "wrong"), max_new=(1, 14), ks=(1, 5)):
    return {"draft": draw(st.sampled_from(drafts)), "prompt_len": draw(st.integers(1, 10)),
            "max_new_tokens": draw(st.integers(*max_new)), "k": draw(st.integers(*ks)), "seed": draw(SEEDS)}


def _run(c, ex, eos=None):
    """The learner's speculative_generate on the example; returns (target, draft, log, prompt, tokens, stats)."""
    target, draft, log = _models(ex, c.device)
    prompt = _prompt(ex, target.config.vocab_size)
    got = c.t.speculative_generate(target, draft, prompt, ex["max_new_tokens"], ex["k"], eos_token_id=eos)
    tokens, stats = _result(c, got, ex)
    return target, draft, log, prompt, tokens, stats


def _result(c, got, ex) -> tuple[list[int], dict]:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        c.fail(f"speculative_generate should return (tokens, stats); got {report.describe(got)}", ex,
               ("returned", report.describe(got)))
    tokens, stats = got
    if not isinstance(tokens, list) or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                               for t in tokens):
        c.fail(f"tokens should be a list of int token ids; got {report.describe(tokens)} (call .tolist() on a tensor)",
               ex, ("tokens type", report.describe(tokens)))
    keys = ("target_forwards", "draft_forwards", "proposed", "accepted")
    if not isinstance(stats, dict) or not all(isinstance(stats.get(key), numbers.Integral) for key in keys):
        c.fail(f"stats should be a dict with int entries {', '.join(keys)}; got {stats!r}", ex, ("stats type",))
    return [int(t) for t in tokens], {key: int(stats[key]) for key in keys}


# -- the answer: the target's plain greedy tokens -----------------------------------------------------
@torch.no_grad()
def _verify(c, target, prompt, tokens, ex, eos=None):
    """Each token the target's greedy choice after the ones before it (uncached, tie-aware); the length right."""
    N, shown = ex["max_new_tokens"], {**ex, **({"eos_token_id": eos} if eos is not None else {})}
    wrong = first_wrong(target, prompt, tokens, eos, TIE)
    if wrong is not None and wrong[0] == "token":
        _, i, token, best, _ = wrong
        c.fail(f"new token {i}: you produced {token}, but the target's own greedy choice there is {best}; "
               f"the output must equal the target's plain greedy generation whatever the draft "
               f"({ex['draft']} here)\n  your tokens: {tokens}", shown, ("tokens", tokens))
    if wrong is not None:
        i = wrong[1]
        c.fail(f"new token {i} is the EOS {eos}, but the output goes on with {tokens[i + 1:]}; stop after "
               f"the first EOS (keeping it)\n  your tokens: {tokens}", shown, ("tokens", tokens))
    if len(tokens) > N or (len(tokens) < N and (eos is None or eos not in tokens)):
        why = "no more than max_new_tokens" if len(tokens) > N else "max_new_tokens, as no EOS came"
        c.fail(f"{len(tokens)} new tokens, expected {N} ({why})\n  your tokens: {tokens}", shown, ("tokens", tokens))


# -- RollbackKVCache -----------------------------------------------------------------------------------------
@CHECKS.add("RollbackKVCache: updates and crops match a plain list of chunks per layer", uses="RollbackKVCache")
def cache_matches_a_plain_model(ctx):
    def body(c, ex):
        fresh = c.t.RollbackKVCache()
        if fresh.seq_len() != 0:
            c.fail(f"a fresh cache should hold nothing: seq_len() = {fresh.seq_len()}", ex, ("fresh", fresh.seq_len()))
        replay(c, ex)

    ctx.case({"layers": 2, "batch": 1, "heads": 2, "head_dim": 4, "dtype": torch.float64,
              "ops": [("update", 3), ("update", 4), ("crop", 5), ("update", 1), ("crop", 0), ("update", 2)],
              "seed": 1}, body)
    ctx.forall(programs(), body, max_examples=15)


@CHECKS.add("RollbackKVCache: bad layer, shapes and crop lengths raise ValueError naming them, changing nothing",
            uses="RollbackKVCache")
def cache_rejects_bad_input(ctx):
    def body(c, ex):
        cache = c.t.RollbackKVCache()
        k = randn(ex["seed"], 1, 2, 3, 4, device=c.device)
        for layer in range(2):
            cache.update(layer, k, k.clone())
        tries = [("update(-1, k, v)", lambda: cache.update(-1, k, k), ("layer",)),
                 ("update with k of 3 dimensions", lambda: cache.update(0, k[0], k), ("k",)),
                 ("update with v of 3 dimensions", lambda: cache.update(0, k, k[0]), ("v",)),
                 ("update with v shorter than k", lambda: cache.update(0, k, k[:, :, :2]), ("v", "k")),
                 ("update with 1 KV head where the layer holds 2", lambda: cache.update(1, k[:, :1], k[:, :1]), ("k",)),
                 ("update with head width 2 where the layer holds 4", lambda: cache.update(0, k[..., :2], k[..., :2]),
                  ("k",)),
                 ("seq_len(-1)", lambda: cache.seq_len(-1), ("layer",)),
                 ("crop(-1)", lambda: cache.crop(-1), ("n",)),
                 ("crop(4) on a cache of 3 tokens", lambda: cache.crop(4), ("n",))]
        for what, call, names in tries:
            expect_value_error(c, call, what=what, names=names, example=ex)
            if (cache.seq_len(0), cache.seq_len(1)) != (3, 3):
                c.fail(f"after the refused {what}, the cache holds {(cache.seq_len(0), cache.seq_len(1))} tokens per "
                       "layer instead of (3, 3): check the input before changing anything", ex, ("changed", what))

    ctx.case({"seed": 0}, body)


# -- speculative_generate ---------------------------------------------------------------------------------
@CHECKS.add("the tokens equal the target's plain greedy generation, whatever the draft", uses="speculative_generate")
def tokens_equal_plain_greedy(ctx):
    def body(c, ex):
        target, _, _, prompt, tokens, _ = _run(c, ex)
        _verify(c, target, prompt, tokens, ex)

    ctx.case({"draft": "perturbed", "prompt_len": 5, "max_new_tokens": 12, "k": 3, "seed": 4}, body)
    ctx.case({"draft": "random", "prompt_len": 3, "max_new_tokens": 9, "k": 4, "seed": 7}, body)
    ctx.forall(runs(), body, max_examples=8)


@CHECKS.add("a draft that is never right: still the target's tokens, nothing accepted", uses="speculative_generate")
def always_wrong_draft(ctx):
    def body(c, ex):
        target, _, _, prompt, tokens, stats = _run(c, ex)
        _verify(c, target, prompt, tokens, ex)
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
        target, _, log, prompt, tokens, _ = _run(c, ex)
        _verify(c, target, prompt, tokens, ex)
        problem = replay_calls(log, prompt + tokens)
        if problem:
            c.fail(problem[0], ex, problem[1])

    ctx.case({"draft": "perturbed", "prompt_len": 4, "max_new_tokens": 12, "k": 4, "seed": 11}, body)
    ctx.case({"draft": "random", "prompt_len": 2, "max_new_tokens": 8, "k": 4, "seed": 3}, body)
    ctx.forall(runs(drafts=("perturbed", "random", "identical"), max_new=(2, 14), ks=(2, 5)), body, max_examples=6)


@CHECKS.add("an identical draft: every proposal accepted, k proposals checked in one target forward",
            uses="speculative_generate")
def identical_draft_accepts_everything(ctx):
    def body(c, ex):
        target, _, log, prompt, tokens, stats = _run(c, ex)
        _verify(c, target, prompt, tokens, ex)
        seen, N, k = count_rounds(log, len(prompt)), ex["max_new_tokens"], ex["k"]
        bound = math.ceil(N / (k + 1)) + 1
        if max(seen["per_forward"], default=0) > k:
            c.fail(f"a target forward checked {max(seen['per_forward'])} draft tokens; at most k = {k} per round",
                   ex, ("too many proposals", max(seen["per_forward"])))
        if seen["target_forwards"] > bound:
            c.fail(f"with a draft identical to the target, {N} tokens at k = {k} should take at most "
                   f"ceil({N} / {k + 1}) + 1 = {bound} target forwards; yours ran {seen['target_forwards']} "
                   f"(tokens fed per forward: {[call['ids'].shape[1] for call in log if call['model'] is target]}). "
                   "The pending token and all k proposals go through the target in one forward, and when all k "
                   "agree the target's own next token comes for free.", ex, ("target forwards", seen["target_forwards"]))
        if stats["accepted"] != stats["proposed"]:
            c.fail(f"with an identical draft every proposal agrees with the target, yet stats say "
                   f"{stats['accepted']} of {stats['proposed']} accepted", ex, ("accepted", stats["accepted"]))

    ctx.case({"draft": "identical", "prompt_len": 3, "max_new_tokens": 12, "k": 3, "seed": 5}, body)
    ctx.forall(runs(drafts=("identical",), max_new=(1, 16)), body, max_examples=4)


@CHECKS.add("stats count what the calls show: forwards of each model, proposals, accepted prefixes",
            uses="speculative_generate")
def stats_match_the_calls(ctx):
    def body(c, ex):
        _, _, log, prompt, tokens, stats = _run(c, ex)
        seen = count_rounds(log, len(prompt))
        for key in ("target_forwards", "draft_forwards", "proposed", "accepted"):
            if stats[key] != seen[key]:
                c.fail(f"stats[{key!r}] = {stats[key]}, but the models saw {seen[key]} (stats {stats}; what the calls "
                       f"show: { {k: v for k, v in seen.items() if k != 'per_forward'} }). proposed counts draft tokens "
                       "sent to the target, accepted the agreeing prefix of each round (the target's own extra token "
                       "is not a proposal)", ex, ("stats", key, stats[key], seen[key]))

    ctx.case({"draft": "perturbed", "prompt_len": 6, "max_new_tokens": 13, "k": 3, "seed": 9}, body)
    ctx.forall(runs(drafts=("perturbed", "random", "identical")), body, max_examples=4)


@CHECKS.add("an EOS stops the output and is kept", uses="speculative_generate")
def eos_stops_and_is_kept(ctx):
    def body(c, ex):
        target, _, _ = _models(ex, c.device)
        prompt = _prompt(ex, target.config.vocab_size)
        path = greedy_alone(target, prompt, ex["max_new_tokens"])
        eos = next((t for i, t in enumerate(path) if i >= 2 and t not in path[:i]), path[-1])
        target, _, _, prompt, tokens, _ = _run(c, ex, eos=eos)
        _verify(c, target, prompt, tokens, ex, eos=eos)

    ctx.case({"draft": "identical", "prompt_len": 3, "max_new_tokens": 14, "k": 4, "seed": 1}, body)
    ctx.forall(runs(drafts=("identical", "perturbed"), max_new=(4, 14)), body, max_examples=3)


@CHECKS.add("max_new_tokens 0 gives [], 1 gives the target's first token", uses="speculative_generate")
def edge_budgets(ctx):
    def body(c, ex):
        if ex["max_new_tokens"] == 0:
            target, draft, _ = _models(ex, c.device)
            got = c.t.speculative_generate(target, draft, _prompt(ex, 48), 0, ex["k"])
            tokens, _ = _result(c, got, ex)
            if tokens != []:
                c.fail(f"max_new_tokens = 0 should give [], got {tokens}", ex, ("tokens", tokens))
            return
        target, _, _, prompt, tokens, _ = _run(c, ex)
        _verify(c, target, prompt, tokens, ex)

    for ex in ({"draft": "perturbed", "prompt_len": 3, "max_new_tokens": 0, "k": 2, "seed": 1},
               {"draft": "perturbed", "prompt_len": 1, "max_new_tokens": 1, "k": 4, "seed": 2},
               {"draft": "identical", "prompt_len": 1, "max_new_tokens": 2, "k": 1, "seed": 3}):
        ctx.case(ex, body)


@CHECKS.add("k < 1, max_new_tokens < 0, an empty prompt, a draft of another vocabulary: ValueError naming it",
            uses="speculative_generate")
def rejects_bad_input(ctx):
    def body(c, ex):
        log: list = []
        target = spy_model(ex["seed"], c.device, "target", log)
        draft = spy_model(ex["seed"] + 1, c.device, "draft", log, **SMALL_DRAFT)
        other = spy_model(ex["seed"] + 2, c.device, "draft", log, vocab_size=40, **SMALL_DRAFT)
        for what, args, kwargs, name in (("k = 0", (target, draft, [1, 2], 4), {"k": 0}, "k"),
                                         ("k = -2", (target, draft, [1, 2], 4), {"k": -2}, "k"),
                                         ("max_new_tokens = -1", (target, draft, [1, 2], -1), {}, "max_new_tokens"),
                                         ("an empty prompt", (target, draft, [], 4), {}, "prompt"),
                                         ("a draft with 40 tokens for a target with 48", (target, other, [1, 2], 4),
                                          {}, "draft")):
            expect_value_error(c, c.t.speculative_generate, *args, what=f"speculative_generate with {what}",
                               names=(name,), example=ex, **kwargs)

    ctx.case({"seed": 0}, body)


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
