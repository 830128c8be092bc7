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


def record(f: KataFigures, fingerprint: str) -> dict:
    """The figures of a complete run as plain data, with the fingerprint of what decided them
    (grader.mutation.proof)."""
    return {"fingerprint": fingerprint, "mutants": f.mutants, "killed": f.killed, "equivalent": f.equivalent,
            "surviving": [[o.mutant.id, o.mutant.line] for o in f.surviving],
            "stale": [[o.mutant.id, o.how] for o in f.stale], "gone": list(f.gone), "reviewed": list(f.reviewed)}


def passed(rec: dict) -> bool:
    """A run that proves its kata's checks: every non-equivalent mutant killed, the reviewed list exact."""
    return not (rec["surviving"] or rec["stale"] or rec["gone"])


def render(records: dict[str, dict], listed: dict[tuple[str, str], str]) -> str:
    """A Markdown report from complete runs' records (kata id -> grader.mutation.summary.record): the table
    per kata, then every surviving mutant (equivalent ones with their reason)."""
    lines = ["| kata | mutants | killed | equivalent | surviving | killed / non-equivalent | fingerprint |",
             "|---|---|---|---|---|---|---|"]
    for kata, r in records.items():
        judged = r["mutants"] - r["equivalent"]
        score = r["killed"] / judged if judged else 1.0
        lines.append(f"| {kata} | {r['mutants']} | {r['killed']} | {r['equivalent']} | {len(r['surviving'])} | "
                     f"{r['killed']}/{judged} = {score:.1%} | `{r['fingerprint']}` |")
    for kata, r in records.items():
        sections = [
            ("surviving, not listed as equivalent", [f"`{m}` (line {line})" for m, line in r["surviving"]]),
            ("listed as equivalent but killed (remove from the list)", [f"`{m}`: {how}" for m, how in r["stale"]]),
            ("listed as equivalent but no longer a mutant of the reference (remove from the list)",
             [f"`{m}`" for m in r["gone"]]),
            ("equivalent mutants (reviewed)", [f"`{m}`: {listed.get((kata, m), '(no longer listed)')}"
                                               for m in r["reviewed"]]),
        ]
        for title, items in sections:
            if items:
                lines += ["", f"Kata {kata}: {title}:"] + [f"- {item}" for item in items]
    return "\n".join(lines) + "\n"
