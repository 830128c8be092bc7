"""Hidden checks of kata 13 — continuous batching with preemption.

The scheduler replays drawn programs of arrivals, ``schedule()`` calls and finishes (see
``scheduler_programs``), judged step by step against a plain-Python model of the policy and, on
their own, by the policy's invariants. ``serve`` drives the tiny float64 Llama of kata 08's
checks; every request's tokens are compared with the request generated alone by uncached
forwards (ties within 1e-9 accept either token), and a recording model counts the forwards.
"""
from __future__ import annotations

import math
import numbers
from collections import Counter

import torch
from hypothesis import strategies as st

from grader.checks.support import devices, protocol
from grader.checks.support.common import SEEDS, expect_value_error, tiny_llama
from grader.checks.support.models import (DEVICE_MODEL, TIE, TINY, Recording, SpyCache, first_wrong, greedy_alone,
                                          tiny_model)
from grader.checks.k13_programs import PINNED, Replay, Request, State, large_program, programs
from grader.checks.k13_protocol import scheduler_programs, serve_programs
from grader.engine import Checks, Failure
from grader.nn import Llama, LlamaConfig

CHECKS = Checks("13")
LIMITS = ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens")
LARGE = large_program(0)
# Once past the drawn sizes: 16 query heads over 4 KV heads, blocks of 16. A prompt of 270 tokens runs
# beside a short one until the short one's next block leaves none: the long one (the newest) is preempted
# and recomputed as 273 tokens (positions past 256); then 16 short requests arrive and run together.
LARGE_SERVE = {"requests": [(0, 14, 6, 0), (1, 270, 6, 0)] + [(i, 3 + i % 8, 2 + i % 5, 12) for i in range(2, 18)],
               "num_blocks": 19, "block_size": 16, "max_num_seqs": 16, "max_num_batched_tokens": 280, "seed": 21,
               "model": {"num_attention_heads": 16, "num_key_value_heads": 4, "hidden_size": 32,
                         "intermediate_size": 32, "max_position_embeddings": 512}}


# -- the scheduler ----------------------------------------------------------------------------------
def _replay(judge):
    def body(c, ex):
        Replay(c, ex, judge).run()
    return body




@CHECKS.add("Scheduler decisions equal the policy's, step by step, through random programs", uses="Scheduler.schedule")
def matches_the_policy(ctx):
    ctx.forall(programs(), _replay("reference"), max_examples=50)
    ctx.forall(programs(blocks=(2, 4), max_ops=30), _replay("reference"), max_examples=30)
    ctx.forall(programs(blocks=(16, 40), max_ops=30), _replay("reference"), max_examples=30)  # the budget binds
    ctx.forall(programs(blocks=(2, 8), max_ops=30, cancels=True), _replay("reference"), max_examples=15)
    ctx.case(LARGE, _replay("reference"))


@CHECKS.add("the policy's invariants hold on the scheduler's own decisions (blocks, limits, FCFS, victims)",
            uses="Scheduler.schedule")
def keeps_the_invariants(ctx):
    ctx.forall(programs(blocks=(2, 6), max_ops=30), _replay("invariants"), max_examples=40)
    ctx.forall(programs(blocks=(16, 40), max_ops=30), _replay("invariants"), max_examples=30)
    ctx.case(LARGE, _replay("invariants"))


@CHECKS.add("worked cases: a short request waits behind a long one; the newest is preempted and goes first again",
            uses="Scheduler.schedule")
def worked_cases(ctx):
    for program in PINNED:
        ctx.case(program, _replay("reference"))


