"""How fast ``kvkata watch`` answers a save, next to a fresh ``pytest katas/NN``.

    python -m grader.bench.watch [NN] [--saves 10]

Runs on a temporary copy of the repository (your files are never touched): starts the watcher
there, saves the kata's file ``--saves`` times (the reference and one known mistake in turn, so
every save changes the file), and times each save to its verdict line; then times three fresh
``pytest katas/NN`` runs on the reference. Prints the medians. A benchmark, not a test.
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


def _next_verdict(lines: queue.Queue, timeout: float = 120.0) -> float:
    while True:
        when, line = lines.get(timeout=timeout)
        if "checks pass" in line:
            return when


def save_to_verdict(kata: manifest.Kata, saves: int, repo: Path, env: dict) -> list[float]:
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
            took.append(_next_verdict(lines) - saved)
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
    print(f"kata {kata.id}: save to verdict with kvkata watch: median {statistics.median(watch):.2f} s "
          f"over {len(watch)} saves (min {min(watch):.2f}, max {max(watch):.2f})")
    print(f"kata {kata.id}: a fresh pytest katas/{kata.id}: median {statistics.median(pytest):.2f} s over {len(pytest)} runs")
    print(f"ratio: {statistics.median(pytest) / statistics.median(watch):.1f}x faster with the watcher")
    return 0


if __name__ == "__main__":
    sys.exit(main())
