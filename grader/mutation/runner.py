"""Grading mutants: one warm process, each mutant graded in a child forked from it.

The parent imports torch, the grader, the kata's checks and the reference once (as ``kvkata watch``
does, grader.learner.watch), then forks a child per mutant, at most ``jobs`` at a time. The child runs the
kata's checks in their order against the mutant, stops at the first that does not pass and sends
back which one. A mutant that runs past its time is killed (counted as killed, "timeout"); one that
crashes the child is killed too ("crashed").
"""
from __future__ import annotations

import json
import os
import select
import signal
import time
from dataclasses import dataclass

from grader import manifest
from grader.learner import live
from grader.mutation.operators import Mutant, mutants

MIN_TIMEOUT = 15.0  # seconds a mutant may take at least; else a multiple of the reference's time
TIMEOUT_FACTOR = 4.0


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    killed: bool
    how: str  # the check that failed (and its status), "timeout", "crashed: ..." or "" for a survivor


def kata_mutants(kata: manifest.Kata, only: str | None = None) -> list[Mutant]:
    """The mutants of the kata's reference, those whose id contains ``only`` when given."""
    source = (manifest.REPO_ROOT / kata.solution).read_text(encoding="utf-8")
    return [m for m in mutants(source) if only is None or only in m.id]


def warm_up(kata: manifest.Kata):
    """Import what grading needs, once, before any child is forked; the reference Target."""
    from grader import grade
    from grader.classroom.cohort import server  # noqa: F401  Hypothesis' global Random, registered once
    from grader.engine import targets

    grade.single_thread()
    grade.checks_for(kata.id)
    return targets.reference(kata)


def _grade(kata: manifest.Kata, reference, source: str, label: str, timeout: float) -> dict:
    """In the child: the first check of the kata that ``source`` does not pass."""
    import torch

    from grader import grade
    from grader.engine import Ctx, run_check, targets

    try:
        target = targets.from_source(source, label, label)
    except targets.TargetLoadError as exc:
        return {"killed": True, "how": f"does not load: {exc}"}
    ctx = Ctx(target, reference, torch.device("cpu"), 0)
    for check in grade.checks_for(kata.id):
        result = run_check(check, ctx, (), timeout)
        if not result.passed:
            return {"killed": True, "how": f"{check.id} ({result.status})"}
    return {"killed": False, "how": ""}


def _fork(kata, reference, source: str, label: str, timeout: float) -> tuple[int, int]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: grade, send plain data, leave without running anyone's exit handlers
        code = 0
        try:
            os.close(read_end)
            quiet = os.open(os.devnull, os.O_WRONLY)  # what a mutant prints or warns is not the report
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            data = json.dumps(_grade(kata, reference, source, label, timeout)).encode()
            while data:
                data = data[os.write(write_end, data):]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    return pid, read_end


@dataclass
class _Slot:
    mutant: Mutant
    pid: int
    fd: int
    deadline: float
    chunks: list


def _finish(slot: _Slot, timed_out: bool) -> Outcome:
    os.close(slot.fd)
    if timed_out:
        os.kill(slot.pid, signal.SIGKILL)
    _, status = os.waitpid(slot.pid, 0)
    if timed_out:
        return Outcome(slot.mutant, True, "timeout")
    try:
        answer = json.loads(b"".join(slot.chunks))
        return Outcome(slot.mutant, bool(answer["killed"]), answer["how"])
    except (ValueError, KeyError, TypeError):
        return Outcome(slot.mutant, True, f"crashed: {live.how_it_ended(status)}")


def grade_all(kata: manifest.Kata, reference, todo: list[Mutant], jobs: int, timeout: float,
              on_outcome=None) -> list[Outcome]:
    """Grade every mutant in ``todo``, ``jobs`` children at a time; outcomes in ``todo``'s order."""
    if jobs < 1:
        raise ValueError(f"jobs: expected at least 1, got {jobs}")
    pending, running, done, finished = list(reversed(todo)), {}, {}, []
    while pending or running:
        while pending and len(running) < jobs:
            m = pending.pop()
            pid, fd = _fork(kata, reference, m.source, f"<mutant of {kata.solution}>", timeout)
            running[fd] = _Slot(m, pid, fd, time.monotonic() + timeout * 2 + 5, [])
        wait = max(0.0, min(s.deadline for s in running.values()) - time.monotonic())
        ready, _, _ = select.select(list(running), [], [], wait)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                running[fd].chunks.append(chunk)
            else:
                finished.append(_finish(running.pop(fd), False))
        finished += [_finish(running.pop(fd), True) for fd in list(running) if time.monotonic() > running[fd].deadline]
        for outcome in finished[len(done):]:
            done[outcome.mutant.id] = outcome
            if on_outcome is not None:
                on_outcome(outcome)
    return [done[m.id] for m in todo]


def run(kata_id: str, jobs: int = 2, only: str | None = None, timeout: float | None = None,
        on_outcome=None) -> list[Outcome]:
    """Mutate the kata's reference and grade every mutant with the kata's checks."""
    kata = manifest.get(kata_id)
    todo = kata_mutants(kata, only)
    reference = warm_up(kata)
    source = (manifest.REPO_ROOT / kata.solution).read_text(encoding="utf-8")
    started = time.monotonic()
    clean = grade_all(kata, reference, [Mutant("unmutated", "none", 0, source)], 1, 600.0)[0]
    if clean.killed:
        raise RuntimeError(f"kata {kata.id}: the unmutated reference fails its own checks: {clean.how}")
    limit = timeout or max(MIN_TIMEOUT, TIMEOUT_FACTOR * (time.monotonic() - started))
    return grade_all(kata, reference, todo, jobs, limit, on_outcome)
