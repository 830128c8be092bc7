"""How fast ``kvkata grade`` gets through a cohort: workers forked from the warm server against a
fresh interpreter per worker, side by side in one run, next to one ``import torch``.

    python -m grader.classroom.bench_cohort [--pairs 48] [--jobs 2] [--level 1]

Generates a cohort in a temporary folder: submissions of the level's katas that are the
reference, the untouched stub, or one of the known mistakes in turn (so the pairs do the work a
real cohort does, failures and diagnoses included), grades it both ways and prints seconds per
pair and pairs per minute. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader import manifest, mistakes
from grader.classroom import cohort, grading, handouts


def make_cohort(folder: Path, katas: list[manifest.Kata], pairs: int) -> list[str]:
    """Enough submissions, each holding every kata of ``katas``, to make at least ``pairs`` pairs."""
    variants = {}
    for k in katas:
        reference = (manifest.REPO_ROOT / k.solution).read_text(encoding="utf-8")
        stub = (manifest.REPO_ROOT / k.stub).read_text(encoding="utf-8")
        variants[k.id] = itertools.cycle([reference, stub] + [m.apply(reference) for m in mistakes.catalogue(k.id)])
    count = -(-pairs // len(katas))
    for i in range(count):
        for k in katas:
            path = folder / f"student{i:02d}" / k.stub
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(next(variants[k.id]), encoding="utf-8")
    return [str(folder / f"student{i:02d}") for i in range(count)]


def timed(subs: list[str], warm: bool, jobs: int) -> tuple[float, list[dict]]:
    jobs_list = grading.jobs_for(subs, None, False)
    settings = cohort.Settings(jobs=jobs, warm=warm)
    started = time.perf_counter()
    rows = cohort.grade_all(jobs_list, settings)
    return time.perf_counter() - started, rows


def import_torch_seconds() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.classroom.bench_cohort", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=48)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--level", type=int, default=1)
    args = parser.parse_args(argv)
    katas = handouts.katas_for(args.level, only=True)
    with tempfile.TemporaryDirectory(prefix="kvkata-bench-cohort-") as tmp:
        subs = make_cohort(Path(tmp), katas, args.pairs)
        pairs = len(subs) * len(katas)
        fresh_s, fresh_rows = timed(subs, False, args.jobs)
        warm_s, warm_rows = timed(subs, True, args.jobs)
    same = [(r["status"], r["passed"], r["diagnosis"]) for r in fresh_rows] == \
           [(r["status"], r["passed"], r["diagnosis"]) for r in warm_rows]
    torch_s = import_torch_seconds()
    print(f"cohort: {pairs} submission × kata pairs of level {args.level}, -j {args.jobs}")
    print(f"  one `import torch`: {torch_s:.2f} s")
    for name, seconds in (("fresh interpreter per worker", fresh_s), ("forked from the warm server", warm_s)):
        print(f"  {name:<30} {seconds:7.1f} s   {seconds / pairs:.2f} s a pair   {60 * pairs / seconds:6.1f} pairs a minute")
    print(f"  speed-up: {fresh_s / warm_s:.1f}x; rows identical: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
