"""``kvkata assign``: a handout of a level's katas — stubs, READMEs, notebooks, the grader without
solutions, mistakes or the checks of other katas, each kata's public record (grader.classroom.tape)
so its checks run there, and a GitHub Classroom workflow that runs them on every push."""
from __future__ import annotations

import re
import shutil
import tempfile
import time
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

## Check your work here

```bash
pytest katas/{first}       # one kata; `pytest` alone checks them all
kvkata check {first}       # the same, as a list; `kvkata watch` re-checks on every save
```

The checks run here on **public inputs**: fixed inputs with the reference solution's answers
recorded for them (the solutions themselves are not in this handout). A failing check says on
which input, what was expected and what your code gave, and when your code behaves like a known
mistake it names the mistake and gives a hint. Your instructor's grading runs every check on
other inputs that you have not seen, so make the code right, not the answers to these inputs.

| kata | public checks | known mistakes the public checks catch |
|---|---|---|
{shares}
{ci}
## Hand in

Hand in the whole `katas/` folder, keeping its layout `katas/NN/<file>.py`. Your instructor grades
every submission with `kvkata grade`, which runs each one in a sandbox with a time and memory
limit, and sends you back, per kata, the checks passed and what failed.
"""

CI_NOTE = """
On GitHub (GitHub Classroom), every push runs these checks (`.github/workflows/classroom.yml`):
the job's summary has one line per kata, and the job fails while any check fails.
"""

WORKFLOW = """# Runs the handout's public checks on every push; one line per kata in the job summary.
name: kata checks
on:
  push:
  workflow_dispatch:
permissions:
  contents: read
jobs:
  public-checks:
    runs-on: ubuntu-latest
    timeout-minutes: 30
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - name: Install (PyTorch for the CPU, then this project)
        run: |
          python -m pip install --upgrade pip
          python -m pip install torch --index-url https://download.pytorch.org/whl/cpu
          python -m pip install -e .
      - name: Public checks
        run: kvkata check --device cpu --summary "$GITHUB_STEP_SUMMARY"
"""


PAGED_SHIM = '''"""The paged KV cache that katas 11 and 13 build on. In the full repository this module is a
reference implementation of kata 06; this handout assigns kata 06, so here it is yours:
``katas/06/paged.py``, loaded from the handout's folder. Finish kata 06 before katas 11 and 13."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_FILE = Path(__file__).resolve().parent.parent / "katas" / "06" / "paged.py"
_spec = importlib.util.spec_from_file_location("kvkata_handout_paged", _FILE)
_module = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _module
_spec.loader.exec_module(_module)

