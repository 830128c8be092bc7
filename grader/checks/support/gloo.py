"""Two real processes joined by a gloo process group on the loopback interface, for checks that need
a peer: ``run_pair(rank0, rank1)`` forks two children, runs ``rank0()`` in rank 0 and ``rank1()`` in
rank 1 with ``torch.distributed``'s default group set up, and returns what each returned or raised.

How (measured, see the level-5 design study): fork, never spawn (16x cheaper, and the child sees the
learner's namespace as the parent loaded it); the child's first act is ``torch.set_num_threads(1)``
(a fork after the parent used torch's thread pool deadlocks otherwise); the rendezvous is a TCPStore
this process owns on port 0 (the OS picks a free port, no race) with a fresh PrefixStore per run;
a rank that cannot join says so and the pair is formed again (nothing of the learner's has run yet),
then the grader reports its own failure, never the learner's: a pair stopped while joining (a time limit
in the parent) leaves the store slow to serve the next one (5 s, measured), past gloo's timeout on a
busy machine; ``GLOO_SOCKET_IFNAME=lo`` keeps every byte on loopback; the process group's timeout bounds every
blocked receive. No process is ever signalled (the sandbox of ``kvkata grade`` forbids it): a child
that raised leaves at once, so its peer's next receive fails within milliseconds; a child that
finished waits for the parent's word, so it never closes its sockets under a peer still receiving;
every child leaves, silently, the moment the parent closes that word's pipe (``run_pair`` returns:
it has both outcomes, or has stopped waiting for one), so none outlives the grading or prints after
it; a child whose parent is stuck too ends itself at the deadline (``faulthandler``'s timer, which
also prints where it was). Exceptions come back as text: the type, the message, the formatted traceback, and the
innermost function that raised (a stub's name).
"""
from __future__ import annotations

import datetime
import faulthandler
import itertools
import os
import pickle
import re
import select
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from grader.engine.core import GraderBug
from grader.engine.hangs import NotRun

PG_TIMEOUT = 10.0  # seconds a receive may wait for its peer before gloo gives up
GRACE = 2.0  # seconds the peer of a failed rank has to report (its receive fails within milliseconds)
DEADLINE = 20.0  # seconds a whole pair may take; a child still running then ends itself
_STORE: list = []  # the TCPStore this process owns (made on first use)
_RUNS = itertools.count()
JOINS = 2  # tries to form a pair's group before the grader reports its own failure


@dataclass
class Outcome:
    """What one rank did: ``status`` "ok" (``value``), "raised" (``error``, ``message``, ``trace``, ``stub``:
    the function that raised NotImplementedError, else None), "hung" (alive at the deadline), "stopped"
    (not waited for, as its peer failed), "died" (exited without a word; ``message`` holds the exit code)
    or "unjoined" (the group could not be formed, before anything ran; ``message`` says why)."""
    status: str
    value: object = None
    error: str = ""
    message: str = ""
    trace: str = ""
    frames: list = field(default_factory=list)  # (filename, line, function) of every frame that raised
    stub: str | None = None


_TRANSPORT = re.compile(r"\[[^\]\s]*gloo/transport/[^\]\s]*\] ")  # gloo's own source line, before its message
_PORT = re.compile(r"(\[127\.0\.0\.1\]):\d+")


def lost_peer(o: Outcome) -> bool:
    """Whether a rank raised only because its peer left: gloo's transport saw the connection close or time out."""
    return o.status == "raised" and bool(_TRANSPORT.search(o.message))


def plain(message: str) -> str:
    """A gloo error as a learner reads it: without gloo's source line and the loopback port (a new one each run)."""
    return _PORT.sub(r"\1", _TRANSPORT.sub("", message))


def _store():
    if not _STORE:
        _STORE.append(dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=PG_TIMEOUT)))
    return _STORE[0]


def _raised(exc: BaseException) -> Outcome:
    frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code if tb is not None else None
    stub = getattr(code, "co_qualname", code.co_name) if isinstance(exc, NotImplementedError) and code else None
    return Outcome("raised", error=type(exc).__name__, message=str(exc),
                   trace="".join(traceback.format_exception(exc)), frames=frames, stub=stub)