def _scheduler_cases(c, ex):
    S = c.t.Scheduler
    cases = [
        ("Scheduler(4, 2, 3, 2): max_num_batched_tokens below max_num_seqs", S, (4, 2, 3, 2),
         ("max_num_batched_tokens",)),
        ("Scheduler(4, 2, 9, 8): max_num_seqs above max_num_batched_tokens", S, (4, 2, 9, 8),
         ("max_num_batched_tokens", "max_num_seqs")),
        ("Scheduler(0, 2, 1, 8)", S, (0, 2, 1, 8), ("num_blocks",)),
        ("Scheduler(4, 0, 1, 8)", S, (4, 0, 1, 8), ("block_size",)),
        ("Scheduler(4, -2, 1, 8)", S, (4, -2, 1, 8), ("block_size",)),
        ("Scheduler(4, 2, 0, 8)", S, (4, 2, 0, 8), ("max_num_seqs",)),
        ("Scheduler(2.5, 2, 1, 8), a float", S, (2.5, 2, 1, 8), ("num_blocks",)),
        ("Scheduler(4, 1.5, 1, 8), a float", S, (4, 1.5, 1, 8), ("block_size",)),
        ("Scheduler(4, 2, 1.5, 8), a float", S, (4, 2, 1.5, 8), ("max_num_seqs",)),
        ("Scheduler(4, 2, 1, 8.5), a float", S, (4, 2, 1, 8.5), ("max_num_batched_tokens",)),
    ]
    sched = S(4, 2, 2, 6)
    sched.add_request("a", 3, 2)
    cases += [
        ("add_request('a', 2, 2) when 'a' is already there", sched.add_request, ("a", 2, 2), ("req_id",)),
        ("add_request('b', 2, 0)", sched.add_request, ("b", 2, 0), ("max_new_tokens",)),
        ("add_request('b', 0, 2)", sched.add_request, ("b", 0, 2), ("prompt_len",)),
        ("add_request('b', -1, 2)", sched.add_request, ("b", -1, 2), ("prompt_len",)),
        ("add_request('b', 2.5, 2), a float prompt_len", sched.add_request, ("b", 2.5, 2), ("prompt_len",)),
        ("add_request('b', 2, 1.5), a float max_new_tokens", sched.add_request, ("b", 2, 1.5), ("max_new_tokens",)),
        ("add_request('b', 5, 3): 7 tokens exceed max_num_batched_tokens = 6", sched.add_request, ("b", 5, 3),
         ("prompt_len", "max_new_tokens")),
        ("add_request('b', 1, 7): 7 tokens exceed max_num_batched_tokens = 6", sched.add_request, ("b", 1, 7),
         ("prompt_len", "max_new_tokens")),
        ("finish('z') of a request never added", sched.finish, ("z",), ("req_id",)),
    ]
    wide = S(3, 2, 2, 20)
    cases.append(("add_request('c', 6, 2) on Scheduler(3, 2, 2, 20): 7 tokens need 4 blocks of 3",
                  wide.add_request, ("c", 6, 2), ("prompt_len", "max_new_tokens")))
    return cases, sched


@CHECKS.add("bad input raises ValueError naming the argument; a refused call changes nothing",
            uses="Scheduler.__init__")
def scheduler_rejects_bad_input(ctx):
    def body(c, ex):
        cases, sched = _scheduler_cases(c, ex)
        for what, fn, args, names in cases:
            expect_value_error(c, fn, *args, what=what, names=names, example=ex)
        steps = []
        for _ in range(3):
            step = sched.schedule()
            steps.append((list(step.prefill), list(step.decode), list(step.preempted)))
        if steps != [(["a"], [], []), ([], ["a"], []), ([], ["a"], [])]:
            c.fail(f"after the refused calls, a scheduler holding only request 'a' (3 + 2 tokens) scheduled "
                   f"{steps}; expected a prefill of 'a', then its decodes", ex, ("refused call changed", str(steps)))
        sched.finish("a")
        c.raises(ValueError, sched.finish, "a", what="finish('a') a second time", example=ex)

    ctx.case({"case": "bad arguments"}, body)


@CHECKS.add("a Step is the caller's: held or overwritten, the next decisions do not change; two schedulers keep apart",
            uses="Scheduler.schedule")
def steps_are_the_callers(ctx):
    for what, run in scheduler_programs():
        ctx.case({"case": what}, lambda c, ex, run=run, what=what: c.differential(ex, run, what))


