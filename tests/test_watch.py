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
from grader import changes, grade, manifest, mistakes, state

pytestmark = slow  # kvkata watch in a subprocess, waiting for its verdicts

REFERENCE = (manifest.REPO_ROOT / K01.solution).read_text()
MISTAKE = mistakes.catalogue("01")[0]
VERDICT_WAIT = 120  # seconds: generous for a loaded two-core machine


class Watching:
    """A ``kvkata watch`` subprocess whose output lines arrive on a queue."""

    def __init__(self, repo, *args):
        env = {k: v for k, v in os.environ.items() if k != "KVKATA_STATE"}
        env.update(PYTHONPATH=str(repo), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "grader.cli", "watch", *args], cwd=repo, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
