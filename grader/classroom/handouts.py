"""``kvkata assign``: a handout of a level's katas — stubs, READMEs, notebooks and the grader without
solutions, mistakes or the checks of other katas."""
from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from grader import learner, manifest, state
from grader.errors import UsageError

STUDENT_README = """# KV-cache katas — level {level} handout

{table}

## Set up

```bash
python -m venv .venv && . .venv/bin/activate
pip install -e .
kvkata            # the board: every kata of this handout
kvkata hint {first}    # a hint, one step at a time
```

## Work

Open `katas/NN/README.md` and fill in the file next to it (`katas/NN/<file>.py`).{notebooks}
`kvkata reset NN` puts a kata's untouched file back (your version is saved first).

## Grading — please read

The hidden checks compare your code with reference solutions on many inputs, and this handout has
no reference solutions. So your work **cannot be graded here**: `pytest katas/NN` says so and stops.
What you can do locally: make sure each file imports (`python {first_stub}` prints nothing
and raises nothing) and try your functions by hand.

Hand in the whole `katas/` folder, keeping its layout `katas/NN/<file>.py`. Your instructor grades
every submission with `kvkata grade`, which runs each one in a sandbox with a time and memory
limit, and sends you back, per kata, the checks passed and what failed.
"""


def katas_for(level: int, only: bool = False) -> list[manifest.Kata]:
    chosen = [k for k in manifest.load().values() if (k.level == level if only else k.level <= level)]
    if not chosen:
        levels = sorted({k.level for k in manifest.load().values()})
        raise UsageError(f"--level {level}: no kata has that level; levels: {', '.join(map(str, levels))}")
    return chosen


# -- assign ---------------------------------------------------------------------------------
def manifest_text(ids: set[str]) -> str:
    """The manifest with only the handout's katas (their follow-ups stay with them)."""
    text = manifest.MANIFEST_FILE.read_text(encoding="utf-8")
    head, *blocks = re.split(r"(?m)^(?=\[\[kata\]\]\s*$)", text)
    keep = [b for b in blocks if (m := re.search(r'(?m)^id\s*=\s*"([^"]+)"', b)) and m.group(1) in ids]
    return head + "".join(keep)


def _copy_grader(dest: Path, katas: list[manifest.Kata]) -> None:
    ids = {k.id for k in katas}

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in ("__pycache__", "pristine") or n.endswith(".pyc")}
        if Path(folder).name == "mistakes":  # no known-mistake catalogue: it is the reference with bugs
            skip |= {n for n in names if n != "__init__.py"}
        if Path(folder).name == "checks":
            skip |= {n for n in names if re.fullmatch(r"k(\w+)\.py", n) and n[1:-3] not in ids}
        return skip

    shutil.copytree(manifest.PACKAGE_DIR, dest, ignore=ignore)
    (dest / "manifest.toml").write_text(manifest_text(ids), encoding="utf-8")
    for k in katas:
        stub, _ = learner.pristine_stub(k)
        state.write_atomic(dest / "pristine" / k.id / k.file, stub.encode("utf-8"))


def _pyproject() -> str:
    text = (manifest.REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return text.replace("-p grader.plugin", "-p grader.classroom.handout_plugin")


def assign(level: int, out: str | None, only: bool = False, force: bool = False) -> str:
    """Write a handout of the level's katas to ``out``; what was written, to print."""
    katas = katas_for(level, only)
    dest = Path(out or f"handout-level{level}").resolve()
    if dest == manifest.REPO_ROOT or manifest.REPO_ROOT.is_relative_to(dest) or dest.is_relative_to(manifest.PACKAGE_DIR):
        raise UsageError(f"--out {dest}: that would overwrite the repository itself; choose another folder")
    if dest.exists() and not force:
        raise UsageError(f"--out {dest} exists already; choose another folder, or add --force to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=".kvkata-handout-", dir=dest.parent))
    try:
        notebooks = _fill(build, katas, level)
        if dest.exists():
            shutil.rmtree(dest)
        build.rename(dest)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    listed = ", ".join(f"{k.id} ({k.title})" for k in katas)
    return (f"wrote a handout of {len(katas)} kata(s) to {dest}: {listed}"
            + (f"; notebooks: {', '.join(notebooks)}" if notebooks else "; no notebooks yet")
            + "\nno solutions and no known-mistake catalogue are in it; grade the submissions with `kvkata grade`")


def _fill(build: Path, katas: list[manifest.Kata], level: int) -> list[str]:
    root, notebooks = manifest.REPO_ROOT, []
    for k in katas:
        stub, _ = learner.pristine_stub(k)
        state.write_atomic(build / k.stub, stub.encode("utf-8"))
        shutil.copyfile(root / k.readme, build / k.readme)
        if (root / k.notebook).is_file():
            (build / "notebooks").mkdir(exist_ok=True)
            shutil.copyfile(root / k.notebook, build / k.notebook)
            notebooks.append(k.notebook)
    _copy_grader(build / "grader", katas)
    (build / "pyproject.toml").write_text(_pyproject(), encoding="utf-8")
    if (root / ".gitignore").is_file():
        shutil.copyfile(root / ".gitignore", build / ".gitignore")
    table = "\n".join(f"- kata {k.id} — {k.title} (level {k.level}, about {k.minutes} min): `katas/{k.id}/{k.file}`"
                      for k in katas)
    hint = "\nNotebooks, one a kata, are in `notebooks/`." if notebooks else ""
    text = STUDENT_README.format(level=level, table=table, notebooks=hint, first=katas[0].id, first_stub=katas[0].stub)
    (build / "README.md").write_text(text, encoding="utf-8")
    return notebooks
