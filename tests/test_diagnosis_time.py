"""The diagnosis on a busy machine (grader.engine.diagnosis): a further run that ran out of its short limit
tells nothing, is never taken for what a longer limit tells, and does not drop a suspect whose run finishes
when given the failing input's limit."""
from __future__ import annotations

import time
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from grader.engine import diagnosis
from grader.engine.core import Alarm, CheckTimeout, Ctx
from grader.engine.targets import Target


def _ctx() -> Ctx:
    return Ctx(Target("yours", "<yours>", {}), Target("reference", "<reference>", {}), torch.device("cpu"))


def _slow(calls: list, seconds: float = 0.3):
    def body(ctx, example):
        calls.append(example)
        time.sleep(seconds)  # finishes, only later than the short limit
    return body


def test_a_run_that_ran_out_is_run_again_only_when_asked_with_a_longer_limit():
    diagnosis.forget()
    ctx, calls = _ctx(), []
    mistake, body = SimpleNamespace(name="slow but right"), _slow(calls)
    ask = lambda seconds: diagnosis.theirs(ctx, mistake, ctx.target, "c", 1, body, {"n": 1}, seconds)
    assert ask(0.05) is None and len(calls) == 1  # ran out: tells nothing
    assert ask(0.05) is None and len(calls) == 1  # remembered at that limit
    assert ask(5.0) == diagnosis.PASS and len(calls) == 2  # a longer limit: run again, and it finishes
    assert ask(0.05) == diagnosis.PASS and len(calls) == 2  # a run that finished is not repeated
    diagnosis.forget()


def test_a_suspect_whose_further_run_ran_out_is_judged_on_a_longer_run():
    """``narrow``: the learner's code passed on the input (known from the check's own run); the suspect's run
    there ran out at the short limit, as any run may on a busy machine. It stays a suspect once its run
    finishes and agrees; one whose finished run disagrees is dropped."""
    diagnosis.forget()
    ctx = _ctx()
    right, wrong, calls = SimpleNamespace(name="agrees"), SimpleNamespace(name="disagrees"), []

    def fails(c, example):
        calls.append(example)
        time.sleep(0.3)
        c.fail("a different output", example, ("other output",))
    bodies = {"agrees": _slow(calls), "disagrees": fails}
    site = SimpleNamespace(number=1, body=lambda c, e: bodies[c.target.label](c, e))
    item = (SimpleNamespace(id="c"), site, {"n": 2}, diagnosis.PASS)
    suspects = [(m, Target(m.name, f"<{m.name}>", {})) for m in (right, wrong)]
    theirs = {m.name: [diagnosis.theirs(ctx, m, t, "c", 1, site.body, {"n": 2}, 0.05)] for m, t in suspects}
    assert theirs == {"agrees": [None], "disagrees": [None]}  # both ran out at the short limit
    alive, compared = diagnosis.narrow(ctx, [item], theirs, suspects, [0])
    assert compared == 1 and [m.name for m, _ in alive] == ["agrees"]
    diagnosis.forget()


def _firing(when: str):
    """A ``time_limit`` whose alarm fires just as the limit is set (``when="set"``) or lifted (``"lifted"``):
    the windows a real alarm hits only now and then, outside the run itself."""
    @contextmanager
    def limit(seconds):
        alarm = Alarm()
        if when == "set":
            alarm.fired = CheckTimeout()
            raise alarm.fired
        yield alarm
        alarm.fired = CheckTimeout()
        raise alarm.fired
    return limit


@pytest.mark.parametrize("when", ["set", "lifted"])
def test_an_alarm_outside_the_run_is_a_run_that_ran_out(when, monkeypatch):
    """No CheckTimeout escapes ``outcome``: the run tells nothing, and a mistake's such run is asked again
    with a longer limit (it is a RanOut, not a verdict)."""
    monkeypatch.setattr(diagnosis, "time_limit", _firing(when))
    ctx, calls = _ctx(), []
    assert diagnosis.outcome(ctx, lambda c, e: calls.append(e), {"n": 3}, 1.0) is None
    assert diagnosis.attempt(ctx, lambda c, e: calls.append(e), {"n": 3}, 1.0) == diagnosis.RanOut(1.0)
    assert len(calls) == (0 if when == "set" else 2)
