"""How kata 12's checks run ``speculative_generate``: the models of an example, its prompt, one call
of the learner's function, and the judgement of its tokens against the target's plain greedy
generation (uncached forwards, ties within a tolerance accepted).

An example names its draft (``identical``, ``perturbed``, ``random``, ``wrong``: never the target's
choice, ``sometimes``: wrong at every third position) and may ask for more: ``target`` (config
fields of a larger target), ``dtype`` (both models in a half type), ``near_tie`` (a target whose
top two logits are always 1e-8 apart), ``prompt`` (the ids themselves), ``k_default`` (call
without ``k``, so the SPEC's default 4 applies). Also here: the counting models' EOS run and the
programs the protocol checks compare with the reference.
"""
from __future__ import annotations

import numbers

import torch
from hypothesis import strategies as st

from grader.checks.k12_spy import WrongDraft, near_tie_model, perturbed, spy_model
from grader.checks.support.common import SEEDS
from grader.checks.support.models import TIE, first_wrong, successor_model
from grader.engine import report

TARGET = dict(num_hidden_layers=3)
SMALL_DRAFT = dict(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
LARGE_TARGET = dict(num_attention_heads=16, num_key_value_heads=4)  # 16 query heads of width 2
NOISE = 0.1  # the perturbed draft: agrees with the target on about half its proposals
# Half-precision models: a token is right when its logit (float64 forward of the same rounded weights) is
# this close to the best one; the reference's cached bfloat16 forwards stay within 0.02 of it.
HALF_TIE = {torch.bfloat16: 0.1, torch.float16: 0.02}


def models(ex: dict, device):
    """The target and the draft of the example, sharing one call log."""
    log: list = []
    shape = {**TARGET, **ex.get("target", {})}
    make = near_tie_model if ex.get("near_tie") else spy_model
    target = make(ex["seed"], device, "target", log, **shape)
    kind = ex["draft"]
    if kind == "identical":
        draft = make(ex["seed"], device, "draft", log, **shape)
    elif kind == "perturbed":
        draft = perturbed(target, ex["seed"] + 1, NOISE)
    elif kind == "random":
        draft = spy_model(ex["seed"] + 1, device, "draft", log, **SMALL_DRAFT)
    else:
        draft = WrongDraft(target, every=3 if kind == "sometimes" else 1)
    if ex.get("dtype") is not None:
        target, draft = target.to(ex["dtype"]), draft.to(ex["dtype"])
    return target, draft, log


def prompt_of(ex: dict, vocab: int) -> list[int]:
    if "prompt" in ex:
        return list(ex["prompt"])
    g = torch.Generator().manual_seed(ex["seed"] + 2)
    return torch.randint(0, vocab, (ex["prompt_len"],), generator=g).tolist()


@st.composite
def runs(draw, drafts=("identical", "perturbed", "random", "wrong"), max_new=(1, 14), ks=(1, 5)):
    return {"draft": draw(st.sampled_from(drafts)), "prompt_len": draw(st.integers(1, 10)),
            "max_new_tokens": draw(st.integers(*max_new)), "k": draw(st.integers(*ks)), "seed": draw(SEEDS)}


def run(c, ex, eos=None):
    """The learner's speculative_generate on the example; returns (target, draft, log, prompt, tokens, stats)."""
    target, draft, log = models(ex, c.device)
    prompt = prompt_of(ex, target.config.vocab_size)
    given = list(prompt)
    k = () if ex.get("k_default") else (ex["k"],)
    got = c.t.speculative_generate(target, draft, prompt, ex["max_new_tokens"], *k, eos_token_id=eos)
    if prompt != given:
        c.fail(f"speculative_generate changed the caller's prompt list from {given} to {prompt}; copy it "
               "(seq = list(prompt)) before appending: a function leaves its inputs unchanged", ex,
               ("prompt changed", prompt))
    tokens, stats = result(c, got, ex)
    return target, draft, log, prompt, tokens, stats


def result(c, got, ex) -> tuple[list[int], dict]:
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


@torch.no_grad()
def verify(c, target, prompt, tokens, ex, eos=None, tie=TIE):
    """Each token the target's greedy choice after the ones before it (uncached, tie-aware); the length right."""
    N, shown = ex["max_new_tokens"], {**ex, **({"eos_token_id": eos} if eos is not None else {})}
    wrong = first_wrong(target, prompt, tokens, eos, tie)
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


def counting_to_eos(c, ex):
    """Target and draft both count (t -> t + 1 mod 16), so every proposal is accepted and the EOS comes
    mid-round, inside the accepted prefix; the id 0, which many vocabularies give a special token, is an
    EOS like any other."""
    target, draft, eos, N = successor_model(16, c.device), successor_model(16, c.device), ex["eos_token_id"], \
        ex["max_new_tokens"]
    tokens, _ = result(c, c.t.speculative_generate(target, draft, list(ex["prompt"]), N, ex["k"], eos_token_id=eos), ex)
    want = [(ex["prompt"][-1] + 1 + i) % 16 for i in range(min(N, (eos - ex["prompt"][-1] - 1) % 16 + 1))]
    if tokens != want:
        c.fail(f"a target that continues each token t with t + 1 (mod 16) gives {want} (stopping after the EOS "
               f"{eos}, kept); yours gave {tokens}", {**ex, "models": "each token t is followed by t + 1"},
               ("tokens", tokens))


def protocol_call(pair, prompt_len: int, tokens_only: bool = True):
    """A program for the protocol checks: speculative_generate on the models ``pair`` (built once: they
    keep no state between calls) and the example's prompt of ``prompt_len`` tokens."""
    def call(api, ex):
        target, draft = pair
        prompt = prompt_of({**ex, "prompt_len": prompt_len}, target.config.vocab_size)
        got = api.speculative_generate(target, draft, prompt, ex["max_new_tokens"], ex["k"])
        return got[0] if tokens_only else got
    return call
