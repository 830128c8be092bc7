"""The two-process launcher kata 16's checks use (grader.checks.support.gloo): real gloo on loopback,
outcomes as plain data, a failed rank's peer released at once, a hung rank reported at the deadline."""
from __future__ import annotations

import re
import time

import pytest
import torch
import torch.distributed as dist

from grader.checks.support import gloo


def _send():
    dist.send(torch.arange(6, dtype=torch.float64), 1)
    return "sent"


def _recv():
    buffer = torch.empty(6, dtype=torch.float64)
    dist.recv(buffer, 0)
    return buffer.tolist()


def test_a_pair_exchanges_a_tensor_and_returns_both_values():
    a, b = gloo.run_pair(_send, _recv)
    assert (a.status, a.value) == ("ok", "sent")
    assert (b.status, b.value) == ("ok", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])


def test_an_error_comes_back_as_text_and_its_peer_is_released_at_once():
    def stub():
        raise NotImplementedError("not yet")
    began = time.monotonic()
    a, b = gloo.run_pair(stub, _recv)
    assert time.monotonic() - began < gloo.PG_TIMEOUT  # the receiver did not wait for gloo's timeout
    assert (a.status, a.error, a.stub) == ("raised", "NotImplementedError", "test_an_error_comes_back_as_text_and_its_peer_is_released_at_once.<locals>.stub")
    assert "not yet" in a.trace
    assert b.status in ("raised", "stopped")


def test_a_rank_that_never_finishes_is_reported_hung_at_the_deadline():
    def spin():
        while True:
            pass
    began = time.monotonic()
    a, b = gloo.run_pair(spin, lambda: "done", deadline=1.5)
    assert 1.4 < time.monotonic() - began < 6.0
    assert (a.status, b.status) == ("hung", "ok")


def test_a_rank_left_behind_leaves_with_the_grading_and_prints_nothing(tmp_path, capfd):
    """A rank still blocked (here a loop; joining a group or a receive alike) when the pair gives up on it
    is gone as soon as ``run_pair`` returns: nothing of it prints after the grading's report."""
    import os

    pid_file = tmp_path / "pid"

    def spin():
        pid_file.write_text(str(os.getpid()))
        while True:
            pass
    a, b = gloo.run_pair(spin, lambda: "done", deadline=1.5)
    assert (a.status, b.status) == ("hung", "ok")
    pid = int(pid_file.read_text())
    stop = time.monotonic() + 2.0
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < stop:
        time.sleep(0.02)
    assert not os.path.exists(f"/proc/{pid}"), "the rank outlived the pair"
    time.sleep(1.5)  # past the child's own deadline (1.5 s + 1 s): a dump would have been printed by now
    err = capfd.readouterr().err
    assert "Timeout" not in err and "Traceback" not in err, err


def test_a_rank_that_reaches_a_function_that_hung_makes_the_check_not_run():
    """In one process a call to a function that hung earlier raises NotRun, and the check is not run; a
    rank that reaches one says the same, never an error of the learner's."""
    from grader.engine.hangs import NotRun

    def stopped():
        raise NotRun("not run: it calls `prefill_worker`, which did not finish")
    try:
        gloo.run_pair(stopped, _recv)
    except NotRun as exc:
        assert "prefill_worker" in exc.message
    else:
        raise AssertionError("run_pair returned instead of raising NotRun")


def _recv_from_1():
    buffer = torch.empty(6, dtype=torch.float64)
    dist.recv(buffer, 1)
    return buffer.tolist()


def _wrong_header():
    raise ValueError("header: announces 4 KV heads, the model has 2")


def test_a_rank_that_only_lost_its_peer_is_told_apart_from_the_cause():
    """The receiver fails because its peer left; the peer's own error is the cause, and the receiver's
    message reads the same on every run (no gloo source line, no port: a new one each run)."""
    a, b = gloo.run_pair(_recv_from_1, _wrong_header)
    assert a.status == "raised" and gloo.lost_peer(a), a
    assert b.status == "raised" and not gloo.lost_peer(b)
    assert "gloo/transport" not in gloo.plain(a.message)
    assert not re.search(r"127\.0\.0\.1\]:\d", gloo.plain(a.message))


def test_kata_16_reports_the_cause_not_the_rank_that_lost_its_peer():
    """Both of the learner's workers raised: the one whose peer left is not the one reported."""
    from grader.checks.k16_peers import pair
    from grader.engine.core import LearnerCrash

    class Target:
        def owns(self, filename):
            return filename == __file__

    class Check:
        target = Target()

    for ranks in ((_recv_from_1, _wrong_header), (_wrong_header, _recv_from_0)):
        with pytest.raises(LearnerCrash) as caught:
            pair(Check(), {"seed": 0}, *ranks, learner=(0, 1))
        assert "ValueError: header: announces 4 KV heads" in str(caught.value)


def _recv_from_0():
    buffer = torch.empty(6, dtype=torch.float64)
    dist.recv(buffer, 0)
    return buffer.tolist()


def _failing_join(flag):
    """``init_process_group`` that fails while ``flag`` is missing, writing it: the first try fails, the next joins."""
    real = dist.init_process_group

    def join(*args, **kwargs):
        if flag is None or not flag.exists():
            if flag is not None:
                flag.write_text("failed once")
            raise dist.DistStoreError("wait timeout after 10000ms (as on a machine too busy to join in time)")
        return real(*args, **kwargs)
    return join


def test_a_group_that_fails_to_form_is_formed_again_and_the_learners_code_runs_once(tmp_path, monkeypatch):
    """The rendezvous is the grader's: a try that fails runs nothing of the learner's, and the next try
    gives the real outcomes (not "died", which a check would blame on the learner's worker)."""
    monkeypatch.setattr(gloo.dist, "init_process_group", _failing_join(tmp_path / "failed"))
    runs = tmp_path / "runs"

    def send():
        with open(runs, "a") as f:
            f.write("x")
        return _send()
    a, b = gloo.run_pair(send, _recv)
    assert (tmp_path / "failed").exists()  # the first try did fail
    assert (a.status, a.value, b.status) == ("ok", "sent", "ok")
    assert runs.read_text() == "x"


def test_a_group_that_never_forms_is_the_graders_failure(monkeypatch):
    from grader.engine.core import GraderBug
    monkeypatch.setattr(gloo.dist, "init_process_group", _failing_join(None))
    with pytest.raises(GraderBug, match=rf"could not join .* \({gloo.JOINS} tries\).*too busy"):
        gloo.run_pair(_send, _recv)
