"""Results as text, the same wherever they are shown (``kvkata check``, ``kvkata watch``, pytest's
kata summary, a notebook's check cell): a mark and the check's title, then what went wrong."""
from __future__ import annotations

MARKS = {"pass": "✓", "not-implemented": "·", "not-run": "·"}  # anything else (fail, timeout, error): ✗


def mark(status: str) -> str:
    return MARKS.get(status, "✗")


def result_lines(results, verbose: bool = True) -> list[str]:
    """One line a check (✓ pass, · not implemented or not run, ✗ otherwise), failures with their message."""
    lines = []
    for r in results:
        lines.append(f"{mark(r.status)} {r.check.title}")
        if verbose and r.status not in ("pass", "not-implemented", "not-run"):
            lines.extend("    " + line for line in r.message.splitlines())
        elif r.status == "not-implemented":
            lines[-1] += f" — {r.message}"
        elif r.status == "not-run":
            lines[-1] += " — not run"
    reasons = dict.fromkeys(r.message for r in results if r.status == "not-run")
    lines += [f"  (each check marked not run: {reason.removeprefix('not run: ')})" for reason in reasons]
    return lines
