"""Hidden checks of kata 16 — disaggregated prefill and decode over torch.distributed.

Task 1's pure functions are checked in ``k16_protocol`` (the same list). The workers run in two real
gloo processes on the loopback interface (``grader.checks.support.gloo``): each facing the grader's
own peer, written from the README's wire format (``k16_peers``), then both facing each other. What
went over the wire is compared with the model's own keys and values for the prompt (a plain cache in
this process), the bytes with kata 04's formula, the tokens with single-process greedy generation
(kata 08's rules), and the layer-wise mode's timeline of updates, sends and waits with the README's rules.
"""
from __future__ import annotations

from grader.checks.k16_peers import prefill_alone, raised
from grader.checks.k16_protocol import CHECKS
from grader.checks.k16_runs import (both_exchange, decode_exchange, exchanges, judge_decode_forwards, judge_stats,
                                    judge_tokens, prefill_exchange, wire_bytes)
from grader.checks.k16_rules import bad_calls, bad_header_outcome, judge_in_flight, judge_layerwise, BAD_HEADERS
from grader.checks.support.common import value_error_names

__all__ = ["CHECKS"]
BASE = {"seed": 3, "prompt_len": 5, "layers": 2, "heads": (4, 2), "max_new_tokens": 6, "eos": "none"}
LARGE = {"prompt_len": 260, "heads": (16, 4), "layers": 1}  # positions past 256, 16 query heads of width 2


def _prefill_body(c, ex):
    r = prefill_exchange(c, c.t, ex)
    P, model = len(r["prompt"]), r["model"]
    if not ex.get("layerwise"):  # whole-cache (the default): one forward, then every message
        kinds = [e[0] for e in r["events"]]
        last = max((i for i, kind in enumerate(kinds) if kind == "update"), default=-1)
        if any(kind in ("send", "isend") for kind in kinds[:last]):
            c.fail("whole-cache mode (layerwise=False, the default) sends nothing before the forward is over: "
                   f"your timeline was {' → '.join(f'{e[0]} {e[1]}' for e in r['events'] if e[0] != 'forward')}",
                   ex, ("sent during the forward",))
    stats, wire = judge_stats(c, ex, model, P, r["stats"]), r["wire"]
    if wire["kv"] is None:
        c.fail(f"the header the grader received, {wire['header']}, is not the README's (magic {0x4B563136}, "
               "version 1, sizes >= 1, a known dtype code)", ex, ("header", wire["header"]))
    sent = sum(t.numel() * t.element_size() for t in wire["kv"])
    if sent != wire_bytes(model, P):
        c.fail(f"{sent} bytes of K and V went over the wire; kata 04's formula gives {wire_bytes(model, P)}", ex,
               ("wire bytes", sent))
    layers, first = prefill_alone(model, r["prompt"])
    want = {"header": [0x4B563136, 1, len(layers), P, model.config.num_key_value_heads, model.config.head_dim,
                       wire["header"][6], 0], "kv": [x.contiguous() for kv in layers for x in kv], "first": first,
            "first_token": first}
    got = {"header": wire["header"], "kv": wire["kv"], "first": wire["first"], "first_token": stats["first_token"]}
    c.compare(ex, want, got, "what the grader received: the header, K0, V0, … (each (1, Hkv, P, D)) and the first "
                             "token, against the model's own cache for the prompt and its greedy first token")
    return r


@CHECKS.add("prefill_worker sends the header, every layer's K and V as the model computed them, and the first token",
            uses="prefill_worker")
def prefill_sends_the_prompts_cache(ctx):
    ctx.case(BASE, _prefill_body)
    ctx.case({**BASE, "prompt_len": 1, "heads": (2, 1), "layers": 3, "seed": 5}, _prefill_body)
    ctx.case({**BASE, **LARGE}, _prefill_body)
    ctx.case({**BASE, "dtype": "bfloat16", "seed": 6}, _prefill_body)
    ctx.case({**BASE, "head_dim": 6, "seed": 13}, _prefill_body)  # not width // heads = 8
    ctx.case({**BASE, "near_tie": True, "seed": 14}, _prefill_body)  # the first token 1e-8 above the next id
    ctx.case({**BASE, **LARGE, "dtype": "float16", "seed": 19}, _prefill_body)  # half x large
    ctx.case({**BASE, "prompt": [0, 47, 3, 0], "seed": 20}, _prefill_body)  # ids 0 and the last of 48
    ctx.forall(exchanges(layerwise=(False,)), _prefill_body, max_examples=3)


@CHECKS.add("layer-wise: each layer is sent with isend inside its update, every send waited once after the forward",
            uses="prefill_worker")
