"""How fast ``kvkata watch`` answers a save, next to a fresh ``pytest katas/NN``.

    python -m grader.bench.watch [NN] [--saves 10]

Runs on a temporary copy of the repository (your files are never touched): starts the watcher
there, saves the kata's file ``--saves`` times (the reference and one known mistake in turn, so
every save changes the file), and times each save to the watcher's "grading kata NN…", to the
verdict's first line (a failing check, or the check that failed last passing now) and to its board
line; then times three fresh ``pytest katas/NN`` runs on the reference. Prints the medians and both
ratios, measured in the same run. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from grader import manifest, mistakes

SKIP_NAMES = shutil.ignore_patterns(".git", ".kvkata", "__pycache__", ".hypothesis", "*.egg-info", "notebooks")


def _skip(folder: str, names: list[str]) -> set[str]:
    """What the copy leaves out: caches, notebooks and any virtual environment (a folder with pyvenv.cfg)."""
    return set(SKIP_NAMES(folder, names)) | {n for n in names if (Path(folder) / n / "pyvenv.cfg").is_file()}


def _lines(proc) -> queue.Queue:
    lines: queue.Queue = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put((time.perf_counter(), line))
    threading.Thread(target=read, daemon=True).start()
    return lines


def _next_verdict(lines: queue.Queue, timeout: float = 120.0) -> tuple[float, float, float]:
    """When the next grading was announced, when its first verdict line came and when its board line did."""
    announced = first = None
    while True:
        when, line = lines.get(timeout=timeout)
        if line.startswith("grading kata"):
            announced, first = when, None
        elif announced is not None and first is None:
            first = when
        if "checks pass" in line and announced is not None:
            return announced, first, when


def save_to_verdict(kata: manifest.Kata, saves: int, repo: Path, env: dict) -> list[tuple[float, float, float]]:
    """(save to "grading kata NN…", to the verdict's first line, to its board line) for each save."""
    reference = (repo / kata.solution).read_text()
    wrong = mistakes.catalogue(kata.id)[0].apply(reference)
    proc = subprocess.Popen([sys.executable, "-m", "grader.cli", "watch", kata.id], cwd=repo, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        lines = _lines(proc)
        _next_verdict(lines)  # the first grading, at start
        took = []
        for i in range(saves):
            time.sleep(0.3)
            saved = time.perf_counter()
            (repo / kata.stub).write_text(wrong if i % 2 == 0 else reference)
            took.append(tuple(when - saved for when in _next_verdict(lines)))
        return took
    finally:
        proc.kill()
        proc.wait()


def fresh_pytest(kata: manifest.Kata, repo: Path, env: dict, runs: int = 3) -> list[float]:
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "-q", f"katas/{kata.id}"], cwd=repo, env=env,
                       capture_output=True, check=False)
        took.append(time.perf_counter() - started)
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.bench.watch", description=__doc__.split("\n\n")[0])
    parser.add_argument("kata", nargs="?", default="03")
    parser.add_argument("--saves", type=int, default=10)
    args = parser.parse_args(argv)
    kata = manifest.get(args.kata)
    with tempfile.TemporaryDirectory(prefix="kvkata-bench-watch-") as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(manifest.REPO_ROOT, repo, ignore=_skip)
        env = {**{k: v for k, v in os.environ.items() if k != "KVKATA_STATE"}, "PYTHONPATH": str(repo),
               "PYTHONUNBUFFERED": "1"}
        watch = save_to_verdict(kata, args.saves, repo, env)
        shutil.copyfile(repo / kata.solution, repo / kata.stub)
        pytest = fresh_pytest(kata, repo, env)
    notice, first, whole = (statistics.median(t[i] for t in watch) for i in range(3))
    fresh = statistics.median(pytest)
    print(f"kata {kata.id}, {len(watch)} saves with kvkata watch (the reference and a known mistake in turn), "
          "median seconds from the save:")
    print(f"  to \"grading kata {kata.id}…\": {notice:.2f} s; to the verdict's first line: {first:.2f} s "
          f"(max {max(t[1] for t in watch):.2f}); to its board line: {whole:.2f} s (max {max(t[2] for t in watch):.2f})")
    print(f"a fresh pytest katas/{kata.id}: median {fresh:.2f} s over {len(pytest)} runs")
    print(f"ratios: the first line {fresh / first:.1f}x sooner, the whole verdict {fresh / whole:.1f}x sooner "
          "than a fresh pytest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
