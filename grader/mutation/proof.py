"""Prove once, re-prove what changed: what decides a kata's mutation run, as one fingerprint.

A whole-kata mutation run takes minutes; its result can only change when something it reads changes. The
fingerprint of a kata hashes exactly that: the reference, the kata's checks and known-mistake catalogue with
every grader module they import (followed statically, imports inside functions included), the mutation tool
itself, and the kata's entries in the reviewed list of equivalent mutants. ``grader/mutation_proofs.json``
records, per kata, the fingerprint of its last complete run with that run's figures; a kata whose fingerprint
differs from the recorded one is *stale* and its run must be done again (``python -m grader.mutation NN``
refreshes both the record and the report). The test suite re-runs the stale katas and one kata drawn at random,
and trusts the record for the rest.
"""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from grader import manifest
from grader.sources import Reader, digest, kata_closure, read as _read

PROOFS = manifest.PACKAGE_DIR / "mutation_proofs.json"
# The mutation tool: its own files and those its runner calls besides the checks, hashed as they are (what they
# import beyond the checks' closure decides nothing about which mutant a check kills).
TOOL = ("grader/mutation/operators.py", "grader/mutation/runner.py", "grader/mutation/summary.py", "grader/grade.py",
        "grader/learner/live.py", "grader/classroom/cohort/server.py")


def inputs(kata_id: str, read: Reader = _read) -> list[str]:
    """The files that decide kata ``kata_id``'s mutation run."""
    return sorted(set(kata_closure(kata_id, read)) | set(TOOL))


def fingerprint(kata_id: str, read: Reader = _read, equivalents: dict | None = None) -> str:
    """A hash of everything that decides the kata's mutation run (see the module's docstring)."""
    if equivalents is None:
        from grader.mutation import summary
        equivalents = summary.equivalents()
    listed = sorted(f"{m}\0{reason}" for (k, m), reason in equivalents.items() if k == kata_id)
    return digest(inputs(kata_id, read), read, "\0".join(listed))


def load(path: Path = PROOFS) -> dict[str, dict]:
    """kata id -> the record of its last complete run (fingerprint and figures); {} when there is none."""
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def save(records: dict[str, dict], path: Path = PROOFS) -> None:
    """Merge ``records`` into the file (other katas keep theirs), in kata order; processes saving at once
    take turns (a lock beside the file), and the file is replaced whole."""
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = {**load(path), **records}
        fresh = path.with_suffix(f".{os.getpid()}.tmp")
        fresh.write_text(json.dumps(dict(sorted(merged.items())), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(fresh, path)


def stale(kata_ids: list[str], records: dict[str, dict], fingerprints: dict[str, str]) -> list[str]:
    """The katas whose record is missing, or was made from other inputs than today's."""
    return [k for k in kata_ids if records.get(k, {}).get("fingerprint") != fingerprints[k]]


def refresh_command(kata_ids: list[str]) -> str:
    return "python -m grader.mutation " + " ".join(kata_ids) + " --report grader/mutation_report.md"


def to_rerun(kata_ids: list[str], records: dict[str, dict], fingerprints: dict[str, str], spot: str | None) -> list[str]:
    """The katas whose mutation run must be done again: the stale ones, and ``spot`` (drawn at random by the
    caller) so that a record that still matches is checked against a real run now and then."""
    again = set(stale(kata_ids, records, fingerprints)) | ({spot} & set(kata_ids))
    return [k for k in kata_ids if k in again]
