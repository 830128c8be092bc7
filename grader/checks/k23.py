"""Hidden checks of kata 23 — chunked prefill.

The scheduler's checks come first (``k23_scheduler``). ``serve_chunked`` drives the tiny float64
Llama: every request's tokens are compared with the request generated alone (``k23_serve``), and a
recording model shows the tokens and positions each step's forward carried.
"""
from __future__ import annotations

import torch

from grader.checks.k23_scheduler import CHECKS
from grader.checks.k23_serve import (expected_steps, missing_pairs, raw_serve, requests_of, tokens, verify,
                                     workloads)
from grader.checks.support import devices
from grader.checks.support.common import expect_value_error, tiny_llama
from grader.checks.support.models import DEVICE_MODEL, TINY, Recording, greedy_alone, tiny_model
from grader.nn import Llama, LlamaConfig

__all__ = ["CHECKS"]
# Past the drawn sizes: 16 query heads over 4 KV heads, blocks of 16, a 300-token prompt read in chunks of
# at most 48 beside short requests that decode all along, and a budget of 64.
LARGE_SERVE = {"requests": [(0, 10, 12, 0), (1, 300, 4, 1)] + [(i, 3 + i % 7, 2 + i % 4, 2 + i) for i in range(2, 10)],
               "num_blocks": 40, "block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 64,
               "long_prefill_token_threshold": 48, "seed": 23,
               "model": {"num_attention_heads": 16, "num_key_value_heads": 4, "hidden_size": 32,
                         "intermediate_size": 32, "max_position_embeddings": 512}}


# -- serve_chunked ---------------------------------------------------------------------------------
def _model(c, ex):
    return tiny_llama(ex["seed"], c.device, cls=Recording, **ex.get("model", {}))


def _check_serve(c, ex, eos_from=None):
    model, requests = _model(c, ex), requests_of(ex)
    eos = ex.get("eos_token_id")
    if eos_from is not None:  # a token request 0 really makes, at its second step
        eos = greedy_alone(model, requests[0][1], 2)[-1]
    got = tokens(c, ex, requests, raw_serve(c, ex, model, requests, eos))
    verify(c, ex, model, requests, got, eos)
    return model, requests, got


@CHECKS.add("serve_chunked gives every request the tokens one prefill of it alone gives, on every schedule",
            uses="serve_chunked")
def serve_matches_each_request_alone(ctx):
    # a 13-token prompt read one token a step (budget = max_num_seqs = 1), then a cap of 2 with a wide budget
    ctx.case({"requests": [(0, 13, 3, 0)], "num_blocks": 8, "block_size": 2, "max_num_seqs": 1,
              "max_num_batched_tokens": 1, "seed": 2}, lambda c, ex: _check_serve(c, ex))
    ctx.case({"requests": [(0, 11, 3, 0), (1, 9, 4, 0), (2, 2, 5, 1)], "num_blocks": 30, "block_size": 3,
              "max_num_seqs": 3, "max_num_batched_tokens": 12, "long_prefill_token_threshold": 2, "seed": 3},
             lambda c, ex: _check_serve(c, ex))
    ctx.forall(workloads(few_blocks=False), lambda c, ex: _check_serve(c, ex), max_examples=15)


@CHECKS.add("serve_chunked under memory pressure: a preempted request restarts from token 0 and still gets its "
            "own tokens", uses="serve_chunked")
def serve_with_preemption(ctx):
    # 6 blocks of 2: 1's prompt is cut into chunks, then preempted mid-way and read again from 0
    ctx.case({"requests": [(0, 5, 6, 0), (1, 7, 3, 0), (2, 3, 4, 1)], "num_blocks": 6, "block_size": 2,
              "max_num_seqs": 3, "max_num_batched_tokens": 4, "seed": 11}, lambda c, ex: _check_serve(c, ex))
    ctx.forall(workloads(few_blocks=True), lambda c, ex: _check_serve(c, ex), max_examples=15)
    ctx.case(LARGE_SERVE, lambda c, ex: _check_serve(c, ex))


@CHECKS.add("serve_chunked stops a request after its EOS (included); the others go on", uses="serve_chunked")
def serve_stops_at_eos(ctx):
    ctx.case({"requests": [(0, 4, 6, 0), (1, 3, 6, 0), (2, 5, 6, 1)], "num_blocks": 8, "block_size": 2,
              "max_num_seqs": 3, "max_num_batched_tokens": 4, "seed": 12, "eos_token_id": 0},
             lambda c, ex: _check_serve(c, ex))
    ctx.forall(workloads(), lambda c, ex: _check_serve(c, ex, eos_from=0), max_examples=8)


@CHECKS.add("one forward per step, carrying every chunk's tokens at positions c … c + n - 1 and every decode's "
            "last token at its position", uses="serve_chunked")
