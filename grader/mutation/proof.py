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

import ast
import fcntl
import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from grader import manifest

PROOFS = manifest.PACKAGE_DIR / "mutation_proofs.json"
# The mutation tool: its own files and those its runner calls besides the checks, hashed as they are (what they
# import beyond the checks' closure decides nothing about which mutant a check kills).
TOOL = ("grader/mutation/operators.py", "grader/mutation/runner.py", "grader/mutation/summary.py", "grader/grade.py",
        "grader/learner/live.py", "grader/classroom/cohort/server.py")
# Files a module reads by path rather than imports: grader.paged loads kata 06's reference from its one home.
READS = {"grader/paged.py": ("solutions/06/paged.py",)}

Reader = Callable[[str], str]


def _read(relative: str) -> str:
    return (manifest.REPO_ROOT / relative).read_text(encoding="utf-8")


def _module_file(name: str) -> str | None:
    """``grader.engine.core`` -> ``grader/engine/core.py`` (or the package's ``__init__.py``); None when
    the name is no module of the grader (a class imported from a module, another package)."""
    if name != "grader" and not name.startswith("grader."):
        return None
    base = name.replace(".", "/")
    for candidate in (f"{base}.py", f"{base}/__init__.py"):
        if (manifest.REPO_ROOT / candidate).is_file():
            return candidate
    return None


def _package_of(relative: str) -> str:
    parts = Path(relative).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts[:-1])


@functools.lru_cache(maxsize=None)
def _imports(relative: str, source: str) -> frozenset[str]:
    """The grader files a module imports anywhere in its body, and the packages above each of them."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source, relative)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(relative).split(".")
                package = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                base = ".".join(package + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    files = set()
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            found = _module_file(".".join(parts[:i]))
            if found:
                files.add(found)
    return frozenset(files)


def closure(roots: list[str], read: Reader = _read) -> list[str]:
    """Every file the roots depend on: the grader modules they import, transitively, and the files those
    read by path; sorted."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        relative = todo.pop()
        if relative in seen:
            continue
        seen.add(relative)
        if relative.endswith(".py") and relative.startswith("grader/"):
            todo.extend(_imports(relative, read(relative)) - seen)
        todo.extend(set(READS.get(relative, ())) - seen)
    return sorted(seen)


def inputs(kata_id: str, read: Reader = _read) -> list[str]:
    """The files that decide kata ``kata_id``'s mutation run."""
    kata = manifest.get(kata_id)
    roots = [kata.solution, f"grader/checks/k{kata_id}.py"]
    if (manifest.REPO_ROOT / f"grader/mistakes/k{kata_id}.py").is_file():
        roots.append(f"grader/mistakes/k{kata_id}.py")
    return sorted(set(closure(roots, read)) | set(TOOL))


def fingerprint(kata_id: str, read: Reader = _read, equivalents: dict | None = None) -> str:
    """A hash of everything that decides the kata's mutation run (see the module's docstring)."""
    if equivalents is None:
        from grader.mutation import summary
        equivalents = summary.equivalents()
    digest = hashlib.sha256()
    for relative in inputs(kata_id, read):
        digest.update(f"{relative}\0{read(relative)}\0".encode())
    listed = sorted(f"{m}\0{reason}" for (k, m), reason in equivalents.items() if k == kata_id)
    digest.update("\0".join(listed).encode())
    return digest.hexdigest()[:16]


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