# -- serve ----------------------------------------------------------------------------------------
@st.composite
def workloads(draw, max_requests=6, few_blocks=None):
    n = draw(st.integers(1, max_requests))
    bs = draw(st.integers(1, 4))
    lens = [(draw(st.integers(1, 12)), draw(st.integers(1, 6))) for _ in range(n)]
    longest = max(p + m - 1 for p, m in lens)
    need = math.ceil(longest / bs)
    few = draw(st.booleans()) if few_blocks is None else few_blocks
    blocks = draw(st.integers(need, need + 2)) if few else draw(st.integers(need * n, need * n + 4))
    seqs = draw(st.integers(1, 4))
    return {"requests": [(i, p, m, draw(st.integers(0, 6))) for i, (p, m) in enumerate(lens)],
            "num_blocks": blocks, "block_size": bs, "max_num_seqs": seqs,
            "max_num_batched_tokens": draw(st.integers(max(seqs, longest), longest + 12)), "seed": draw(SEEDS)}


def _requests(ex) -> list[tuple]:
    """The example's requests with their prompts: drawn from the seed, or written out as a list."""
    g = torch.Generator().manual_seed(ex["seed"] + 1)
    return [(r, list(p) if isinstance(p, list) else torch.randint(0, TINY["vocab_size"], (p,), generator=g).tolist(),
             m, a) for r, p, m, a in ex["requests"]]


def _raw_serve(c, ex, model, requests, eos=None):
    """The learner's serve, its result as returned; it must leave ``requests`` as it was (SPEC)."""
    before = protocol.snapshot(requests)
    got = c.t.serve(model, requests, **{k: ex[k] for k in LIMITS}, eos_token_id=eos)
    if requests != before:
        c.fail(f"serve changed its requests argument: {before} became {requests}; the caller's inputs are left "
               "unchanged (copy a prompt before extending it)", ex, ("changed requests",))
    return got


def _serve(c, ex, model, requests, eos=None):
    return _tokens(c, ex, requests, _raw_serve(c, ex, model, requests, eos))


def _tokens(c, ex, requests, got):
    """serve's result, checked to be {req_id: list of int ids} for every request, as plain ints."""
    ids = [r for r, *_ in requests]
    if not isinstance(got, dict) or sorted(got, key=str) != sorted(ids, key=str):
        c.fail(f"serve should return a dict with one entry per request id {ids}; got "
               f"{type(got).__name__}{' with keys ' + str(list(got)) if isinstance(got, dict) else ''}", ex,
               ("returned", type(got).__name__))
    for r, row in got.items():
        if not isinstance(row, list) or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                                for t in row):
            c.fail(f"the tokens of request {r!r} should be a list of int ids; got {type(row).__name__}", ex,
                   ("row type", r))
    return {r: [int(t) for t in got[r]] for r in ids}


@torch.no_grad()
def _verify(c, ex, model, requests, got, eos=None):
    """Each request's tokens against the request alone, by uncached forwards (tie-aware), and its length."""
    shown = {**ex, **({"eos_token_id": eos} if eos is not None else {})}
    for r, prompt, n, _ in requests:
        row = got[r]
        wrong = first_wrong(model, prompt, row, eos, TIE)
        if wrong is not None and wrong[0] == "token":
            _, i, token, best, _ = wrong
            c.fail(f"request {r} (prompt of {len(prompt)} tokens), new token {i}: you produced {token}, but "
                   f"the model on that request alone gives {best}\n  all your tokens: {got}", shown, got)
        if wrong is not None:
            i = wrong[1]
            c.fail(f"request {r}: new token {i} is the EOS {eos}, but it goes on with {row[i + 1:]}\n"
                   f"  all your tokens: {got}", shown, got)
        if len(row) > n or (len(row) < n and (eos is None or eos not in row)):
            c.fail(f"request {r}: {len(row)} new tokens, expected {n} (max_new_tokens"
                   f"{', as it produced no EOS' if len(row) < n else ''})\n  all your tokens: {got}", shown, got)


