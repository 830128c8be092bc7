"""Runs of ``packed_generate`` for kata 15's checks: a tiny float64 Llama that notes every call (its
input ids, positions and attention mask), drawn prompts, and what the calls must show: one packed row
per call (B = 1), the prefill of every prompt first, then one token for each sequence still running,
each at its own position, with a block-diagonal mask of the right size. The tokens are judged against
plain greedy decoding of each prompt alone (uncached forwards, ties within 1e-9 accepted).
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks.support import envelope
from grader.checks.support.common import SEEDS
from grader.checks.support.models import Recording, first_wrong, greedy_alone, tiny_model


class MaskRecording(Recording):
    """The tiny Llama, noting the attention mask of every call too."""

    def forward(self, input_ids, position_ids=None, cache=None, attention_mask=None, **kwargs):
        mask = None if attention_mask is None else attention_mask.detach().cpu()
        out = super().forward(input_ids, position_ids, cache, attention_mask, **kwargs)
        self.calls[-1]["mask"] = mask
        return out


@st.composite
def runs(draw, max_prompts: int = 5):
    """1 to ``max_prompts`` prompts of 1 to 10 tokens, a budget of 1 to 7 tokens, an EOS now and then."""
    lengths = draw(st.lists(st.integers(1, 10), min_size=1, max_size=max_prompts))
    return {"lengths": lengths, "max_new_tokens": draw(st.integers(1, 7)), "eos": draw(st.booleans()),
            "seed": draw(SEEDS)}


def prompts_of(ex: dict, vocab: int = 48) -> list[list[int]]:
    if "prompts" in ex:
        return [list(p) for p in ex["prompts"]]
    g = torch.Generator().manual_seed(ex["seed"] + 1)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in ex["lengths"]]


def eos_of(model, prompts: list[list[int]], ex: dict):
    """An EOS that ends one prompt early: the third new token of the first prompt alone, when asked for."""
    if not ex.get("eos"):
        return ex.get("eos_token_id")
    return greedy_alone(model, prompts[0], 3)[-1]


def run(c, ex: dict):
    """(model, prompts, eos, tokens): the learner's packed_generate on a spied tiny Llama."""
    model = tiny_model(ex["seed"] % 7, c.device, MaskRecording)
    if ex.get("near_tie"):  # every greedy pick 1e-8 above the next lower id: distinct in float64 only
        envelope.near_tie(model)
    prompts = prompts_of(ex)
    eos = eos_of(model, prompts, ex)
    given = [list(p) for p in prompts]
    tokens = c.t.packed_generate(model, given, ex["max_new_tokens"], eos_token_id=eos)
    if given != prompts:
        c.fail(f"packed_generate changed the caller's prompts: {prompts} became {given}", ex, ("prompts changed",))
    if not isinstance(tokens, list) or len(tokens) != len(prompts) or not all(
            isinstance(t, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in t) for t in tokens):
        c.fail(f"packed_generate should return a list of {len(prompts)} lists of int token ids, got {tokens!r}",
               ex, ("returned", repr(tokens)[:80]))
    return model, prompts, eos, tokens


def verify(c, model, prompts, eos, tokens, ex) -> None:
    """Each prompt's tokens are its own greedy tokens, up to the budget or an EOS (kept)."""
    budget = ex["max_new_tokens"]
    for i, (prompt, row) in enumerate(zip(prompts, tokens)):
        wrong = first_wrong(model, prompt, row, eos)
        if wrong is not None and wrong[0] == "eos":
            c.fail(f"prompt {i} {prompt}: tokens {row} go on after the EOS {eos} at new token {wrong[1]}; a sequence "
                   "stops right after its EOS (kept)", ex, ("after eos", i))
        if wrong is not None:
            _, at, token, best, _ = wrong
            c.fail(f"prompt {i} {prompt}: new token {at} is {token}, but greedy decoding of this prompt alone gives "
                   f"{best} there (your tokens {row}); each sequence must get exactly the tokens it gets alone",
                   ex, ("token", i, at, token))
        ended = bool(row) and eos is not None and row[-1] == eos
        if len(row) > budget or (len(row) < budget and not ended):
            c.fail(f"prompt {i} {prompt}: {len(row)} new tokens {row}, expected {budget} (max_new_tokens) unless an "
                   f"EOS ({eos}) ends it sooner", ex, ("length", i, len(row)))


def row_problem(calls: list[dict], prompts: list[list[int]], tokens: list[list[int]]) -> tuple[str, tuple] | None:
    """What the model's calls show against one packed row per step, or None when they agree."""
    steps = max((len(t) for t in tokens), default=0)
    if len(calls) != steps:
        return (f"the model was called {len(calls)} times for {steps} steps; expected one packed prefill, then one "
                "packed decode row per step", ("calls", len(calls), steps))
    for j, call in enumerate(calls):
        live = [i for i, t in enumerate(tokens) if len(t) > j]
        if j == 0:
            want = sorted(p for i in live for p in range(len(prompts[i])))
            keys = sum(len(prompts[i]) for i in live)
            seen = sum(len(prompts[i]) * (len(prompts[i]) + 1) // 2 for i in live)
        else:
            want = sorted(len(prompts[i]) + j - 1 for i in live)
            keys = seen = sum(len(prompts[i]) + j for i in live)
        step = "the prefill" if j == 0 else f"decode step {j}"
        ids, positions, mask = call["ids"], call["positions"], call.get("mask")
        if ids.shape[0] != 1 or ids.shape[1] != len(want):
            return (f"{step} fed input_ids of shape {tuple(ids.shape)}; expected one packed row (1, {len(want)}): "
                    f"{'every prompt' if j == 0 else 'one token of each sequence still running'}, no padding",
                    ("row shape", j, tuple(ids.shape)))
        if positions is None or sorted(positions.reshape(-1).tolist()) != want:
            got = None if positions is None else positions.reshape(-1).tolist()
            return (f"{step} fed positions {got}; expected (in any order of the sequences) {want}: each sequence's "
                    "tokens at its own positions, restarting at its cache length", ("positions", j))
        if mask is None or tuple(mask.shape) != (1, len(want), keys) or int(mask.sum()) != seen:
            got = None if mask is None else (tuple(mask.shape), int(mask.sum()))
            return (f"{step} passed attention_mask (shape, entries that may attend) = {got}; expected "
                    f"{((1, len(want), keys), seen)}: the block-diagonal mask of the row, causal inside each block, "
                    "over the keys of the sequences in the row only", ("mask", j, got))
    return None
