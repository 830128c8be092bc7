"""Kata 23's serve_chunked under test: drawn workloads, the learner's call, its tokens judged against each
request generated alone (uncached forwards of the tiny float64 Llama, ties within 1e-9 accept either
token), and the (token, position) pairs each step's forward must carry, by the model of the policy."""
from __future__ import annotations

import math
import numbers
from collections import Counter

import torch
from hypothesis import strategies as st

from grader.checks.k23_programs import LIMITS, Policy, Req
from grader.checks.support import protocol
from grader.checks.support.common import SEEDS
from grader.checks.support.models import TIE, TINY, first_wrong


@st.composite
def workloads(draw, max_requests=5, few_blocks=None):
    """Requests (id, prompt length, max_new_tokens, arrival), limits with budgets down to max_num_seqs
    and caps that cut prompts; blocks plenty, or few enough that requests are preempted."""
    n = draw(st.integers(1, max_requests))
    bs = draw(st.integers(1, 4))
    lens = [(draw(st.integers(1, 14)), draw(st.integers(1, 5))) for _ in range(n)]
    need = math.ceil(max(p + m - 1 for p, m in lens) / bs)
    few = draw(st.booleans()) if few_blocks is None else few_blocks
    blocks = draw(st.integers(need, need + 2)) if few else draw(st.integers(need * n, need * n + 4))
    seqs = draw(st.integers(1, 4))
    return {"requests": [(i, p, m, draw(st.integers(0, 5))) for i, (p, m) in enumerate(lens)],
            "num_blocks": blocks, "block_size": bs, "max_num_seqs": seqs,
            "max_num_batched_tokens": draw(st.integers(seqs, seqs + 6)),
            "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 1, 2, 4])), "seed": draw(SEEDS)}


def requests_of(ex) -> list[tuple]:
    """The example's requests with their prompts: drawn from the seed, or written out as a list."""
    g = torch.Generator().manual_seed(ex["seed"] + 1)
    return [(r, list(p) if isinstance(p, list) else torch.randint(0, TINY["vocab_size"], (p,), generator=g).tolist(),
             m, a) for r, p, m, a in ex["requests"]]


def limits_of(ex) -> dict:
    return {k: ex.get(k, 0) for k in LIMITS}


def raw_serve(c, ex, model, requests, eos=None):
    """The learner's serve_chunked, its result as returned; it must leave ``requests`` as it was."""
    before = protocol.snapshot(requests)
    limits = {k: v for k, v in limits_of(ex).items() if k in ex}  # no cap given: the default, 0, must be no cap
    got = c.t.serve_chunked(model, requests, **limits, eos_token_id=eos)
    if requests != before:
        c.fail(f"serve_chunked changed its requests argument: {before} became {requests}; the caller's inputs are "
               "left unchanged", ex, ("changed requests",))
    return got


def tokens(c, ex, requests, got) -> dict:
    """The result, checked to be {req_id: list of int ids} for every request."""
    ids = [r for r, *_ in requests]
    if not isinstance(got, dict) or sorted(got, key=str) != sorted(ids, key=str):
        c.fail(f"serve_chunked should return a dict with one entry per request id {ids}; got {type(got).__name__}"
               f"{' with keys ' + str(list(got)) if isinstance(got, dict) else ''}", ex, ("returned", type(got).__name__))
    for r, row in got.items():
        if not isinstance(row, list) or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in row):
            c.fail(f"the tokens of request {r!r} should be a list of int ids; got {type(row).__name__}", ex, ("row", r))
    return {r: [int(t) for t in got[r]] for r in ids}


@torch.no_grad()
def verify(c, ex, model, requests, got, eos=None) -> None:
    """Each request's tokens against the request alone (tie-aware), and how many there are."""
    shown = {**ex, **({"eos_token_id": eos} if eos is not None else {})}
    for r, prompt, n, _ in requests:
        row = got[r]
        wrong = first_wrong(model, prompt, row, eos, TIE)
        if wrong is not None and wrong[0] == "token":
            _, i, token, best, _ = wrong
            c.fail(f"request {r} (prompt of {len(prompt)} tokens), new token {i}: you produced {token}, but one "
                   f"prefill of that request alone gives {best}\n  all your tokens: {got}", shown, got)
        if wrong is not None:
            c.fail(f"request {r}: new token {wrong[1]} is the EOS {eos}, but it goes on with {row[wrong[1] + 1:]}\n"
                   f"  all your tokens: {got}", shown, got)
        if len(row) > n or (len(row) < n and (eos is None or eos not in row)):
            c.fail(f"request {r}: {len(row)} new tokens, expected {n}\n  all your tokens: {got}", shown, got)


def expected_steps(ex) -> list[tuple]:
    """Each step the policy schedules when no request stops early: (decode ids, prefill chunks, what its
    forward must carry as (request, start, count) slices of prompt + new tokens)."""
    state = Policy(*limits_of(ex).values())
    arrivals = sorted((r for r in ex["requests"] if r[2] > 0), key=lambda r: r[3])
    steps, step_no = [], 0
    while arrivals or state.reqs:
        if not state.reqs:
            step_no = max(step_no, arrivals[0][3])
        while arrivals and arrivals[0][3] <= step_no:
            r, p, m, _ = arrivals.pop(0)
            state.reqs[r] = Req(p, m, 0)
            state.waiting.append(r)
        decode, prefill, preempted = state.decide()
        fed = [(r, state.reqs[r].computed, 1) for r in decode] + list(prefill)
        state.apply(decode, prefill, preempted)
        if decode or prefill:
            steps.append((decode, prefill, fed))
        for r in [r for r in state.running if state.reqs[r].generated == state.reqs[r].max_new_tokens]:
            state.remove(r)
        step_no += 1
    return steps


def missing_pairs(call, fed, requests, got) -> list[tuple]:
    """The (token id, position) pairs the step must carry that its forward's input_ids and position_ids lack."""
    whole = {r: prompt + got[r] for r, prompt, *_ in requests}
    need = Counter((whole[r][p], p) for r, start, n in fed for p in range(start, start + n))
    ids, pos = call["ids"], call["positions"]
    pos = torch.arange(ids.shape[-1]) if pos is None else pos  # the model's default: 0 … T - 1 in every row
    return sorted((need - Counter(zip(ids.flatten().tolist(), pos.expand_as(ids).flatten().tolist()))).elements())
