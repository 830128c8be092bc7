"""What a kata's grading reads: the grader modules a file imports, followed through the source, and the files
those read by path. Its users hash that set to tell when something proven once must be proven again
(grader.mutation.proof: a kata's mutation run; grader.classroom.handouts: a kata's public record)."""
from __future__ import annotations

import ast
import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

from grader import manifest

# Files a module reads by path rather than imports: grader.paged loads kata 06's reference from its one home.
READS = {"grader/paged.py": ("solutions/06/paged.py",)}

Reader = Callable[[str], str]


def read(relative: str) -> str:
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


def closure(roots: list[str], read: Reader = read) -> list[str]:
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




def kata_closure(kata_id: str, read: Reader = read) -> list[str]:
    """What grading kata ``kata_id`` reads: its reference, its checks and its known-mistake catalogue, with every
    grader module they import."""
    kata = manifest.get(kata_id)
    roots = [kata.solution, f"grader/checks/k{kata_id}.py"]
    if (manifest.REPO_ROOT / f"grader/mistakes/k{kata_id}.py").is_file():
        roots.append(f"grader/mistakes/k{kata_id}.py")
    return closure(roots, read)


def digest(files: list[str], read: Reader = read, extra: str = "") -> str:
    """A short hash of the files' paths and contents (and ``extra``)."""
    h = hashlib.sha256()
    for relative in files:
        h.update(f"{relative}\0{read(relative)}\0".encode())
    h.update(extra.encode())
    return h.hexdigest()[:16]
