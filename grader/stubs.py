"""The untouched stub of a kata: the committed version in git that nobody has started, or the
handout's pristine copy. ``kvkata reset`` puts it back; ``kvkata assign`` ships it."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path

from grader import manifest
from grader.errors import UsageError

PRISTINE_DIR = manifest.PACKAGE_DIR / "pristine"
GIT_DEPTH = 50  # commits of a stub's history searched for the untouched version

def looks_untouched(source: str) -> bool:
    """Whether every public function, and every public method but ``__init__``, raises
    NotImplementedError — the shape of a stub nobody has started."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    bodies = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            bodies.append(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            bodies += [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and m.name != "__init__" and (m.name.startswith("__") or not m.name.startswith("_"))]
    return bool(bodies) and all(_raises_not_implemented(b) for b in bodies)


def _raises_not_implemented(fn) -> bool:
    return any(isinstance(s, ast.Raise) and s.exc is not None and "NotImplementedError" in ast.unparse(s.exc)
               for s in fn.body)


def _git_versions(relpath: str, root: Path):
    """(text, origin) of each committed version of ``relpath``, newest first; nothing outside git."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)

    try:
        log = git("log", f"-n{GIT_DEPTH}", "--format=%H", "--", relpath)
        if log.returncode != 0:
            return
        for commit in log.stdout.split():
            shown = git("show", f"{commit}:./{relpath}")
            if shown.returncode == 0:
                yield shown.stdout, f"git commit {commit[:10]}"
    except (OSError, subprocess.SubprocessError):
        return


def pristine_stub(k: manifest.Kata) -> tuple[str, str]:
    """The untouched stub of ``k`` and where it was found."""
    for text, origin in _git_versions(k.stub, manifest.REPO_ROOT):
        if looks_untouched(text):
            return text, origin
    kept = PRISTINE_DIR / k.id / k.file
    if kept.is_file():
        return kept.read_text(encoding="utf-8"), str(kept)
    raise UsageError(
        f"cannot find the untouched stub of kata {k.id}: no committed version of {k.stub} in git looks "
        f"untouched, and {kept} does not exist. Clone the repository again (or ask for the handout) to get it.")