def _model(c, ex):
    """The tiny float64 Llama, or one with the fields of ``ex["model"]`` replaced (16 heads, say)."""
    return tiny_llama(ex["seed"], c.device, cls=Recording, **ex.get("model", {}))


def _check_serve(c, ex, eos_from=None):
    model, requests = _model(c, ex), _requests(ex)
    eos = ex.get("eos_token_id")
    if eos_from is not None:  # a token request 0 really produces, at its second step
        alone = greedy_alone(model, requests[0][1], 2)
        eos = alone[-1]
    got = _serve(c, ex, model, requests, eos)
    _verify(c, ex, model, requests, got, eos)
    return model, requests, got


@CHECKS.add("serve gives every request the tokens it gets alone, with plenty of blocks and staggered arrivals",
            uses="serve")
def serve_matches_each_request_alone(ctx):
    ctx.forall(workloads(few_blocks=False), lambda c, ex: _check_serve(c, ex), max_examples=12)


@CHECKS.add("serve under memory pressure: preempted requests are recomputed and still get their own tokens",
            uses="serve")
def serve_with_preemption(ctx):
    pinned = {"requests": [(0, 5, 6, 0), (1, 6, 6, 0), (2, 3, 4, 1)], "num_blocks": 6, "block_size": 2,
              "max_num_seqs": 3, "max_num_batched_tokens": 16, "seed": 11}  # 6 blocks of 2: 1 and 2 are preempted
    ctx.case(pinned, lambda c, ex: _check_serve(c, ex))
    ctx.forall(workloads(few_blocks=True), lambda c, ex: _check_serve(c, ex), max_examples=15)
    ctx.case(LARGE_SERVE, lambda c, ex: _check_serve(c, ex))


@CHECKS.add("serve stops a request after its EOS (included); the others go on", uses="serve")
def serve_stops_at_eos(ctx):
    ctx.forall(workloads(), lambda c, ex: _check_serve(c, ex, eos_from=0), max_examples=10)
    # Token id 0 as the EOS (many vocabularies number their special tokens first): alone, request 1 makes 0
    # first, at its prefill, and request 0 at its fourth token; 8 blocks of 2 are too few for all three.
    ctx.case({"requests": [(0, 4, 6, 0), (1, 3, 6, 0), (2, 5, 6, 1)], "num_blocks": 8, "block_size": 2,
              "max_num_seqs": 3, "max_num_batched_tokens": 12, "seed": 12, "eos_token_id": 0},
             lambda c, ex: _check_serve(c, ex))


def _expected_steps(ex) -> list[tuple]:
    """Each step that schedules something, by the policy, when no request stops early:
    (prefill ids, decode ids, what its forward must feed: (request, start, count) slices of the
    request's prompt + new tokens, a prefill's whole recompute and a decode's last token)."""
    state = State(*[ex[k] for k in LIMITS])
    arrivals = sorted((r for r in ex["requests"] if r[2] > 0), key=lambda r: r[3])
    steps, step_no = [], 0
    while arrivals or state.requests:
        if not state.requests:
            step_no = max(step_no, arrivals[0][3])
        while arrivals and arrivals[0][3] <= step_no:
            r, p, m, _ = arrivals.pop(0)
            state.requests[r] = Request(p, m)
            state.waiting.append(r)
        prefill, decode, preempted = state.decide()
        fed = [(r, 0, state.prefill_tokens(r)) for r in prefill] + [(r, state.prefill_tokens(r) - 1, 1) for r in decode]
        state.apply(prefill, decode, preempted)
        if prefill or decode:
            steps.append((prefill, decode, fed))
        for r in [r for r in state.running if state.requests[r].generated == state.requests[r].max_new_tokens]:
            state.finish(r)
        step_no += 1
    return steps


def _missing(call, fed, requests, got) -> list[int]:
    """The token ids the step must feed that its forward's input_ids do not hold (as a multiset)."""
    whole = {r: prompt + got[r] for r, prompt, *_ in requests}
    need = Counter(t for r, start, n in fed for t in whole[r][start:start + n])
    return sorted((need - Counter(call["ids"].flatten().tolist())).elements())


