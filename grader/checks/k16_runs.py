"""Kata 16's runs and judgements: the model of an example, one exchange of the learner's workers
(each facing the grader's own peer, or each other) as plain data, and the rules the README states
about what went over the wire and what the decode worker fed its model.

An example: ``seed``, ``prompt_len`` (or ``prompt``), ``layers``, ``heads`` (query heads, KV heads),
``dtype`` (a name: "float64", "bfloat16", …), ``max_new_tokens``, ``eos`` ("none", or the index of
the greedy token that is made the EOS), ``layerwise``, ``width`` (the model's hidden size).
"""
from __future__ import annotations

import numbers

import torch
from hypothesis import strategies as st

from grader.checks.k16_peers import Wire, live, pair, receiver, sender, watched
from grader.checks.support.common import SEEDS, tiny_llama
from grader.checks.support.models import TIE, first_wrong, greedy_alone
from grader.engine import report

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
HALF_TIE = {"bfloat16": 0.1, "float16": 0.02}  # a half model's token is right within this of the best float64 logit
HEADS = [(4, 2), (2, 1), (4, 4)]


def model_of(ex: dict):
    q, kv = ex.get("heads", (4, 2))
    model = tiny_llama(ex["seed"], "cpu", num_hidden_layers=ex.get("layers", 2), num_attention_heads=q,
                       num_key_value_heads=kv, hidden_size=ex.get("width", 32), max_position_embeddings=512)
    return model.to(DTYPES[ex.get("dtype", "float64")])


def prompt_of(ex: dict, vocab: int) -> list[int]:
    if "prompt" in ex:
        return list(ex["prompt"])
    g = torch.Generator().manual_seed(ex["seed"] + 2)
    return torch.randint(0, vocab, (ex["prompt_len"],), generator=g).tolist()


def eos_of(ex: dict, model, prompt: list[int]):
    """The example's EOS: None, or the greedy token at index ``ex["eos"]`` (so the run stops there)."""
    if ex.get("eos", "none") == "none":
        return None
    return greedy_alone(model, prompt, ex["eos"] + 1)[ex["eos"]]


@st.composite
def exchanges(draw, layerwise=(False, True), max_new=(0, 8)):
    return {"seed": draw(SEEDS), "prompt_len": draw(st.integers(1, 12)), "layers": draw(st.integers(1, 3)),
            "heads": draw(st.sampled_from(HEADS)), "max_new_tokens": draw(st.integers(*max_new)),
            "eos": draw(st.sampled_from(["none", 0, 1, 3])), "layerwise": draw(st.sampled_from(layerwise))}


def wire_bytes(model, P: int) -> int:
    """Kata 04's formula for batch 1: 2 · layers · P · KV heads · head width · bytes per element."""
    cfg = model.config
    return 2 * cfg.num_hidden_layers * P * cfg.num_key_value_heads * cfg.head_dim * model.dtype.itemsize


# -- the exchanges -------------------------------------------------------------------------------------
def prefill_exchange(c, api, ex: dict) -> dict:
    """The learner's (or reference's) prefill_worker in rank 0, the grader's receiver in rank 1."""
    model = model_of(ex)
    prompt = prompt_of(ex, model.config.vocab_size)
    wire = Wire()
    mode = {"layerwise": ex["layerwise"]} if "layerwise" in ex else {}  # absent: the default, whole-cache
    prefill = live(api.prefill_worker, model, list(prompt), dst=1, **mode)

    def rank0():
        wire.install()
        stats = prefill(watched(model, wire), list(prompt), dst=1, **mode)
        return {"stats": stats, "events": wire.events, "messages": wire.messages}
    got, seen = pair(c, ex, rank0, receiver, learner=(0,))
    return {"model": model, "prompt": prompt, "stats": got["stats"], "events": got["events"],
            "messages": got["messages"], "wire": seen}


def decode_exchange(c, api, ex: dict, header: list[int] | None = None) -> dict:
    """The grader's sender in rank 0, the learner's decode_worker in rank 1 (its model watched)."""
    model = model_of(ex)
    prompt = prompt_of(ex, model.config.vocab_size)
    eos, wire = eos_of(ex, model, prompt), Wire()
    decode = live(api.decode_worker, model, ex["max_new_tokens"], src=0, eos_token_id=eos)

    def rank1():
        tokens = decode(watched(model, wire), ex["max_new_tokens"], src=0, eos_token_id=eos)
        return {"tokens": tokens, "events": wire.events}
    sent, got = pair(c, ex, lambda: sender(model, prompt, header=header), rank1, learner=(1,))
    return {"model": model, "prompt": prompt, "eos": eos, "tokens": got["tokens"], "events": got["events"],
            "first": sent.get("first")}


