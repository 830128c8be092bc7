"""The ``kvkata`` command: the board of every kata, the latest results and the next step."""
from __future__ import annotations

import argparse
import sys

from grader import manifest, state


def board() -> str:
    results = state.load_results()
    lines = [f"{'kata':<5} {'level':<6} {'title':<40} {'min':>4}  checks"]
    next_kata = None
    for kata in manifest.load().values():
        saved = results.get(kata.id)
        if saved:
            progress = f"{saved['passed']}/{saved['total']}"
        else:
            progress = "not started"
        if next_kata is None and (not saved or saved["passed"] < saved["total"]):
            next_kata = kata
        lines.append(f"{kata.id:<5} {kata.level:<6} {kata.title:<40} {kata.minutes:>4}  {progress}")
    if next_kata:
        lines.append(f"\nnext: open {next_kata.readme}, edit {next_kata.stub}, then run: pytest katas/{next_kata.id}")
    else:
        lines.append("\nevery kata passes.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvkata", description="KV-cache katas: the board and your next step.")
    parser.parse_args(argv)
    print(board())
    return 0


if __name__ == "__main__":
    sys.exit(main())