@CHECKS.add("one batched model forward per scheduled step, prefills and decodes together, in any layout",
            uses="serve")
def one_forward_per_step(ctx):
    """What a forward shows whatever its layout (a row per request, padded; or one packed row with a
    block-diagonal mask): how many forwards ran, and the tokens each carried."""
    def body(c, ex):
        model, requests, got = _check_serve(c, ex)
        steps = _expected_steps(ex)
        calls = [tuple(call["ids"].shape) for call in model.calls]
        if len(calls) != len(steps):
            c.fail(f"the scheduler made {len(steps)} step(s) (prefills + decodes: "
                   f"{[len(p) + len(d) for p, d, _ in steps]} requests each); your serve called the model "
                   f"{len(calls)} time(s) with input_ids of shapes {calls}: expected one forward per step",
                   ex, ("forwards", len(calls)))
        for i, ((prefill, decode, fed), call) in enumerate(zip(steps, model.calls)):
            shape, size = tuple(call["ids"].shape), call["ids"].numel()
            missing = _missing(call, fed, requests, got)
            if missing:
                c.fail(f"step {i} prefills {prefill} (each its prompt and the tokens it made so far) and decodes "
                       f"{decode} (each its last token), but its forward, input_ids of shape {shape}, lacks the "
                       f"token id(s) {missing}", ex, ("tokens missing", i))
            if not prefill and size != len(decode):
                n = len(decode)
                forms = " or ".join(str(f) for f in sorted({(n, 1), (1, n)}))
                c.fail(f"step {i} only decodes ({n} request(s)) yet fed input_ids of shape {shape}: a decode feeds "
                       f"its last token only, the rest is in the cache, so the step feeds {n} token(s), as {forms}",
                       ex, ("decode width", i, size))
            if call["cache"] is None:
                c.fail(f"forward {i} ran without a cache", ex, ("no cache", i))
            positions = call["positions"]
            if positions is not None and positions.is_floating_point():
                c.fail(f"forward {i} got position_ids of dtype {positions.dtype}: positions are integers, like the "
                       "token ids (a model may look them up in a table)", ex, ("position dtype", str(positions.dtype)))

    ctx.forall(workloads(max_requests=5), body, max_examples=10)
    # 0 makes its last token at step 2, the step 1 arrives; 1 needs all 3 blocks: it runs from step 3 on.
    ctx.case({"requests": [(0, 3, 3, 0), (1, 5, 2, 2)], "num_blocks": 3, "block_size": 2, "max_num_seqs": 2,
              "max_num_batched_tokens": 6, "seed": 6}, body)


@CHECKS.add("max_new_tokens = 0 gives [] without scheduling; a lone request; arrivals after an idle gap",
            uses="serve")
def serve_edge_cases(ctx):
    def body(c, ex):
        model, requests, got = _check_serve(c, ex)
        if ex["requests"][0][2] == 0 and got[0] != []:
            c.fail(f"request 0 asks for 0 new tokens and got {got[0]}", ex, ("zero", tuple(got[0])))

    ctx.case({"requests": [(0, 4, 0, 0), (1, 3, 3, 0)], "num_blocks": 4, "block_size": 2, "max_num_seqs": 2,
              "max_num_batched_tokens": 8, "seed": 3}, body)
    ctx.case({"requests": [(0, 7, 5, 3)], "num_blocks": 3, "block_size": 4, "max_num_seqs": 1,
              "max_num_batched_tokens": 11, "seed": 4}, body)
    ctx.case({"requests": [(0, 2, 3, 0), (1, 3, 2, 40), (2, 2, 0, 41)], "num_blocks": 4, "block_size": 2,
              "max_num_seqs": 2, "max_num_batched_tokens": 6, "seed": 5}, body)
    # The first and last valid values: ids 0 and V - 1, one new token, arrival 0, request ids 0, "b" and 10,
    # and a request of 6 + 1 - 1 tokens that fills the 3 blocks of 2 and the budget of 6 exactly.
    V = TINY["vocab_size"]
    ctx.case({"requests": [(0, [0, V - 1, 0, V - 1, 0], 1, 0), ("b", 6, 1, 0), (10, [V - 1], 3, 0)], "num_blocks": 3,
              "block_size": 2, "max_num_seqs": 1, "max_num_batched_tokens": 6, "seed": 7}, body)


