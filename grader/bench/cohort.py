"""How fast ``kvkata grade`` gets through a cohort: as it was before the warm server (a fresh
interpreter per worker, every row judged in this process, one after the other) against now
(workers and judges forked from the warm server, the reference's outputs remembered), side by
side in one run, next to one ``import torch``.

    python -m grader.bench.cohort [--pairs 48] [--jobs 2] [--level 1] [--paths before,now]

Generates a cohort in a temporary folder: submissions of the level's katas that are the
reference, the untouched stub, or one of the known mistakes in turn (so the pairs do the work a
real cohort does, failures and diagnoses included), grades it each way, each in a fresh process
of its own (so no way inherits another's warm caches), and prints seconds per pair, pairs per
minute and the speed-up, and whether every way gave the same rows. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader import manifest, mistakes
from grader.classroom import handouts
from grader.classroom.cohort import sandbox as cohort
from grader.classroom.cohort import grading

PATHS = {  # name: (what it is, the settings that make it)
    "before": ("fresh interpreter per worker, judged here", {"warm": False, "judges": 0, "remember": False}),
    "warm": ("forked from the warm server, judged here", {"warm": True, "judges": 0, "remember": False}),
    "now": ("forked workers and judges, remembering", {"warm": True}),
}


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


def timed(subs: list[str], path: str, jobs: int) -> tuple[float, list[dict]]:
    """Grade ``subs`` the ``path`` way in a fresh process: its seconds and rows."""
    with tempfile.TemporaryDirectory(prefix="kvkata-bench-rows-") as tmp:
        out = Path(tmp) / "rows.json"
        subprocess.run([sys.executable, "-m", "grader.bench.cohort", "--grade", path, "--jobs", str(jobs), "--out", str(out),
                        *subs], check=True)
        data = json.loads(out.read_text(encoding="utf-8"))
    return data["seconds"], data["rows"]


def grade(subs: list[str], path: str, jobs: int, out: Path) -> None:
    """In the fresh process: grade, and write the seconds and rows to ``out``."""
    settings = cohort.Settings(jobs=jobs, **PATHS[path][1])
    jobs_list = grading.jobs_for(subs, None, False)
    started = time.perf_counter()
    rows = cohort.grade_all(jobs_list, settings)
    seconds = time.perf_counter() - started
    out.write_text(json.dumps({"seconds": seconds, "rows": rows}), encoding="utf-8")


def import_torch_seconds() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - started


def _judged(row: dict) -> dict:
    """A row without what depends on the worker's timing or output (seconds, printed text)."""
    return {k: v for k, v in row.items() if k not in ("seconds", "output")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.bench.cohort", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=48)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--level", type=int, default=1)
    parser.add_argument("--paths", default="before,now", help=f"which ways to grade, in order: {', '.join(PATHS)}")
    parser.add_argument("--grade", choices=list(PATHS), help=argparse.SUPPRESS)  # one way, in a fresh process
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("subs", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.grade:
        grade(args.subs, args.grade, args.jobs, Path(args.out))
        return 0
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths:
        parser.error(f"--paths: expected some of {', '.join(PATHS)}")
    katas = handouts.katas_for(args.level, only=True)
    with tempfile.TemporaryDirectory(prefix="kvkata-bench-cohort-") as tmp:
        subs = make_cohort(Path(tmp), katas, args.pairs)
        pairs = len(subs) * len(katas)
        measured = {p: timed(subs, p, args.jobs) for p in paths}
    first = [_judged(r) for r in measured[paths[0]][1]]
    same = all([_judged(r) for r in rows] == first for _, rows in measured.values())
    torch_s = import_torch_seconds()
    print(f"cohort: {pairs} submission × kata pairs of level {args.level}, -j {args.jobs}")
    print(f"  one `import torch`: {torch_s:.2f} s")
    for p in paths:
        seconds = measured[p][0]
        print(f"  {p + ': ' + PATHS[p][0]:<50} {seconds:7.1f} s   {seconds / pairs:.2f} s a pair   "
              f"{60 * pairs / seconds:6.1f} pairs a minute")
    base = measured[paths[0]][0]
    for p in paths[1:]:
        print(f"  speed-up of {p} over {paths[0]}: {base / measured[p][0]:.1f}x")
    print(f"  rows identical (but for seconds and printed output): {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