BlockAllocator = _module.BlockAllocator
OutOfBlocksError = _module.OutOfBlocksError
PagedKVCache = _module.PagedKVCache
'''


def katas_for(level: int, only: bool = False) -> list[manifest.Kata]:
    chosen = [k for k in manifest.load().values() if (k.level == level if only else k.level <= level)]
    if not chosen:
        levels = sorted({k.level for k in manifest.load().values()})
        raise UsageError(f"--level {level}: no kata has that level; levels: {', '.join(map(str, levels))}")
    return chosen


def require_solutions(katas: list[manifest.Kata], what: str) -> None:
    missing = [k.solution for k in katas if not (manifest.REPO_ROOT / k.solution).is_file()]
    if missing:
        raise UsageError(f"no reference solution here ({', '.join(missing)}): {what} is made from the full repository")


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
        skip = {n for n in names if n in ("__pycache__", "pristine", "public", "mistakes") or n.endswith(".pyc")}
        if Path(folder) == manifest.PACKAGE_DIR:  # mutation testing needs the references, and its lists quote them
            skip |= {n for n in names if n in ("mutation", "mutation_equivalents.toml", "mutation_report.md")}
        if Path(folder).name == "checks":
            skip |= {n for n in names if re.fullmatch(r"k(\w+)\.py", n) and n[1:-3] not in ids}
        return skip

    shutil.copytree(manifest.PACKAGE_DIR, dest, ignore=ignore)
    (dest / "manifest.toml").write_text(manifest_text(ids), encoding="utf-8")
    if "06" in ids:  # grader/paged.py is kata 06's reference: here the later katas build on the student's own
        (dest / "paged.py").write_text(PAGED_SHIM, encoding="utf-8")
    for k in katas:
        stub, _ = learner.pristine_stub(k)
        state.write_atomic(dest / "pristine" / k.id / k.file, stub.encode("utf-8"))


def _pyproject() -> str:
    """The repository's, with the handout's katas as the tests (no tests/ folder in a handout)."""
    text = (manifest.REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return text.replace('testpaths = ["tests"]', 'testpaths = ["katas"]')


def record_public(dest: Path, katas: list[manifest.Kata], say=None) -> dict[str, dict]:
    """Write each kata's public record into ``dest`` (a handout's grader/public); per kata, what it
    holds: public checks of all, and the known mistakes they catch (measured on the public inputs)."""
    from grader.classroom import tape

    shares = {}
    if say:
        say("recording each kata's public checks: the reference and every known mistake on the public inputs")
    for k in katas:
        started = time.monotonic()
        data = tape.record(k.id, progress=say)
        tape.save(dest / f"{k.id}.pt", data)
        shares[k.id] = tape.share(data)
        if say:
            caught = shares[k.id]
            say(f"kata {k.id}: {len(data['public'])} of {len(data['checks'])} checks public; they catch "
                f"{caught['caught']} of {caught['mistakes']} known mistakes ({time.monotonic() - started:.0f} s)")
    return shares


def _share_line(k: manifest.Kata, share: dict) -> str:
    n, m = share["public"], share["checks"]
    caught, total = share["caught"], share["mistakes"]
    percent = f" ({100 * caught / total:.0f}%)" if total else ""
    return f"| {k.id} {k.title} | {n} of {m} | {caught} of {total}{percent} |"


def assign(level: int, out: str | None, only: bool = False, force: bool = False, ci: bool = True, say=None) -> str:
    """Write a handout of the level's katas to ``out``; what was written, to print. ``say`` hears progress."""
    katas = katas_for(level, only)
    require_solutions(katas, "a handout")
    dest = Path(out or f"handout-level{level}").resolve()
    if dest == manifest.REPO_ROOT or manifest.REPO_ROOT.is_relative_to(dest) or dest.is_relative_to(manifest.PACKAGE_DIR):
        raise UsageError(f"--out {dest}: that would overwrite the repository itself; choose another folder")
    if dest.exists() and not force:
        raise UsageError(f"--out {dest} exists already; choose another folder, or add --force to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=".kvkata-handout-", dir=dest.parent))
    try:
        notebooks = _fill(build, katas, level, ci, say)
        if dest.exists():
            shutil.rmtree(dest)
        build.rename(dest)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    listed = ", ".join(f"{k.id} ({k.title})" for k in katas)
    return (f"wrote a handout of {len(katas)} kata(s) to {dest}: {listed}"
            + (f"; notebooks: {', '.join(notebooks)}" if notebooks else "; no notebooks yet")
            + ("; a GitHub Classroom workflow" if ci else "")
            + "\nno solutions and no known-mistake catalogue are in it, only the public checks' recorded answers "
            "(see its README); grade the submissions with `kvkata grade`")


def _fill(build: Path, katas: list[manifest.Kata], level: int, ci: bool, say) -> list[str]:
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
    shares = record_public(build / "grader" / "public", katas, say)
    (build / "pyproject.toml").write_text(_pyproject(), encoding="utf-8")
    if (root / ".gitignore").is_file():
        shutil.copyfile(root / ".gitignore", build / ".gitignore")
    if ci:
        (build / ".github" / "workflows").mkdir(parents=True)
        (build / ".github" / "workflows" / "classroom.yml").write_text(WORKFLOW, encoding="utf-8")
    table = "\n".join(f"- kata {k.id} — {k.title} (level {k.level}, about {k.minutes} min): `katas/{k.id}/{k.file}`"
                      for k in katas)
    hint = "\nNotebooks, one a kata, are in `notebooks/`; their check cell runs the same public checks." if notebooks else ""
    text = STUDENT_README.format(level=level, table=table, notebooks=hint, first=katas[0].id,
                                 shares="\n".join(_share_line(k, shares[k.id]) for k in katas),
                                 ci=CI_NOTE if ci else "")
    (build / "README.md").write_text(text, encoding="utf-8")
    return notebooks
