"""The reviewed list of equivalent mutants, and the report of a run."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from grader import manifest

EQUIVALENTS = manifest.PACKAGE_DIR / "mutation_equivalents.toml"


def equivalents(path: Path = EQUIVALENTS) -> dict[tuple[str, str], str]:
    """(kata, mutant id) -> why the mutant behaves exactly like the reference everywhere the SPEC reaches."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    found = {}
    for i, entry in enumerate(data.get("equivalent", [])):
        missing = [key for key in ("kata", "mutant", "reason") if not str(entry.get(key, "")).strip()]
        if missing:
            raise ValueError(f"{path.name}: entry {i + 1}: expected kata, mutant and reason, missing {', '.join(missing)}")
        found[(entry["kata"], entry["mutant"])] = entry["reason"]
    return found


@dataclass
class KataFigures:
    kata: str
    mutants: int
    killed: int
    equivalent: int
    surviving: list  # Outcomes of surviving mutants not listed as equivalent
    stale: list  # listed as equivalent, but killed
    reviewed: list  # ids of the surviving mutants listed as equivalent
    gone: list  # ids listed as equivalent for this kata that no mutant of the reference has any more

    @property
    def score(self) -> float:
        judged = self.mutants - self.equivalent
        return self.killed / judged if judged else 1.0


def figures(kata_id: str, outcomes: list, listed: dict[tuple[str, str], str], complete: bool = True) -> KataFigures:
    """The figures of one kata's run; ``complete`` when every mutant was graded (no ``--only``), so that
    listed mutants the reference no longer has can be told."""
    killed = [o for o in outcomes if o.killed]
    survivors = [o for o in outcomes if not o.killed]
    equivalent = [o for o in survivors if (kata_id, o.mutant.id) in listed]
    ids = {o.mutant.id for o in outcomes}
    gone = sorted(m for (k, m) in listed if k == kata_id and m not in ids) if complete else []
    return KataFigures(kata_id, len(outcomes), len(killed), len(equivalent),
                       [o for o in survivors if (kata_id, o.mutant.id) not in listed],
                       [o for o in killed if (kata_id, o.mutant.id) in listed],
                       sorted(o.mutant.id for o in equivalent), gone)


def render(all_figures: list[KataFigures], listed: dict[tuple[str, str], str]) -> str:
    """A Markdown report: the table per kata, then every surviving mutant (equivalent ones with their reason)."""
    lines = ["| kata | mutants | killed | equivalent | surviving | killed / non-equivalent |",
             "|---|---|---|---|---|---|"]
    for f in all_figures:
        lines.append(f"| {f.kata} | {f.mutants} | {f.killed} | {f.equivalent} | {len(f.surviving)} | "
                     f"{f.killed}/{f.mutants - f.equivalent} = {f.score:.1%} |")
    for f in all_figures:
        sections = [
            ("surviving, not listed as equivalent", [f"`{o.mutant.id}` (line {o.mutant.line})" for o in f.surviving]),
            ("listed as equivalent but killed (remove from the list)", [f"`{o.mutant.id}`: {o.how}" for o in f.stale]),
            ("listed as equivalent but no longer a mutant of the reference (remove from the list)",
             [f"`{m}`" for m in f.gone]),
            ("equivalent mutants (reviewed)", [f"`{m}`: {listed[(f.kata, m)]}" for m in f.reviewed]),
        ]
        for title, items in sections:
            if items:
                lines += ["", f"Kata {f.kata}: {title}:"] + [f"- {item}" for item in items]
    return "\n".join(lines) + "\n"