def _bad_requests() -> list[tuple]:
    """(what, requests, names): requests ``serve`` must refuse before its first forward. The late ones arrive
    after a good request has run: refused only if every request is checked before anything runs."""
    V = TINY["vocab_size"]
    return [
        ("two requests with the same id", [(0, [1, 2], 2, 0), (0, [3], 2, 0)], ("requests", "req_id")),
        ("max_new_tokens = -1", [(0, [1, 2], -1, 0)], ("max_new_tokens", "requests")),
        ("max_new_tokens = 1.5", [(0, [1, 2], 1.5, 0)], ("max_new_tokens", "requests")),
        ("a request of 7 + 3 tokens with max_num_batched_tokens = 8", [(0, [1] * 7, 3, 0)],
         ("requests", "prompt_len", "max_new_tokens")),
        ("an item of 3 fields", [(0, [1, 2], 2)], ("requests",)),
        ("an item of 5 fields", [(0, [1, 2], 2, 0, 0)], ("requests",)),
        ("an item that is an int", [(0, [1, 2], 2, 0), 7], ("requests",)),
        ("an empty prompt", [(0, [1], 2, 0), (1, [], 2, 0)], ("requests", "prompt", "prompt_len")),
        (f"a token id {V}, outside a vocabulary of {V}", [(0, [1, V], 2, 0)], ("requests", "prompt")),
        ("a token id -1", [(0, [-1, 2], 2, 0)], ("requests", "prompt")),
        ("a token id 2.5", [(0, [1, 2.5], 2, 0)], ("requests", "prompt")),
        ("arrival_step = -1", [(0, [1, 2], 2, -1)], ("requests", "arrival_step")),
        ("arrival_step = 1.5", [(0, [1, 2], 2, 1.5)], ("requests", "arrival_step")),
        ("a request of 7 + 3 tokens arriving at step 3", [(0, [1, 2], 2, 0), (1, [1] * 7, 3, 3)],
         ("requests", "prompt_len", "max_new_tokens")),
        ("request 0 again, arriving at step 4 (after the first 0 finished)", [(0, [1, 2], 2, 0), (0, [3], 2, 4)],
         ("requests", "req_id")),
        (f"a token id {V} in a request arriving at step 3", [(0, [1, 2], 2, 0), (1, [V], 2, 3)],
         ("requests", "prompt")),
    ]


@CHECKS.add("serve rejects bad input with a ValueError naming the argument", uses="serve")
def serve_rejects_bad_input(ctx):
    def body(c, ex):
        model = tiny_model(1, c.device)
        ok = {"num_blocks": 8, "block_size": 2, "max_num_seqs": 2, "max_num_batched_tokens": 8}
        cases = [(what, requests, ok, names) for what, requests, names in _bad_requests()] + [
            ("max_num_batched_tokens = 1 below max_num_seqs = 2", [(0, [1], 1, 0)],
             {**ok, "max_num_batched_tokens": 1}, ("max_num_batched_tokens",)),
            ("num_blocks = 0", [(0, [1], 1, 0)], {**ok, "num_blocks": 0}, ("num_blocks",)),
            ("num_blocks = 2.5", [(0, [1], 1, 0)], {**ok, "num_blocks": 2.5}, ("num_blocks",)),
            ("block_size = 0", [(0, [1], 1, 0)], {**ok, "block_size": 0}, ("block_size",)),
            ("max_num_seqs = 0", [(0, [1], 1, 0)], {**ok, "max_num_seqs": 0}, ("max_num_seqs",)),
            ("max_num_seqs = 9 above max_num_batched_tokens = 8", [(0, [1], 1, 0)], {**ok, "max_num_seqs": 9},
             ("max_num_batched_tokens", "max_num_seqs")),
        ]
        for what, requests, limits, names in cases:
            expect_value_error(c, c.t.serve, model, requests, what=f"serve with {what}", names=names, example=ex,
                               **limits)
            if model.calls:
                c.fail(f"serve with {what} called the model {len(model.calls)} time(s) before refusing it: check "
                       "every request before the first forward", ex, ("ran", what))

    ctx.case({"case": "bad arguments"}, body)


