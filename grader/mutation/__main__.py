"""``python -m grader.mutation NN [NN ...]``: mutate the references, grade each mutant, report."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader import manifest
from grader.mutation import runner, summary


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader.mutation", description=__doc__)
    p.add_argument("katas", nargs="+", help="kata ids (01 … 13)")
    p.add_argument("--jobs", type=int, default=2, help="mutants graded at once (default 2)")
    p.add_argument("--report", type=Path, help="also write the Markdown report to this file")
    p.add_argument("--only", help="only the mutants whose id contains this text")
    p.add_argument("--timeout", type=float, help="seconds a mutant may run (default: from the reference's time)")
    p.add_argument("--list", action="store_true", help="list the mutants' ids and grade nothing")
    p.add_argument("--verbose", "-v", action="store_true", help="one line per mutant as it is graded")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.jobs < 1:
        raise SystemExit(f"--jobs: expected at least 1, got {args.jobs}")
    listed = summary.equivalents()
    if args.list:
        for kata_id in args.katas:
            for m in runner.kata_mutants(manifest.get(kata_id), args.only):
                print(f"{kata_id}\t{m.id}")
        return 0
    results = []
    for kata_id in args.katas:
        def show(o, kata_id=kata_id):
            if args.verbose:
                print(f"{kata_id} {'killed  ' if o.killed else 'SURVIVED'} {o.mutant.id}  {o.how}", flush=True)
        outcomes = runner.run(kata_id, jobs=args.jobs, only=args.only, timeout=args.timeout, on_outcome=show)
        results.append(summary.figures(kata_id, outcomes, listed))
    text = summary.render(results, listed)
    print(text, end="")
    if args.report:
        command = " ".join(["python -m grader.mutation", *args.katas] + ([f"--only {args.only!r}"] if args.only else []))
        args.report.write_text(f"# Mutation testing of the references\n\nReproduce: `{command}`\n\n{text}", encoding="utf-8")
    return 0 if all(not f.surviving for f in results) else 1


if __name__ == "__main__":
    sys.exit(main())