def chunks_at_their_positions(ctx):
    def body(c, ex):
        model, requests, got = _check_serve(c, ex)
        steps = expected_steps(ex)
        if len(model.calls) != len(steps):
            c.fail(f"the policy makes {len(steps)} step(s); your serve_chunked called the model {len(model.calls)} "
                   f"time(s): expected one forward per step", ex, ("forwards", len(model.calls)))
        for i, ((decode, prefill, fed), call) in enumerate(zip(steps, model.calls)):
            missing = missing_pairs(call, fed, requests, got)
            if missing:
                c.fail(f"step {i} decodes {decode} and prefills chunks {prefill} (request, start, n); its forward "
                       f"lacks the (token id, position) pairs {missing[:8]}: a chunk's tokens sit at positions "
                       f"start … start + n - 1", ex, ("pairs missing", i, tuple(missing)))
            if not prefill and call["ids"].numel() != len(decode):
                c.fail(f"step {i} only decodes ({len(decode)} request(s)) yet fed input_ids of shape "
                       f"{tuple(call['ids'].shape)}: one token per decode", ex, ("decode width", i))
            if call["positions"] is not None and call["positions"].is_floating_point():
                c.fail(f"forward {i} got float position_ids: positions are integers", ex, ("position dtype",))

    ctx.forall(workloads(max_requests=4), body, max_examples=10)
    # 1 arrives at step 1 and is read in chunks beside 0's decodes; 2 arrives at step 3, not before; no cap given
    ctx.case({"requests": [(0, 2, 6, 0), (1, 10, 2, 1), (2, 3, 2, 3)], "num_blocks": 20, "block_size": 2,
              "max_num_seqs": 4, "max_num_batched_tokens": 6, "seed": 6}, body)
    # 0 decodes alone at steps 1 and 2; 1 arrives at step 3 and is admitted then, not a step earlier
    ctx.case({"requests": [(0, 2, 6, 0), (1, 3, 2, 3)], "num_blocks": 8, "block_size": 2, "max_num_seqs": 2,
              "max_num_batched_tokens": 6, "seed": 5}, body)


@CHECKS.add("max_new_tokens = 0 gives [] unscheduled; ids 0 and V - 1; every limit at its smallest",
            uses="serve_chunked")
def serve_edge_cases(ctx):
    def body(c, ex):
        _, _, got = _check_serve(c, ex)
        if ex["requests"][0][2] == 0 and got[0] != []:
            c.fail(f"request 0 asks for 0 new tokens and got {got[0]}", ex, ("zero", tuple(got[0])))

    V = TINY["vocab_size"]
    ctx.case({"requests": [(0, 4, 0, 0), (1, 3, 3, 0)], "num_blocks": 4, "block_size": 2, "max_num_seqs": 2,
              "max_num_batched_tokens": 2, "seed": 3}, body)
    ctx.case({"requests": [(0, [0, V - 1, 0, V - 1, 0], 1, 0), ("b", 6, 1, 0), (10, [V - 1], 3, 40)],
              "num_blocks": 3, "block_size": 2, "max_num_seqs": 1, "max_num_batched_tokens": 1,
              "long_prefill_token_threshold": 1, "seed": 7}, body)


def _bad_requests() -> list[tuple]:
    V = TINY["vocab_size"]
    return [
        ("two requests with the same id", [(0, [1, 2], 2, 0), (0, [3], 2, 0)], ("requests", "req_id")),
        ("max_new_tokens = -1", [(0, [1, 2], -1, 0)], ("max_new_tokens", "requests")),
        ("max_new_tokens = 1.5", [(0, [1, 2], 1.5, 0)], ("max_new_tokens", "requests")),
        ("a request of 15 + 3 tokens with 8 blocks of 2", [(0, [1] * 15, 3, 0)],
         ("requests", "prompt_len", "max_new_tokens")),
        ("an item of 3 fields", [(0, [1, 2], 2)], ("requests",)),
        ("an item of 5 fields", [(0, [1, 2], 2, 0, 0)], ("requests",)),
        ("an item that is an int", [(0, [1, 2], 2, 0), 7], ("requests",)),
        ("an empty prompt", [(0, [1], 2, 0), (1, [], 2, 0)], ("requests", "prompt", "prompt_len")),
        (f"a token id {V}", [(0, [1, V], 2, 0)], ("requests", "prompt")),
        ("a token id -1", [(0, [-1, 2], 2, 0)], ("requests", "prompt")),
        ("arrival_step = -1", [(0, [1, 2], 2, -1)], ("requests", "arrival_step")),
        ("arrival_step = 1.5", [(0, [1, 2], 2, 1.5)], ("requests", "arrival_step")),
        (f"a token id {V} in a request arriving at step 3", [(0, [1, 2], 2, 0), (1, [V], 2, 3)], ("requests", "prompt")),
        ("request 0 again, arriving at step 4", [(0, [1, 2], 2, 0), (0, [3], 2, 4)], ("requests", "req_id")),
        ("a request of 15 + 3 tokens (9 blocks of 2, 8 exist) arriving at step 3", [(0, [1, 2], 2, 0), (1, [1] * 15, 3, 3)],
         ("requests", "prompt_len", "max_new_tokens")),
    ]


