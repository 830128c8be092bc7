"""``kvkata watch [NN]``: re-grade a kata each time its file is saved, in one warm process.

The watcher imports torch, the grader, the checks, the references and the known mistakes once.
Each grading runs in a child forked from it (warm, so a verdict comes back in a fraction of the
time a fresh ``pytest katas/NN`` takes), which sends its results back through a pipe: a learner's
file that hangs is killed at the time limit, one that crashes or exits ends only the child, and
the watcher goes on. Results go to the board exactly as ``kvkata check`` saves them.

Saves are noticed through file-system notifications (inotify) where they work, else by polling.
The watcher probes the notifications when it starts and polls by itself where none arrive (WSL
drives, network folders), and it also compares the files every few seconds as a safety net.
"""
from __future__ import annotations

import json
import os
import select
import signal
import time

from grader import manifest, render
from grader.learner import changes
from grader.learner import tools as learner
from grader.errors import UsageError

CHECK_TIMEOUT = 10.0  # seconds one check may run in the watcher (a hang shows quickly)


# -- grading in a forked child ----------------------------------------------------------------
def warm_up(katas: list[manifest.Kata]) -> None:
    """Import what grading needs, once, before any child is forked (no torch op runs here, so
    no thread pool exists to break in the children)."""
    from grader import grade
    from grader.engine import targets
    from grader.public_record import public

    grade.single_thread()
    for k in katas:
        grade.checks_for(k.id)
        if public.active(k.id):
            public.load(k.id)
        elif grade.gradable(k):
            grade.context(k, targets.reference(k), "cpu")  # the reference and the mistake catalogue


def grade_forked(k: manifest.Kata, device: str, seed: int, timeout: float) -> tuple[list | None, str]:
    """(results, "") from a child process, or (None, why) when the child hung, crashed or exited."""
    from grader import grade

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: grade, send plain data, leave without running anyone's exit handlers
        code = 0
        try:
            os.close(read_end)
            results = learner.grade_file(k, "stub", device, seed, timeout)
            payload = [[r.check.id, r.status, r.message, list(r.diagnoses), r.seconds] for r in results]
            data = json.dumps(payload).encode()
            while data:
                data = data[os.write(write_end, data):]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    deadline = time.monotonic() + timeout * (len(grade.checks_for(k.id)) + 1)
    data, why = _read_all(read_end, deadline), ""
    os.close(read_end)
    if data is None:
        os.kill(pid, signal.SIGKILL)
        why = f"grading took longer than {timeout * (len(grade.checks_for(k.id)) + 1):g} s and was stopped"
    _, status = os.waitpid(pid, 0)
    if data:
        try:
            return _results(k, json.loads(data)), ""
        except (ValueError, TypeError, KeyError):
            why = "the grading process sent back something unreadable"
    return None, why or f"your code ended the grading process ({_ended(status)})"


def _read_all(fd: int, deadline: float) -> bytes | None:
    """Everything until the writer closes, or None at the deadline."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def _results(k: manifest.Kata, payload: list) -> list:
    from grader import checks
    from grader.engine import Result

    by_id = {c.id: c for c in checks.for_kata(k.id).all}
    return [Result(by_id[cid], status, message, diagnoses, seconds) for cid, status, message, diagnoses, seconds in payload]


def _ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        try:
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        except ValueError:
            return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.WEXITSTATUS(status)}"


# -- what the learner sees --------------------------------------------------------------------
def verdict(k: manifest.Kata, results: list | None, why: str, seconds: float) -> list[str]:
    """The board line, then the first failing check with its message (and diagnosis)."""
    from grader import grade

    stamp = time.strftime("%H:%M:%S")
    if results is None:
        return [f"[{stamp}] kata {k.id} · {k.title}: not graded — {why}"]
    lines = [f"[{stamp}] {grade.summary(k, results)}  ({seconds:.2f} s)"]
    failing = [r for r in results if not r.passed]
    if failing:
        lines += ["  " + line for line in render.result_lines(failing[:1])]
        if len(failing) > 1:
            lines.append(f"  … and {len(failing) - 1} more failing check(s): kvkata check {k.id}")
    return lines


def next_pending(katas: list[manifest.Kata], after: manifest.Kata | None = None) -> manifest.Kata | None:
    """The first kata whose latest results do not all pass: from the start, or the ones after
    ``after`` (then round to the ones before it)."""
    saved = learner.saved_results()
    order = katas if after is None else [k for k in katas if k.id > after.id] + [k for k in katas if k.id < after.id]
    for k in order:
        entry = saved.get(k.id, {})
        if not (entry.get("total") and entry.get("passed") == entry.get("total")):
            return k
    return None


# -- the loop ---------------------------------------------------------------------------------
def run(kata_id: str | None, poll: bool, interval: float, seed: int, timeout: float, say=print) -> int:
    """Watch until Ctrl-C. Grading runs on the CPU: the checks' tensors are tiny, and a CUDA context
    cannot be shared with forked children (``kvkata check NN --device cuda`` grades on a GPU)."""
    from grader import grade

    katas = [k for k in manifest.load().values() if grade.gradable(k)]
    if not katas:
        raise UsageError("no kata can be graded here (no reference solutions, no public records): your instructor "
                         "grades your work")
    current = learner.kata(kata_id) if kata_id else (next_pending(katas) or katas[0])
    device = "cpu"
    warm_up(katas)
    files = {manifest.REPO_ROOT / k.stub: k for k in katas}
    watcher = changes.Watcher(list(files), poll=poll, interval=interval)
    say(f"watching {len(files)} kata files ({watcher.mode}); now: kata {current.id}, edit {current.stub}. "
        "Ctrl-C to stop.")
    try:
        pending = [current]
        while True:
            for k in pending:
                current = _grade_and_show(k, katas, device, seed, timeout, say) or current
            changed = watcher.wait()
            pending = list(dict.fromkeys(files[path] for path in changed))
    except KeyboardInterrupt:
        say("\nstopped watching; `kvkata` shows the board.")
        return 0
    finally:
        watcher.close()


def _grade_and_show(k, katas, device, seed, timeout, say) -> manifest.Kata | None:
    """Grade ``k``, show the verdict, save it for the board; the kata to move on to when it passes."""
    started = time.monotonic()
    results, why = grade_forked(k, device, seed, timeout)
    say("\n".join(verdict(k, results, why, time.monotonic() - started)))
    if results is None:
        return None
    learner.save_results(k, results, device)
    if all(r.passed for r in results):
        following = next_pending(katas, k)
        say(f"  kata {k.id} passes. " + (f"Next: kata {following.id} — {following.title}: edit {following.stub}"
                                           if following else "Every kata passes."))
        return following
    return None
