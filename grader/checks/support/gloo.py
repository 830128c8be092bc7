"""Two real processes joined by a gloo process group on the loopback interface, for checks that need
a peer: ``run_pair(rank0, rank1)`` forks two children, runs ``rank0()`` in rank 0 and ``rank1()`` in
rank 1 with ``torch.distributed``'s default group set up, and returns what each returned or raised.

How (measured, see the level-5 design study): fork, never spawn (16x cheaper, and the child sees the
learner's namespace as the parent loaded it); the child's first act is ``torch.set_num_threads(1)``
(a fork after the parent used torch's thread pool deadlocks otherwise); the rendezvous is a TCPStore
this process owns on port 0 (the OS picks a free port, no race) with a fresh PrefixStore per run;
``GLOO_SOCKET_IFNAME=lo`` keeps every byte on loopback; the process group's timeout bounds every
blocked receive; every child still alive at the deadline is killed, and so is the peer of a child
that raised (a pair that failed on one side has failed). Exceptions come back as text: the type, the
message, the formatted traceback, and the innermost function that raised (a stub's name).
"""
from __future__ import annotations

import datetime
import faulthandler
import itertools
import multiprocessing
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Callable

import torch
import torch.distributed as dist

PG_TIMEOUT = 10.0  # seconds a receive may wait for its peer before gloo gives up
DEADLINE = 20.0  # seconds a whole pair may take before both children are killed
_STORE: list = []  # the TCPStore this process owns (made on first use)
_RUNS = itertools.count()


@dataclass
class Outcome:
    """What one rank did: ``status`` "ok" (``value``), "raised" (``error``, ``message``, ``trace``, ``stub``:
    the function that raised NotImplementedError, else None), "hung" (alive at the deadline), "stopped"
    (killed because its peer failed) or "died" (exited without a word; ``message`` holds the exit code)."""
    status: str
    value: object = None
    error: str = ""
    message: str = ""
    trace: str = ""
    frames: list = field(default_factory=list)  # (filename, line, function) of every frame that raised
    stub: str | None = None


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


def _child(rank: int, fn: Callable, port: int, prefix: str, conn, deadline: float) -> None:
    """One rank: never returns (os._exit), so the parent's pytest machinery never runs twice. After its
    outcome is sent it waits to be killed: leaving earlier could close its sockets under a peer still receiving."""
    code = 0
    try:
        torch.set_num_threads(1)  # first: a forked child with the parent's thread pool deadlocks in matmul
        faulthandler.dump_traceback_later(deadline, exit=True)  # a compute loop says where it was, then ends
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=PG_TIMEOUT))
        dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=PG_TIMEOUT))
        try:
            outcome = Outcome("ok", value=fn())
        except BaseException as exc:  # the learner's error, as text: it is shown to them
            outcome = _raised(exc)
        conn.send(outcome)
        time.sleep(deadline)  # stay, so the peer still receiving never sees this end close; the parent kills it
    except BaseException:  # the grader's own failure (rendezvous, pickling): say so on stderr
        traceback.print_exc()
        code = 3
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_pair(rank0: Callable, rank1: Callable, deadline: float = DEADLINE) -> list[Outcome]:
    """Run ``rank0()`` and ``rank1()`` in two forked processes of one gloo group; their outcomes, rank 0 first."""
    context = multiprocessing.get_context("fork")
    port, prefix = _store().port, f"pair-{os.getpid()}-{next(_RUNS)}"
    pipes = [context.Pipe(duplex=False) for _ in range(2)]
    children = [context.Process(target=_child, args=(rank, fn, port, prefix, pipes[rank][1], deadline + 1.0),
                                daemon=True) for rank, fn in enumerate((rank0, rank1))]
    outcomes: list[Outcome | None] = [None, None]
    try:
        for child in children:
            child.start()
        for _, end in pipes:
            end.close()
        ends = {pipes[rank][0]: rank for rank in range(2)}
        stop = time.monotonic() + deadline
        while ends and time.monotonic() < stop:
            for end in wait(list(ends), timeout=max(0.0, stop - time.monotonic())):
                rank = ends.pop(end)
                try:
                    outcomes[rank] = end.recv()
                except EOFError:
                    children[rank].join(1.0)
                    outcomes[rank] = Outcome("died", message=f"exit code {children[rank].exitcode}")
                if outcomes[rank].status != "ok":  # one side failed: the other cannot finish, stop it now
                    ends.clear()
        for rank in range(2):
            if outcomes[rank] is None:
                failed = any(o is not None and o.status != "ok" for o in outcomes)
                outcomes[rank] = Outcome("stopped" if failed else "hung")
        return outcomes  # type: ignore[return-value]
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
            child.join()
        for end, _ in pipes:
            end.close()