@CHECKS.add("serve_chunked rejects bad input with a ValueError naming the argument, before any forward",
            uses="serve_chunked")
def serve_rejects_bad_input(ctx):
    def body(c, ex):
        model = tiny_model(1, c.device)
        ok = {"num_blocks": 8, "block_size": 2, "max_num_seqs": 2, "max_num_batched_tokens": 2}
        cases = [(what, requests, ok, names) for what, requests, names in _bad_requests()] + [
            ("max_num_batched_tokens = 1 below max_num_seqs = 2", [(0, [1], 1, 0)],
             {**ok, "max_num_batched_tokens": 1}, ("max_num_batched_tokens",)),
            ("num_blocks = 0", [(0, [1], 1, 0)], {**ok, "num_blocks": 0}, ("num_blocks",)),
            ("block_size = 0", [(0, [1], 1, 0)], {**ok, "block_size": 0}, ("block_size",)),
            ("max_num_seqs = 0", [(0, [1], 1, 0)], {**ok, "max_num_seqs": 0}, ("max_num_seqs",)),
            ("long_prefill_token_threshold = -1", [(0, [1], 1, 0)], {**ok, "long_prefill_token_threshold": -1},
             ("long_prefill_token_threshold",)),
        ]
        for what, requests, limits, names in cases:
            expect_value_error(c, c.t.serve_chunked, model, requests, what=f"serve_chunked with {what}", names=names,
                               example=ex, **limits)
            if model.calls:
                c.fail(f"serve_chunked with {what} called the model {len(model.calls)} time(s) before refusing it",
                       ex, ("ran", what))

    ctx.case({"case": "bad arguments"}, body)


class _DtypeSpy:
    """Between the model and the learner's step cache: notes the dtypes of the keys and values it returns."""

    def __init__(self, cache, seen: set):
        self._cache, self._seen = cache, seen

    def update(self, layer, k, v):
        K, V = self._cache.update(layer, k, v)
        self._seen.add((K.dtype, V.dtype))
        return K, V

    def __getattr__(self, name):
        return getattr(self._cache, name)


class _Watched(Llama):
    def __init__(self, config):
        super().__init__(config)
        self.seen: set = set()

    def forward(self, input_ids, position_ids=None, cache=None, attention_mask=None, **kwargs):
        spy = None if cache is None else _DtypeSpy(cache, self.seen)
        return super().forward(input_ids, position_ids, spy, attention_mask, **kwargs)


@CHECKS.add("the cache keeps the model's dtype (float32, float64, bfloat16, float16)", uses="serve_chunked")
def serve_keeps_the_model_dtype(ctx):
    def body(c, ex):
        model = tiny_model(ex["seed"], c.device, recording=_Watched).to(ex["dtype"])  # half: on the CPU too
        requests = requests_of(ex)
        got = tokens(c, ex, requests, raw_serve(c, ex, model, requests))
        if model.seen != {(ex["dtype"], ex["dtype"])}:
            c.fail(f"the model is {ex['dtype']}; your cache returned keys and values of dtypes "
                   f"{sorted(map(str, model.seen))}", ex, ("dtype", tuple(sorted(map(str, model.seen)))))
        if any(len(got[r]) != m for r, _, m, _ in requests):
            c.fail(f"a {ex['dtype']} model: expected {[m for _, _, m, _ in requests]} tokens, got {got}", ex,
                   ("count", str(ex["dtype"])))

    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        ctx.case({"requests": [(0, 7, 3, 0), (1, 2, 4, 1)], "num_blocks": 8, "block_size": 2, "max_num_seqs": 2,
                  "max_num_batched_tokens": 3, "dtype": dtype, "seed": 9}, body)


def _device_scenario(s):
    model = devices.module_on(s, lambda: Llama(LlamaConfig(**DEVICE_MODEL)), dtype=torch.float64)
    requests = [("a", [5, 9, 2, 7, 1], 3, 0), ("b", [7], 2, 1)]
    s.call("serve_chunked(model, [a: 5 tokens, b: 1 token at step 1], num_blocks=8, block_size=2, budget 2), the "
           "model on the test device", s.ctx.t.serve_chunked, model, requests, num_blocks=8, block_size=2,
           max_num_seqs=2, max_num_batched_tokens=2)


@CHECKS.add("serve_chunked runs on the model's device (no tensor made on the CPU by accident)", uses="serve_chunked")
def keeps_the_device(ctx):
    ctx.case({"requests": 2, "num_blocks": 8, "block_size": 2},
             lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))