def _child(rank: int, fn: Callable, port: int, prefix: str, out: int, go: int, deadline: float) -> None:
    """One rank: never returns (os._exit), so the parent's pytest machinery never runs twice. After a
    good outcome is written it waits for ``go`` to close: leaving earlier could close its sockets under
    a peer still receiving."""
    code = 0
    outcome = None
    try:
        torch.set_num_threads(1)  # first: a forked child with the parent's thread pool deadlocks in matmul
        threading.stack_size(1 << 16)  # a small stack: a sandbox's address-space limit must not refuse the thread
        threading.Thread(target=_leave_with_the_parent, args=(go,), daemon=True).start()
        faulthandler.dump_traceback_later(deadline, exit=True, file=2)  # a compute loop says where it was (fd 2:
        # a notebook kernel's sys.stderr has no file descriptor), then ends
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        try:
            wait = datetime.timedelta(seconds=PG_TIMEOUT)
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=wait)
            dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=2,
                                    timeout=wait)
        except Exception as exc:  # the grader's own rendezvous: the pair is formed again
            outcome = Outcome("unjoined", error=type(exc).__name__, message=f"{type(exc).__name__}: {exc}")
        if outcome is None:
            try:
                outcome = Outcome("ok", value=fn())
            except BaseException as exc:  # the learner's error, as text: it is shown to them
                outcome = _raised(exc)
        try:
            with os.fdopen(out, "wb") as stream:
                pickle.dump(outcome, stream)
        except BrokenPipeError:  # the parent stopped listening (its peer failed first): nothing to tell
            os._exit(0)
        if outcome.status == "ok":
            os.read(go, 1)  # returns when the parent closes its end
    except BaseException:  # the grader's own failure (rendezvous, pickling): say so on stderr
        traceback.print_exc()
        code = 3
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _leave_with_the_parent(go: int) -> None:
    """In a child: once the parent closes ``go`` (it has every outcome it waits for, or gave up on this one),
    leave at once and silently, wherever the rank is (joining the group, a receive, a loop): a child left
    behind would print its timeout's trace after the parent's report and outlive it by gloo's timeout."""
    try:
        while os.read(go, 1):
            pass
    except OSError:
        pass
    os._exit(0)


def _read(fd: int, pid: int) -> Outcome:
    data = b""
    while chunk := os.read(fd, 1 << 20):
        data += chunk
    try:
        return pickle.loads(data)
    except Exception:  # nothing (or half a result) came: the child died
        return Outcome("died", message=f"process {pid} ended without a result")


def run_pair(rank0: Callable, rank1: Callable, deadline: float = DEADLINE) -> list[Outcome]:
    """Run ``rank0()`` and ``rank1()`` in two forked processes of one gloo group; their outcomes, rank 0 first.
    A group that cannot be formed is formed again, up to ``JOINS`` tries; then GraderBug (the grader failed)."""
    for _ in range(JOINS):
        outcomes = _run_once(rank0, rank1, deadline)
        unjoined = [o for o in outcomes if o.status == "unjoined"]
        if not unjoined:
            break
    else:
        raise GraderBug(f"the grader could not join its two processes into a gloo group ({JOINS} tries): "
                        f"{unjoined[0].message}")
    stopped = [o for o in outcomes if o.status == "raised" and o.error == NotRun.__name__]
    if stopped:  # a rank called a function that hung in an earlier check: this check is not run, as in one process
        raise NotRun(stopped[0].message)
    return outcomes


def _run_once(rank0: Callable, rank1: Callable, deadline: float) -> list[Outcome]:
    port, prefix = _store().port, f"pair-{os.getpid()}-{next(_RUNS)}"
    go_read, go_write = os.pipe()
    outs, pids = {}, []
    try:
        for rank, fn in enumerate((rank0, rank1)):
            read, write = os.pipe()
            pid = os.fork()  # not multiprocessing: a daemonic grading worker may not start its children
            if pid == 0:
                os.close(read)
                os.close(go_write)
                _child(rank, fn, port, prefix, write, go_read, deadline + 1.0)
            os.close(write)
            outs[read], pids = rank, pids + [pid]
        return _collect(outs, pids, deadline)
    finally:
        os.close(go_write)  # every child that waits may leave now
        os.close(go_read)
        for fd in outs:
            os.close(fd)
        _reap(pids)


def _collect(outs: dict, pids: list[int], deadline: float) -> list[Outcome]:
    outcomes: list[Outcome | None] = [None, None]
    pending, stop = dict(outs), time.monotonic() + deadline
    while pending and time.monotonic() < stop:
        ready, _, _ = select.select(list(pending), [], [], max(0.0, stop - time.monotonic()))
        for fd in ready:
            rank = pending.pop(fd)
            outcomes[rank] = _read(fd, pids[rank])
            if outcomes[rank].status != "ok":  # one side failed: the other's receive fails at once, or it is stuck
                stop = min(stop, time.monotonic() + GRACE)
    failed = any(o is not None and o.status != "ok" for o in outcomes)
    return [o if o is not None else Outcome("stopped" if failed else "hung") for o in outcomes]


def _reap(pids: list[int]) -> None:
    """Collect the children that have left (briefly waiting); one still running ends itself at its deadline."""
    stop = time.monotonic() + 1.0
    for pid in pids:
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done or time.monotonic() > stop:
                break
            time.sleep(0.005)
