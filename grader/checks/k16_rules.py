"""Kata 16's rules about the order of things and about bad input, read from a run's timeline: the
layer-wise mode's updates, isends and waits, buffers changed in flight, and the ValueErrors each
worker owes before it sends or receives anything."""
from __future__ import annotations

import torch

from grader.checks.k16_peers import MAGIC, VERSION, live, sender
from grader.checks.k16_runs import model_of, prompt_of
from grader.checks.support import gloo
from grader.engine.core import NotImplementedYet

_GOOD = [MAGIC, VERSION, 2, 5, 2, 8, 2, 0]  # BASE's model: 2 layers, 2 KV heads of width 8, float64; 5 tokens
BAD_HEADERS = [("a header announcing 3 layers for a 2-layer model", "header", _GOOD[:2] + [3] + _GOOD[3:]),
               ("a header announcing 4 KV heads for a model with 2", "header", _GOOD[:4] + [4] + _GOOD[5:]),
               ("a header announcing heads of width 16 for a model's 8", "header", _GOOD[:5] + [16] + _GOOD[6:]),
               ("a header announcing float32 for a float64 model", "model", _GOOD[:6] + [1, 0]),
               ("a header with a wrong magic", "header", [MAGIC + 1] + _GOOD[1:])]


def _attempts(calls) -> list:
    """Run each (what, name, call) in turn; (what, name, None or (error type, message)) for each."""
    out = []
    for what, name, call in calls:
        try:
            call()
            out.append((what, name, None))
        except NotImplementedError:
            raise  # a stub: "not implemented yet", not a wrong error
        except Exception as exc:  # what the learner raised is judged by the check
            out.append((what, name, (type(exc).__name__, str(exc))))
    return out


def bad_calls(c, ex: dict, side: str) -> list:
    """The learner's worker called with each bad argument in one rank; the other rank sends nothing."""
    model = model_of(ex)
    vocab = model.config.vocab_size
    if side == "prefill":
        p, prefill = prompt_of(ex, vocab), live(c.t.prefill_worker, model, [])
        calls = [(f"prefill_worker with prompt {bad!r}", "prompt", lambda bad=bad: prefill(model, bad))
                 for bad in ([], None, [1, vocab], [-1, 2], [1, 2.0])]
        calls += [(f"prefill_worker in rank 0 with dst={bad!r}", "dst",
                   lambda bad=bad: prefill(model, p, dst=bad)) for bad in (0, 2, -1, "1")]
        calls += [(f"prefill_worker with layerwise={bad!r}", "layerwise",
                   lambda bad=bad: prefill(model, p, layerwise=bad)) for bad in ("yes", 1)]
        got, _ = _run(c, lambda: _attempts(calls), lambda: None)
    else:
        decode = live(c.t.decode_worker, model, -1)
        calls = [(f"decode_worker with max_new_tokens={bad!r}", "max_new_tokens",
                  lambda bad=bad: decode(model, bad)) for bad in (-1, 2.5, None)]
        calls += [(f"decode_worker in rank 1 with src={bad!r}", "src", lambda bad=bad: decode(model, 3, src=bad))
                  for bad in (1, 2, -1, "0")]
        _, got = _run(c, lambda: None, lambda: _attempts(calls))
    return got


def _run(c, rank0, rank1):
    outcomes = gloo.run_pair(rank0, rank1)
    for o in outcomes:
        _stub(c, o)
        if o.status != "ok":
            c.fail(f"a rank ended with {o.status} {o.error}: {o.message.strip()[:300]} while only bad calls were made "
                   "(each should raise ValueError before sending or receiving anything)", None, ("bad calls", o.status))
    return [o.value for o in outcomes]


def _stub(c, o) -> None:
    if o.status == "raised" and o.stub is not None and o.frames and c.target.owns(o.frames[-1][0]):
        raise NotImplementedYet(o.stub)


def bad_header_outcome(c, ex: dict, header: list[int]):
    """What the learner's decode worker raised on receiving ``header`` alone (None: nothing)."""
    model = model_of(ex)
    decode = live(c.t.decode_worker, model, 3)
    outcomes = gloo.run_pair(lambda: sender(model, [], header=header), lambda: decode(model, 3))
    o = outcomes[1]
    _stub(c, o)
    return (o.error, o.message) if o.status == "raised" else None


def judge_layerwise(c, ex: dict, r: dict) -> None:
    """Header first; each layer's K and V isent between its update and the next; no wait before the last update;
    every isend waited before the first token is sent."""
    events, L = r["events"], r["model"].config.num_hidden_layers
    updates = [i for i, e in enumerate(events) if e[0] == "update"]
    sends = [i for i, e in enumerate(events) if e[0] == "send"]
    isends = [i for i, e in enumerate(events) if e[0] == "isend"]
    waits = [i for i, e in enumerate(events) if e[0] == "wait"]
    shown = " → ".join(f"{e[0]} {e[1]}" for e in events if e[0] != "forward")
    if not sends or not updates or sends[0] > updates[0]:
        c.fail(f"layer-wise, the header goes first, with dist.send, before the forward (its length is known): "
               f"your timeline was {shown}", ex, ("header first",))
    if len(isends) != 2 * L:
        c.fail(f"layer-wise, K and V of each of the {L} layers go with dist.isend ({2 * L} isends); yours made "
               f"{len(isends)}: {shown}", ex, ("isends", len(isends)))
    for layer in range(L):
        start, stop = updates[layer], updates[layer + 1] if layer + 1 < L else len(events)
        inside = [i for i in isends if start < i < stop and (layer + 1 < L or i < (waits or [len(events)])[0])]
        if len(inside) != 2:
            c.fail(f"layer {layer}'s K and V should be isent inside its update, before layer {layer + 1} is computed: "
                   f"your timeline was {shown}", ex, ("isend place", layer))
    if waits and waits[0] < updates[-1]:
        c.fail(f"a wait() came before the last layer's update, so that send did not overlap the rest of the forward: "
               f"wait once, after the forward. Your timeline was {shown}", ex, ("early wait",))
    waited = {events[i][1] for i in waits}
    if any(events[i][1] not in waited or any(w > sends[-1] for w in waits) for i in isends):
        c.fail(f"every isend is waited, after the forward and before the first token is sent: your timeline was "
               f"{shown}", ex, ("unwaited",))


def judge_in_flight(c, ex: dict, r: dict) -> None:
    changed = [i for i, m in enumerate(r["messages"]) if m["changed"]]
    if changed:
        c.fail(f"message(s) {changed} changed between their isend and their wait(): a buffer in flight was reused "
               "for a later layer, so what arrives depends on timing. Give each isend its own tensor and keep it "
               "alive, untouched, until wait()", ex, ("changed in flight", changed))