def both_exchange(c, api, ex: dict, requests: int = 1) -> dict:
    """The learner's two workers face each other; ``requests`` prompts in turn over one group."""
    model = model_of(ex)
    prompts = [prompt_of({**ex, "seed": ex["seed"] + 11 * r}, model.config.vocab_size) for r in range(requests)]
    modes = [ex.get("layerwise", False), not ex.get("layerwise", False)][:requests] if requests > 1 else \
        [ex.get("layerwise", False)]
    eos = eos_of(ex, model, prompts[0])
    wire = Wire()
    prefill = live(api.prefill_worker, model, list(prompts[0]), dst=1, layerwise=modes[0])
    decode = live(api.decode_worker, model, ex["max_new_tokens"], src=0, eos_token_id=eos)

    def rank0():
        wire.install()
        return [prefill(model, list(p), dst=1, layerwise=m) for p, m in zip(prompts, modes)]

    def rank1():
        return [decode(model, ex["max_new_tokens"], src=0, eos_token_id=eos) for _ in prompts]
    stats, tokens = pair(c, ex, rank0, rank1, learner=(0, 1))
    return {"model": model, "prompts": prompts, "eos": eos, "stats": stats, "tokens": tokens, "messages": wire.messages}


# -- judgements ------------------------------------------------------------------------------------
def plain_stats(c, ex, stats) -> dict:
    keys = ("first_token", "kv_bytes", "messages")
    if not isinstance(stats, dict) or not all(isinstance(stats.get(k), numbers.Integral) for k in keys):
        c.fail(f"prefill_worker should return a dict with int entries {', '.join(keys)}; got "
               f"{report.describe(stats)}", ex, ("stats type",))
    return {k: int(stats[k]) for k in keys}


def judge_stats(c, ex, model, P: int, stats) -> dict:
    stats, want = plain_stats(c, ex, stats), wire_bytes(model, P)
    if stats["kv_bytes"] != want:
        per_token, got = want // P, stats["kv_bytes"]
        why = ("no padding, no repeated query heads, the header and the first token not counted" if got % per_token
               else f"your count is the K and V of {got // per_token} tokens, and this prompt has {P}"
               + (": does the cache hold tokens of an earlier request? Each prompt starts from an empty cache"
                  if got > want else ""))
        c.fail(f"stats['kv_bytes'] = {got}, but K and V of {P} tokens take 2 · layers · P · KV heads "
               f"· head width · bytes per element = {want} bytes (kata 04's formula): {why}", ex,
               ("kv_bytes", got, want), culprit="prefill_worker")
    if stats["messages"] != 2 * model.config.num_hidden_layers + 2:
        c.fail(f"stats['messages'] = {stats['messages']}; the header, K and V of each of the "
               f"{model.config.num_hidden_layers} layers and the first token make "
               f"{2 * model.config.num_hidden_layers + 2}", ex, ("messages", stats["messages"]),
               culprit="prefill_worker")
    return stats


def judge_tokens(c, ex, model, prompt, tokens, eos, what="the decode worker's tokens"):
    if not isinstance(tokens, list) or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                               for t in tokens):
        c.fail(f"decode_worker should return a list of int token ids; got {report.describe(tokens)}", ex,
               ("tokens type", report.describe(tokens)))
    tokens, N = [int(t) for t in tokens], ex["max_new_tokens"]
    name = ex.get("dtype", "float64")
    wide = model.to(torch.float64) if name in HALF_TIE else model
    wrong = first_wrong(wide, prompt, tokens, eos, HALF_TIE.get(name, TIE))
    if wrong is not None and wrong[0] == "token":
        c.fail(f"{what}: new token {wrong[1]} is {wrong[2]}, but single-process greedy generation gives "
               f"{wrong[3]} there\n  your tokens: {tokens}", ex, ("tokens", tokens), culprit="decode_worker")
    if wrong is not None:
        c.fail(f"{what}: new token {wrong[1]} is the EOS {eos}, but the output goes on; stop after the first EOS "
               f"(keeping it)\n  your tokens: {tokens}", ex, ("tokens", tokens), culprit="decode_worker")
    if len(tokens) > N or (len(tokens) < N and (eos is None or eos not in tokens)):
        c.fail(f"{what}: {len(tokens)} new tokens, expected {N} (max_new_tokens, the first token included, unless "
               f"an EOS comes)\n  your tokens: {tokens}", ex, ("tokens", tokens), culprit="decode_worker")
    return tokens


def judge_decode_forwards(c, ex, P: int, tokens: list[int], events: list) -> None:
    """One forward per token after the first, each of one token at position P + i over P + i cached ones."""
    forwards = [e for e in events if e[0] == "forward"]
    want = max(0, len(tokens) - 1)
    if len(forwards) != want:
        c.fail(f"the decode worker ran {len(forwards)} forwards for {len(tokens)} tokens; the first token comes from "
               f"the prefill, each later one from one forward of one token ({want})", ex, ("forwards", len(forwards)))
    i = -1
    for event in events:
        if event[0] == "forward":
            i += 1
            if event[1] != 1 or event[2] != [P + i]:
                c.fail(f"decode forward {i} fed {event[1]} token(s) at positions {event[2]}; it should feed the "
                       f"newest token alone at position {P + i} (the prompt holds positions 0 … {P - 1})",
                       ex, ("fed", i, event[1], event[2]))
        elif event[0] == "update" and event[2] != P + i:
            c.fail(f"at decode forward {i} the cache of layer {event[1]} held {event[2]} tokens; it should hold the "
                   f"{P} received prompt tokens and the {i} tokens fed since: {P + i}", ex, ("held", i, event[2]))
