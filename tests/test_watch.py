"""``kvkata watch``, driven for real in a subprocess on a copy of the repository: save a wrong
file, then a hanging one, then a right one, and read the verdicts as a learner would."""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import K01, copy_repo, slow
from grader import grade, manifest, mistakes, state
from grader.learner import changes

pytestmark = slow  # kvkata watch in a subprocess, waiting for its verdicts

REFERENCE = (manifest.REPO_ROOT / K01.solution).read_text()
MISTAKE = mistakes.catalogue("01")[0]
VERDICT_WAIT = 120  # seconds: generous for a loaded two-core machine


def _interruptible() -> None:
    """In the watcher, before Python starts: Ctrl-C as a terminal delivers it. A run started in the background
    of a script inherits SIGINT ignored, and Python then never turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Watching:
    """A ``kvkata watch`` subprocess whose output lines arrive on a queue."""

    def __init__(self, repo, *args):
        env = {k: v for k, v in os.environ.items() if k != "KVKATA_STATE"}
        env.update(PYTHONPATH=str(repo), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "grader.cli", "watch", *args], cwd=repo, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=_interruptible)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, text: str, seconds: float = VERDICT_WAIT) -> list[str]:
        """Lines up to and including the first that contains ``text``."""
        got, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            got.append(line)
            self.seen.append(line)
            if text in line:
                return got
        raise AssertionError(f"no line with {text!r} within {seconds} s; output so far:\n" + "\n".join(self.seen))

    def verdict(self) -> str:
        """The next verdict: its board line and whatever it printed with it."""
        got = self.until("checks pass")
        time.sleep(0.5)
        while not self.lines.empty():
            line = self.lines.get()
            if line is not None:
                got.append(line)
                self.seen.append(line)
        return "\n".join(got)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.mark.parametrize("mode", ["--poll", "notifications"])
def test_watch_regrades_on_save_survives_a_hang_and_moves_on(tmp_path, mode):
    repo = copy_repo(tmp_path / "repo")
    path = repo / K01.stub
    watching = Watching(repo, "01", "--timeout", "2", *([mode] if mode == "--poll" else []))
    try:
        head = watching.until("Ctrl-C")
        assert ("polling" in head[-1]) == (mode == "--poll"), head
        untouched = re.search(r"kata 01: 0/(\d+) checks pass", watching.verdict())
        assert untouched, watching.seen
        total = int(untouched.group(1))

        path.write_text(MISTAKE.apply(REFERENCE))
        first = next(r for r in grade.grade("01", str(path)) if not r.passed)  # what the learner should see
        shown = watching.verdict()
        assert f"✗ {first.check.title}" in shown and first.message.splitlines()[0].strip() in shown
        assert all(name in shown for name in first.diagnoses)

        path.write_text(REFERENCE.replace('    _expect_kv("k_new", k_new)\n',
                                          '    _expect_kv("k_new", k_new)\n    while True:\n        pass\n', 1))
        assert "timed out" in "\n".join(watching.until("timed out"))  # the watcher survives a hang

        path.write_text(REFERENCE)
        passed = "\n".join(watching.until("passes."))
        assert f"kata 01: {total}/{total} checks pass" in passed and "Next: kata 02" in passed
        assert watching.stop() == 0
        assert "stopped watching" in "\n".join(watching.until("stopped watching", 10))
    finally:
        if watching.proc.poll() is None:
            watching.proc.kill()
    saved = state.read_json(repo / ".kvkata" / state.RESULTS, {})  # the board is kvkata check's
    assert saved["01"]["passed"] == saved["01"]["total"] == total and saved["01"]["target"] == "stub"


def test_a_file_that_exits_ends_only_its_grading(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    watching = Watching(repo, "01", "--poll")
    try:
        watching.until("checks pass")
        (repo / K01.stub).write_text(REFERENCE + "\nimport os\nos._exit(3)\n")
        assert "exit code 3" in "\n".join(watching.until("not graded"))
        (repo / K01.stub).write_text(REFERENCE)
        watching.until("passes.")
        assert watching.stop() == 0
    finally:
        if watching.proc.poll() is None:
            watching.proc.kill()


def test_the_watcher_sees_saves_by_rename_and_ignores_unchanged_saves(tmp_path):
    target = tmp_path / "kata.py"
    target.write_text("one")
    for poll in (True, False):
        watcher = changes.Watcher([target], poll=poll, interval=0.05)
        try:
            assert ("polling" in watcher.mode) == poll
            (tmp_path / "kata.py.tmp").write_text("two" if poll else "three")
            os.replace(tmp_path / "kata.py.tmp", target)  # how many editors save
            assert watcher.wait() == [target]
            target.write_text(target.read_text())  # saved, unchanged: nothing to grade
            target.write_text("four" if poll else "five")
            assert watcher.wait() == [target]
        finally:
            watcher.close()


K04 = manifest.get("04")
K04_REFERENCE = (manifest.REPO_ROOT / K04.solution).read_text()
LOOPING = '    # Why 2: each layer'  # inside kv_bytes_per_token, which most of kata 04's functions call
LIMIT = 3  # seconds one check may run in these tests


def looping_04() -> str:
    assert K04_REFERENCE.count(LOOPING) == 1
    return K04_REFERENCE.replace(LOOPING, "    while True:\n        pass\n" + LOOPING)


def _saved_and_graded(watching: Watching, path, text: str) -> tuple[str, float]:
    """Save ``text``, then the verdict that follows and the seconds from the save to its board line."""
    saved = time.monotonic()
    path.write_text(text)
    shown = "\n".join(watching.until("checks pass"))
    return shown, time.monotonic() - saved


def test_a_loop_costs_one_check_limit_and_a_loop_at_import_says_so(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    path = repo / K04.stub
    watching = Watching(repo, "04", "--timeout", str(LIMIT))
    try:
        total = int(re.search(r"kata 04: 0/(\d+) checks pass", watching.verdict()).group(1))
        shown, seconds = _saved_and_graded(watching, path, looping_04())
        assert shown.count("timed out after") == 1 and "it hung in `kv_bytes_per_token`" in shown, shown
        assert f"{total - 1} check(s) not run: the check" in shown and "stopped there" in shown, shown
        assert seconds < 2 * LIMIT, (seconds, shown)  # one limit, not one per check that calls the function

        shown, seconds = _saved_and_graded(watching, path, K04_REFERENCE + "\nwhile True:\n    pass\n")
        assert f"importing {K04.stub} did not finish within {LIMIT:g} s" in shown, shown
        assert seconds < 2 * LIMIT, (seconds, shown)
        assert watching.stop() == 0
    finally:
        if watching.proc.poll() is None:
            watching.proc.kill()


def test_a_newer_save_cancels_the_grading_and_the_check_that_failed_last_runs_first(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    path = repo / K04.stub
    watching = Watching(repo, "04", "--timeout", "60")
    try:
        watching.verdict()
        saved = time.monotonic()
        path.write_text(looping_04())
        watching.until("grading kata 04")
        time.sleep(1.0)  # the grading is now stuck in the loop, for up to 60 s
        path.write_text(K04_REFERENCE)
        assert "cancelled" in "\n".join(watching.until("cancelled", 30))
        passed = watching.until("passes.", 30)
        assert time.monotonic() - saved < 30, passed  # the fix did not wait for the hang's time limit
        first_check = grade.checks_for("04")[0]  # the stub's first failing check, so the first run in the fix
        after = passed[passed.index(next(line for line in passed if line.startswith("grading kata 04"))) + 1]
        assert after.strip() == f"✓ {first_check.title} — passes now", passed
        assert watching.stop() == 0
    finally:
        if watching.proc.poll() is None:
            watching.proc.kill()
