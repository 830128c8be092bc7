"""Judging a cohort's runs as they finish: a row for each (grader.classroom.cohort.judge), made in judge
processes while the workers go on, or in this thread.

Judging — replaying every check against the reference and naming known mistakes — costs more
than running a submission, so one thread judging after the other would leave the workers idle
and the machine half used. Judge processes are forked from the warm server that forks the
workers (grader.classroom.cohort.sandbox.start_server): they never run learner code, only read the
records the workers wrote, as this process does, so forking them from it is safe. Each keeps the
reference's outputs it has computed and the Hypothesis runs it has replayed (grader.classroom.cohort.memo)
for the rows it judges next, and uses one torch thread: two judges' worth of intra-op threads
fighting the workers for two cores made each small op take milliseconds. Should a judge process
die, the rows it had are judged here instead; a row never depends on where it was judged.
"""
from __future__ import annotations

import multiprocessing
import queue
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from grader.classroom.cohort import judge
from grader.classroom.cohort.memo import Memo


def count(settings) -> int:
    """Judge processes for ``settings``: none (judge here) unless workers are forked from the warm
    server; then ``settings.judges``, or one per worker slot when that is None."""
    if not settings.warm:
        return 0
    return max(1, settings.jobs) if settings.judges is None else max(0, settings.judges)


class Judges:
    """Turns runs into rows as the runs finish: hand ``ran(index)`` to a worker's future, take the
    rows with ``next_row``. Judge processes are forked from the warm server, which must be running."""

    def __init__(self, settings):
        self.settings = settings
        self.memo = Memo() if settings.remember else None  # for the rows judged in this process
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # (what, index, future), from other threads
        self.runs: dict = {}  # index -> the run a judge process has
        processes = count(settings)
        self.pool = ProcessPoolExecutor(processes, multiprocessing.get_context("forkserver"), _start,
                                        (settings.remember,)) if processes else None

    def __enter__(self) -> "Judges":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=kind is None, cancel_futures=True)

    def ran(self, index: int):
        """The callback for the worker future of job ``index``."""
        return lambda future: self.events.put(("ran", index, future))

    def next_row(self, jobs: list) -> tuple[int, dict]:
        """(index, row) of the next row made, waiting for it; in this thread, the one that judges
        here, so that the diagnosis' time limits (SIGALRM) hold as they always did."""
        while True:
            what, index, future = self.events.get()
            try:
                if what == "judged":
                    return index, future.result()
                run = future.result()
                if self.pool is None:
                    return index, judge.row(run, self.settings, self.memo)
                self.runs[index] = run
                self.pool.submit(_judge, run, self.settings).add_done_callback(
                    lambda done, index=index: self.events.put(("judged", index, done)))
            except BrokenProcessPool:  # a judge process died: judge its row here
                return index, self._here(index, jobs)
            except Exception as exc:  # a grader bug stops this row, never the run
                return index, judge.broken_row(jobs[index], exc)

    def _here(self, index: int, jobs: list) -> dict:
        try:
            return judge.row(self.runs[index], self.settings, self.memo)
        except Exception as exc:
            return judge.broken_row(jobs[index], exc)


# -- in a judge process ---------------------------------------------------------------------
_MEMO: Memo | None = None  # this judge process' memory of the reference's outputs


def _start(remember: bool) -> None:
    global _MEMO
    import torch

    torch.set_num_threads(1)  # as many judges as cores at most: one thread each
    _MEMO = Memo() if remember else None


def _judge(run, settings) -> dict:
    return judge.row(run, settings, _MEMO)