def layerwise_overlaps_the_forward(ctx):
    def body(c, ex):
        judge_layerwise(c, ex, _prefill_body(c, ex))

    ctx.case({**BASE, "layerwise": True, "layers": 3}, body)
    ctx.case({**BASE, "layerwise": True, "layers": 1, "prompt_len": 1, "dtype": "float16", "seed": 8}, body)


@CHECKS.add("layer-wise: no buffer changes while its send is in flight (before its wait)", uses="prefill_worker")
def layerwise_buffers_stay_put_in_flight(ctx):
    def body(c, ex):
        r = prefill_exchange(c, c.t, ex)
        judge_in_flight(c, ex, r)

    ctx.case({**BASE, "layerwise": True, "layers": 2, "seed": 9}, body)


@CHECKS.add("prefill_worker refuses a bad prompt, dst or layerwise with ValueError naming it, before sending",
            uses="prefill_worker")
def prefill_rejects_bad_input(ctx):
    def body(c, ex):
        for what, name, error in bad_calls(c, ex, "prefill"):
            _expect(c, ex, what, name, error)

    ctx.case({**BASE}, body)


@CHECKS.add("decode_worker continues from the received cache: one token per forward at position P + i, greedy tokens",
            uses="decode_worker")
def decode_continues_greedy(ctx):
    def body(c, ex):
        r = decode_exchange(c, c.t, ex)
        tokens = judge_tokens(c, ex, r["model"], r["prompt"], r["tokens"], r["eos"])
        if tokens and tokens[0] != r["first"]:
            c.fail(f"the first token should be the one the prefill worker sent ({r['first']}); got {tokens[0]}", ex,
                   ("first", tokens[0]))
        judge_decode_forwards(c, ex, len(r["prompt"]), tokens, r["events"])

    ctx.case(BASE, body)
    ctx.case({**BASE, "max_new_tokens": 0}, body)  # still receives everything, returns []
    ctx.case({**BASE, "max_new_tokens": 1, "prompt_len": 1, "seed": 4}, body)
    ctx.case({**BASE, "eos": 0, "seed": 5}, body)  # the first token is the EOS: [it]
    ctx.case({**BASE, "eos": 3, "max_new_tokens": 8, "seed": 7}, body)
    ctx.case({**BASE, **LARGE, "max_new_tokens": 3}, body)
    ctx.case({**BASE, "dtype": "bfloat16", "max_new_tokens": 4, "seed": 10}, body)
    ctx.case({**BASE, "eos": "id 0", "max_new_tokens": 8, "seed": 15}, body)  # EOS id 0, said at a later step
    ctx.case({**BASE, "near_tie": True, "seed": 16}, body)  # every pick 1e-8 above the next lower id
    ctx.case({**BASE, "head_dim": 12, "heads": (2, 1), "seed": 17}, body)  # not width // heads = 16
    ctx.forall(exchanges(layerwise=(False,)), body, max_examples=3)


@CHECKS.add("decode_worker refuses a bad max_new_tokens or src, and a header that disagrees with its model",
            uses="decode_worker")
def decode_rejects_bad_input(ctx):
    def body(c, ex):
        for what, name, error in bad_calls(c, ex, "decode"):
            _expect(c, ex, what, name, error)
        for what, name, header in BAD_HEADERS:
            _expect(c, ex, f"decode_worker receiving {what}", name, bad_header_outcome(c, ex, header))

    ctx.case({**BASE}, body)


def _expect(c, ex, what: str, name: str, error) -> None:
    if error is None:
        c.fail(f"{what}: expected ValueError naming {name}, your code raised nothing", ex, ("no error", what))
    if error[0] != "ValueError":
        c.fail(f"{what}: expected ValueError naming {name}, your code raised {error[0]}: {error[1][:200]}", ex,
               ("raised", error[0], what))
    if not value_error_names(ValueError(error[1]), (name,)):
        c.fail(f"{what} raised ValueError({error[1]!r}); the message should name {name}", ex, ("unnamed", what))


@CHECKS.add("both workers together: the decode worker's tokens equal single-process greedy generation",
            uses="decode_worker")
def disaggregated_equals_one_process(ctx):
    def body(c, ex):
        r = both_exchange(c, c.t, ex, ex.get("requests", 1))
        for prompt, stats, tokens in zip(r["prompts"], r["stats"], r["tokens"]):
            judge_stats(c, ex, r["model"], len(prompt), stats)
            judge_tokens(c, {**ex, "prompt": prompt}, r["model"], prompt, tokens, r["eos"])

    ctx.case({**BASE, "layerwise": True, "eos": 2}, body)
    ctx.case({**BASE, "requests": 2, "layerwise": True, "seed": 12}, body)  # layer-wise then whole, one group
    ctx.case({**BASE, "layerwise": True, "head_dim": 6, "eos": "id 0", "max_new_tokens": 8, "seed": 18}, body)
    ctx.forall(exchanges(max_new=(1, 6)), body, max_examples=3)
