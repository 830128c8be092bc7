"""``python -m grader.mutation [NN ...]``: mutate the references, grade each mutant, report (every kata
when none is named). A complete run of a kata (no ``--only``) is recorded with the fingerprint of what decided
it in grader/mutation_proofs.json; ``--report`` renders every recorded kata. ``--stale`` names the katas whose
record no longer matches their inputs, and grades nothing."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader import manifest
from grader.mutation import proof, runner, summary


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader.mutation", description=__doc__)
    p.add_argument("katas", nargs="*", help="kata ids (01, 02, …, as in grader/manifest.toml); every kata when none is given")
    p.add_argument("--jobs", type=int, default=2, help="mutants graded at once (default 2)")
    p.add_argument("--report", type=Path, help="also write the Markdown report to this file")
    p.add_argument("--only", help="only the mutants whose id contains this text")
    p.add_argument("--timeout", type=float, help="seconds a mutant may run (default: from the reference's time)")
    p.add_argument("--list", action="store_true", help="list the mutants' ids and grade nothing")
    p.add_argument("--stale", action="store_true",
                   help="name the katas whose recorded run no longer matches what decides it, and grade nothing")
    p.add_argument("--render", action="store_true",
                   help="write --report from the recorded runs of every kata, and grade nothing")
    p.add_argument("--proofs", type=Path, default=proof.PROOFS, help=argparse.SUPPRESS)
    p.add_argument("--verbose", "-v", action="store_true", help="one line per mutant as it is graded")
    return p


class _Progress:
    """``kata 06: 57/197 mutants graded, 3 not killed`` on standard error: rewritten in place on a
    terminal, a line every tenth of the way otherwise."""

    def __init__(self, kata_id: str, total: int):
        self.kata_id, self.total, self.graded, self.alive = kata_id, total, 0, 0
        self.tty = sys.stderr.isatty()

    def step(self, killed: bool) -> None:
        self.graded += 1
        self.alive += not killed
        tenth = max(1, self.total // 10)
        if self.tty or self.graded % tenth == 0 or self.graded == self.total:
            line = f"kata {self.kata_id}: {self.graded}/{self.total} mutants graded, {self.alive} not killed"
            print(f"\r{line}" if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty and self.graded:
            print(file=sys.stderr)


def _write_report(path: Path, records: dict, listed: dict, only: str | None) -> None:
    command = " ".join(["python -m grader.mutation", *records] + ([f"--only {only!r}"] if only else []))
    path.write_text(f"# Mutation testing of the references\n\nReproduce: `{command}`. Each kata's fingerprint hashes "
                    f"what decided its run (grader/mutation/proof.py).\n\n{summary.render(records, listed)}",
                    encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.jobs < 1:
        raise SystemExit(f"--jobs: expected at least 1, got {args.jobs}")
    known = list(manifest.load())
    unknown = [k for k in args.katas if k not in known]
    if unknown:
        raise SystemExit(f"katas: expected ids among {', '.join(known)}, got {', '.join(unknown)}")
    args.katas = args.katas or known
    listed = summary.equivalents()
    if args.render:
        if not args.report:
            raise SystemExit("--render: expected --report PATH too")
        _write_report(args.report, proof.load(args.proofs), listed, None)
        return 0
    if args.stale:
        fingerprints = {k: proof.fingerprint(k, equivalents=listed) for k in args.katas}
        old = proof.stale(args.katas, proof.load(args.proofs), fingerprints)
        print(f"stale: {' '.join(old)}\nrefresh: {proof.refresh_command(old)}" if old else "every recorded run is current")
        return 0
    if args.list:
        for kata_id in args.katas:
            for m in runner.kata_mutants(manifest.get(kata_id), args.only):
                print(f"{kata_id}\t{m.id}")
        return 0
    results, records = [], {}
    for kata_id in args.katas:
        decided_by = proof.fingerprint(kata_id, equivalents=listed)  # before the run: what it grades
        progress = _Progress(kata_id, len(runner.kata_mutants(manifest.get(kata_id), args.only)))

        def show(o, kata_id=kata_id, progress=progress):
            if args.verbose:
                print(f"{kata_id} {'killed  ' if o.killed else 'SURVIVED'} {o.mutant.id}  {o.how}", flush=True)
            else:
                progress.step(o.killed)
        outcomes = runner.run(kata_id, jobs=args.jobs, only=args.only, timeout=args.timeout, on_outcome=show)
        progress.done()
        results.append(summary.figures(kata_id, outcomes, listed, complete=args.only is None))
        records[kata_id] = summary.record(results[-1], decided_by)
        if args.only is None:  # saved as each kata ends: a long run stopped half-way keeps what it proved
            proof.save({kata_id: records[kata_id]}, args.proofs)
    print(summary.render(records, listed), end="")
    if args.report:
        _write_report(args.report, proof.load(args.proofs) if args.only is None else records, listed, args.only)
    return 0 if all(not (f.surviving or f.stale or f.gone) for f in results) else 1


if __name__ == "__main__":
    sys.exit(main())