@CHECKS.add("serve's tokens are the caller's: overwritten or held, the next serve does not change, and the same "
            "serve twice gives its tokens twice", uses="serve")
def serve_results_are_the_callers(ctx):
    def body(c, ex):
        model, a = _model(c, ex), _requests(ex)
        b = [(r, prompt[::-1], n, arrival) for r, prompt, n, arrival in a]  # other prompts: other tokens
        for what, results in serve_programs(lambda: _raw_serve(c, ex, model, a), lambda: _raw_serve(c, ex, model, b)):
            for label, got, whose in results:
                requests = a if whose == "a" else b
                try:
                    _verify(c, ex, model, requests, _tokens(c, ex, requests, got))
                except Failure as failure:
                    raise Failure(f"{what}: {label}:\n  {failure}", failure.observed) from None

    ctx.case({"requests": [(0, 5, 4, 0), (1, 3, 5, 0), (2, 4, 3, 1)], "num_blocks": 6, "block_size": 2,
              "max_num_seqs": 3, "max_num_batched_tokens": 12, "seed": 8}, body)


class _Watched(Recording):
    """Notes the dtypes of the keys and values every cache update returns."""

    def __init__(self, config):
        super().__init__(config)
        self.seen: set = set()

    def forward(self, input_ids, position_ids=None, cache=None, attention_mask=None, **kwargs):
        watched = None if cache is None else _Noting(cache, self.seen)
        return super().forward(input_ids, position_ids, watched, attention_mask, **kwargs)


class _Noting(SpyCache):
    def __init__(self, cache, seen: set):
        super().__init__(cache, [])
        self._seen = seen

    def update(self, layer, k, v):
        K, V = self._cache.update(layer, k, v)
        self._seen.add((K.dtype, V.dtype))
        return K, V


@CHECKS.add("the cache keeps the model's dtype (a float32 model gets float32 keys and values)", uses="serve")
def serve_keeps_the_model_dtype(ctx):
    def body(c, ex):
        model = tiny_model(ex["seed"], c.device, recording=_Watched).to(ex["dtype"])  # half: on the CPU too
        _serve(c, ex, model, _requests(ex))
        seen = model.seen
        if seen != {(ex["dtype"], ex["dtype"])}:
            c.fail(f"the model is {ex['dtype']}; your cache returned keys and values of dtypes {sorted(map(str, seen))}",
                   ex, ("dtype", tuple(sorted(map(str, seen)))))

    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        ctx.case({"requests": [(0, 5, 3, 0), (1, 2, 4, 1)], "num_blocks": 4, "block_size": 2, "max_num_seqs": 2,
                  "max_num_batched_tokens": 8, "dtype": dtype, "seed": 9}, body)


# -- the device -------------------------------------------------------------------------------
def _device_scenario(s):
    model = devices.module_on(s, lambda: Llama(LlamaConfig(**DEVICE_MODEL)), dtype=torch.float64)
    requests = [("a", [5, 9, 2], 3, 0), ("b", [7], 2, 1)]
    s.call("serve(model, [a: 3 tokens, b: 1 token arriving at step 1], num_blocks=8, block_size=2, ...), "
           "the model on the test device", s.ctx.t.serve, model, requests, num_blocks=8, block_size=2,
           max_num_seqs=2, max_num_batched_tokens=8)


@CHECKS.add("serve runs on the model's device (no tensor made on the CPU by accident)", uses="serve")
def keeps_the_device(ctx):
    ctx.case({"requests": 2, "num_blocks": 8, "block_size": 2}, lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))
