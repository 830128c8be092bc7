"""One grading of a kata's file in a child forked from the warm watcher (grader.learner.watch), streamed back.

The child grades the learner's file and sends one JSON line per event through a pipe, as it goes:
``start`` (a check begins), ``result`` (its outcome; a failure before its diagnosis), ``explained``
(the first failure's message with the known mistakes named, once every check has run, so that a name
agrees with all of them) and ``done``. So the watcher shows a
failing check the moment it is known, and can stop the child at once: when a newer save arrives,
or when a check runs past its limit and the child's own alarm could not stop it.

The check that failed last runs first; only the first failure is diagnosed (the verdict shows it
in full, the other failures one line each); the first check that times out stops the grading and
the checks after it are reported as not run because of it, so a loop costs one per-check limit.
A file whose import never ends fails to load within that limit, saying so.
"""
from __future__ import annotations

import json
import os
import select
import signal
import time

from grader import manifest

STOPPED = ("not run: the check \"{check}\" timed out, so this grading stopped there "
           "(fix the loop; `kvkata check {kata}` runs every check)")
GRACE = 5.0  # seconds past a check's limit before the watcher kills a child whose alarm did not stop it


def ordered(checks: list, first: str | None) -> list:
    """The checks with ``first`` (the check that failed last) moved to the front."""
    return sorted(checks, key=lambda c: c.id != first)


def _payload(r) -> dict:
    return {"event": "result", "check": r.check.id, "status": r.status, "message": r.message,
            "diagnoses": list(r.diagnoses), "seconds": r.seconds}


def grade_in_child(k: manifest.Kata, seed: int, timeout: float, first: str | None, send) -> None:
    """Grade ``k``'s file, calling ``send(event)`` for each event (see the module's docstring)."""
    from grader import grade  # here, not at the top: `kvkata` starts without loading torch
    from grader.engine import Result, explain, reconcile, report, run_check, targets

    kata_checks = ordered(grade.checks_for(k.id), first)
    try:
        target = grade.load(k, "stub", timeout=timeout)
    except targets.TargetLoadError as exc:
        for check in kata_checks:
            send(_payload(Result(check, "fail", report.LOAD_FAILED.format(reason=exc))))
        send({"event": "done"})
        return
    ctx, known = grade.context(k, target, grade.pick_device("cpu"), seed)
    hung, results, failed_first = None, [], None
    for check in kata_checks:
        if hung is not None:
            send(_payload(Result(check, "not-run", STOPPED.format(check=hung.title, kata=k.id))))
            continue
        send({"event": "start", "check": check.id})
        result = run_check(check, ctx, (), timeout)
        send(_payload(result))
        results.append(result)
        if result.status == "fail" and failed_first is None:  # what its diagnosis needs of this check's run
            failed_first = (len(results) - 1, ctx.running, ctx.seen)
        if result.status == "timeout":
            hung = check
    if failed_first is not None:  # named once every check has run, so a name agrees with all (engine.reconcile)
        index, ctx.running, ctx.seen = failed_first
        results[index] = explain(results[index], ctx, known)
        send({**_payload(reconcile(results, ctx, known)[index]), "event": "explained"})
    send({"event": "done"})


class Grading:
    """A grading in a forked child: ``events()`` gives what it has sent so far, ``cancel()`` stops it."""

    def __init__(self, k: manifest.Kata, seed: int, timeout: float, first: str | None):
        self.kata, self.timeout = k, timeout
        self.started = time.monotonic()
        self.running: str | None = None  # the check the child is running now
        self.since = self.started  # when the child last said something
        self.ended: str | None = None  # why the child is gone: "done", or how it ended
        self._buffer = b""
        read_end, write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(read_end)
            _child(write_end, k, seed, timeout, first)
        os.close(write_end)
        self.fd = read_end

    def fileno(self) -> int:
        return self.fd

    def events(self, wait: float = 0.0) -> list[dict]:
        """The events the child sent within ``wait`` seconds (none if it sent none); sets ``ended``
        once the child has closed its end."""
        if self.ended is not None:
            return []
        ready, _, _ = select.select([self.fd], [], [], max(0.0, wait))
        if not ready:
            return []
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            self._reap()
            return []
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        self.since = time.monotonic()
        for event in events:
            if event.get("event") in ("start", "result"):  # a check began, or ended (its diagnosis is timed apart)
                self.running = event.get("check") if event.get("event") == "start" else None
            if event.get("event") == "done":
                self.running = None
                self._reap("done")
        return events

    def overdue(self) -> bool:
        """Whether a check has run past its limit and the child's alarm has not stopped it."""
        return self.ended is None and self.running is not None and \
            time.monotonic() - self.since > self.timeout + GRACE

    def cancel(self) -> None:
        if self.ended is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._reap("cancelled")

    def _reap(self, why: str | None = None) -> None:
        os.close(self.fd)
        _, status = os.waitpid(self.pid, 0)
        self.ended = why or how_it_ended(status)


def _child(write_end: int, k, seed: int, timeout: float, first: str | None) -> None:
    """The forked child: grade, send plain data, leave without running anyone's exit handlers."""
    code = 0

    def send(event: dict) -> None:
        data = (json.dumps(event) + "\n").encode()
        while data:
            data = data[os.write(write_end, data):]
    try:
        grade_in_child(k, seed, timeout, first, send)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def how_it_ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        try:
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        except ValueError:
            return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.WEXITSTATUS(status)}"
