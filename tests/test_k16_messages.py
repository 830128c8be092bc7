"""Kata 16's messages say what the learner's own worker did: a byte count that is another prompt's, and
a receiver that did not receive, are named for what they are, with the worker whose result differed."""
from __future__ import annotations

import pytest

from grader import grade, manifest
from grader.checks import k16_peers, k16_runs
from grader.checks.support import gloo
from grader.engine import Ctx, Failure, targets

EX = {"seed": 3, "prompt_len": 5, "layers": 2, "heads": (4, 2), "max_new_tokens": 2, "eos": "none"}


def _ctx() -> Ctx:
    kata = manifest.get("16")
    ctx, _ = grade.context(kata, targets.resolve(kata, "solution"), "cpu")
    return ctx


def test_a_byte_count_of_more_tokens_than_the_prompt_says_so():
    """A prefill worker that keeps its cache between requests counts the earlier prompt's K and V too."""
    model = k16_runs.model_of(EX)
    earlier, P = 3, EX["prompt_len"]
    stats = {"first_token": 1, "kv_bytes": k16_runs.wire_bytes(model, earlier + P),
             "messages": 2 * EX["layers"] + 2}
    with pytest.raises(Failure) as caught:
        k16_runs.judge_stats(_ctx(), EX, model, P, stats)
    message = caught.value.message
    assert f"K and V of {earlier + P} tokens" in message and "earlier request" in message, message
    assert "header and the first token not counted" not in message
    assert caught.value.culprit == "prefill_worker"


def test_a_receiver_that_does_not_receive_is_told_the_receivers_part(monkeypatch):
    """The grader's sender could not finish because the learner's decode_worker did not take its messages:
    the message asks the receiver to receive, not the sender to send."""
    outcomes = [gloo.Outcome("raised", error="DistBackendError", message="Connection closed by peer"),
                gloo.Outcome("ok", value=[1, 2])]
    monkeypatch.setattr(k16_peers.gloo, "run_pair", lambda rank0, rank1: outcomes)
    with pytest.raises(Failure) as caught:
        k16_peers.pair(_ctx(), EX, lambda: None, lambda: None, learner=(1,))
    message = caught.value.message
    assert "decode_worker" in message and "receive" in message and caught.value.culprit == "decode_worker", message
    assert "The messages must be exactly" not in message
