"""``kvkata assign``: a handout of a level's katas or of single katas — stubs, READMEs, notebooks,
the grader without solutions, mistakes, the recorder, the checks of other katas or the instructor's
parts (the classroom's commands, the bench, mutation testing), each kata's public record
(grader.public_record.tape) so its checks run there, a pyproject of its own and a GitHub Classroom
workflow (grader.classroom.workflow) that scores them on every push. Kata 06's paged cache comes
along only as a copy for level-4 katas without kata 06."""
from __future__ import annotations

import ast
import re
import shutil
import tempfile
import time
from pathlib import Path

from grader import manifest, state
from grader.classroom import choice, workflow
from grader.errors import UsageError
from grader.public_record import kept
from grader.stubs import pristine_stub

STUDENT_README = """# KV-cache katas — a handout of {covers}

{table}

## Set up

```bash
python -m venv .venv && . .venv/bin/activate
pip install -e .
kvkata            # the board: every kata of this handout
kvkata hint {first}    # a hint, one step at a time
```

No CUDA GPU? Run `pip install torch --index-url https://download.pytorch.org/whl/cpu` before
`pip install -e .`: the CPU build of PyTorch, under 1 GB instead of the 5 GB of the CUDA build that
pip resolves on Linux.

## Work

Open `katas/NN/README.md` and fill in the file next to it (`katas/NN/<file>.py`).{notebooks}
{paged}`kvkata reset NN` puts a kata's untouched file back (your version is saved first).

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
## GitHub Classroom

On GitHub (GitHub Classroom), every push runs the public checks (`.github/workflows/classroom.yml`):
each kata is one autograding test, scored its points when all its public checks pass, and the
points go to the assignment's grade column. Points per kata: {points}.
The run is red until every kata passes: you start from stubs that fail, so a red run on your
first pushes is expected. Its summary lists each kata's test.
"""

PAGED_NOTE = """
{users} on kata 06's paged cache, which this handout does not assign: `grader/paged.py`
gives them a copy of kata 06's reference solution (`grader/paged_reference.py`), so that they run
here. Kata 06 itself is not graded here.

"""

OWN_PAGED_NOTE = """
{users} on kata 06's paged cache: `grader/paged.py` loads your own `katas/06/paged.py`,
so finish kata 06 first.

"""


def katas_for(level: int | None, only: bool = False, ids: list[str] | None = None) -> list[manifest.Kata]:
    return choice.katas(level, only, ids)


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


def uses_paged(kata: manifest.Kata) -> bool:
    """Whether the kata builds on the shared paged cache: its stub or its checks import grader.paged."""
    texts = [(manifest.REPO_ROOT / kata.stub).read_text(encoding="utf-8")]
    texts += [path.read_text(encoding="utf-8") for path in check_modules({kata.id})]
    return any(re.search(r"\bgrader\.paged\b|from grader import [^\n]*\bpaged\b", t) for t in texts)


def check_modules(ids: set[str]) -> list[Path]:
    """The checks' modules these katas' checks run: ``kNN.py`` and every module of ``grader/checks``
    they import, directly or not (kata 06's checks use k06_programs and k06_aliasing, for instance)."""
    folder = manifest.PACKAGE_DIR / "checks"
    chosen, todo = [], [folder / f"k{i}.py" for i in sorted(ids)]
    while todo:
        path = todo.pop(0)
        if path in chosen or not path.is_file():
            continue
        chosen.append(path)
        todo += [folder / f"{n}.py" for n in _checks_imported(path)]
    return chosen


def _checks_imported(path: Path) -> list[str]:
    """The modules of ``grader/checks`` that ``path`` imports, however it spells the import
    (``from grader.checks.k08 import x``, ``from grader.checks import k06_aliasing as aliasing``,
    ``import grader.checks.k11_oracle``)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "grader.checks":
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grader.checks."):
            names.append(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            names += [a.name.split(".")[2] for a in node.names if a.name.startswith("grader.checks.")]
    return names


PAGED_COPY = "paged_reference.py"  # where grader/paged.py looks for a copy (its COPY)
SHARED_CHECKS = ("__init__.py",)  # with checks/support/, which every kata's checks use
NOT_IN_A_HANDOUT = ("__pycache__", "pristine", "public", "mistakes", "tape.py", "kept.py")  # the recorder
INSTRUCTORS_ONLY = ("classroom", "bench", "mutation", "mutation_equivalents.toml", "mutation_report.md",
                    "mutation_proofs.json", "mutation_proofs.lock")


def _copy_grader(dest: Path, katas: list[manifest.Kata]) -> None:
    ids = {k.id for k in katas}
    kept = {p.name for p in check_modules(ids)} | set(SHARED_CHECKS)
    checks_dir = manifest.PACKAGE_DIR / "checks"

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in NOT_IN_A_HANDOUT or n.endswith(".pyc")}
        if Path(folder) == manifest.PACKAGE_DIR:  # grading a cohort, the bench and mutation testing need the references
            skip |= {n for n in names if n in INSTRUCTORS_ONLY}
        if Path(folder) == checks_dir:
            skip |= {n for n in names if n.endswith(".py") and n not in kept}
        if Path(folder) == checks_dir / "promises":  # the promise tables of its own katas only
            skip |= {n for n in names if n.endswith(".toml") and n[1:-5] not in ids}
        return skip

    shutil.copytree(manifest.PACKAGE_DIR, dest, ignore=ignore)
    (dest / "manifest.toml").write_text(manifest_text(ids), encoding="utf-8")
    if paged_copy_needed(katas):  # kata 06's reference, for katas that build on it without kata 06
        shutil.copyfile(manifest.REPO_ROOT / manifest.get("06").solution, dest / PAGED_COPY)
    for k in katas:
        stub, _ = pristine_stub(k)
        state.write_atomic(dest / "pristine" / k.id / k.file, stub.encode("utf-8"))


def paged_copy_needed(katas: list[manifest.Kata]) -> bool:
    return "06" not in {k.id for k in katas} and any(uses_paged(k) for k in katas)


def paged_note(katas: list[manifest.Kata]) -> str:
    users = [k.id for k in katas if k.id != "06" and uses_paged(k)]
    if not users:
        return ""
    note = PAGED_NOTE if paged_copy_needed(katas) else OWN_PAGED_NOTE
    return note.format(users=f"Kata {users[0]} builds" if len(users) == 1
                       else f"Katas {', '.join(users[:-1])} and {users[-1]} build")


def record_public(dest: Path, katas: list[manifest.Kata], say=None) -> dict[str, dict]:
    """Write each kata's public record into ``dest`` (a handout's grader/public); per kata, what it
    holds: public checks of all, and the known mistakes they catch (measured on the public inputs)."""
    shares = {}
    if say:
        say("recording each kata's public checks: the reference and every known mistake on the public inputs")
    for k in katas:
        started = time.monotonic()
        shares[k.id], copied = kept.record_into(dest, k.id, progress=say)
        if say:
            caught = shares[k.id]
            how = f"kept from an earlier recording ({kept.CACHE})" if copied else f"{time.monotonic() - started:.0f} s"
            say(f"kata {k.id}: {caught['public']} of {caught['checks']} checks public; they catch "
                f"{caught['caught']} of {caught['mistakes']} known mistakes ({how})")
    return shares


def _share_line(k: manifest.Kata, share: dict) -> str:
    n, m = share["public"], share["checks"]
    caught, total = share["caught"], share["mistakes"]
    percent = f" ({100 * caught / total:.0f}%)" if total else ""
    return f"| {k.id} {k.title} | {n} of {m} | {caught} of {total}{percent} |"


def title(katas: list[manifest.Kata], level: int | None, only: bool) -> str:
    """``level 2`` or ``level 2 and below`` or ``kata 03`` / ``katas 03 and 05``: what the handout covers."""
    if level is not None:
        return f"level {level}" if only or level == min(k.level for k in manifest.load().values()) else \
            f"level {level} and below"
    ids = [k.id for k in katas]
    return f"kata {ids[0]}" if len(ids) == 1 else f"katas {', '.join(ids[:-1])} and {ids[-1]}"


def assign(level: int | None, out: str | None, only: bool = False, force: bool = False, ci: bool = True, say=None,
           kata_ids: list[str] | None = None, points: str | None = None) -> str:
    """Write a handout of the chosen katas (a level, or ``kata_ids``) to ``out``; what was written, to
    print. ``points`` (``--points``) sets each kata's points in its GitHub Classroom workflow."""
    katas = katas_for(level, only, kata_ids)
    require_solutions(katas, "a handout")
    points_of = choice.points(points, katas)
    workflow_text = workflow.text(katas, points_of) if ci else None
    default = f"handout-level{level}" if level is not None else "handout-kata" + "-".join(k.id for k in katas)
    dest = Path(out or default).resolve()
    if dest == manifest.REPO_ROOT or manifest.REPO_ROOT.is_relative_to(dest) or dest.is_relative_to(manifest.PACKAGE_DIR):
        raise UsageError(f"--out {dest}: that would overwrite the repository itself; choose another folder")
    if dest.exists() and not force:
        raise UsageError(f"--out {dest} exists already; choose another folder, or add --force to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=".kvkata-handout-", dir=dest.parent))
    build.chmod(0o777 & ~state.umask())  # mkdtemp makes it 0700: the handout gets a new folder's mode
    try:
        notebooks = _fill(build, katas, title(katas, level, only), workflow_text, points_of, say)
        if dest.exists():
            shutil.rmtree(dest)
        build.rename(dest)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    listed = ", ".join(f"{k.id} ({k.title})" for k in katas)
    return (f"wrote a handout of {len(katas)} kata(s) to {dest}: {listed}"
            + (f"; notebooks: {', '.join(notebooks)}" if notebooks else "; no notebooks yet")
            + (f"; a GitHub Classroom workflow, points {choice.describe(points_of)}" if ci else "")
            + "\nno solutions and no known-mistake catalogue are in it, only the public checks' recorded answers "
            "(see its README)" + ("; but a copy of kata 06's reference paged cache, which its katas build on"
                                   if paged_copy_needed(katas) else "")
            + "; grade the submissions with `kvkata grade`")


def _fill(build: Path, katas: list[manifest.Kata], covers: str, workflow_text: str | None, points_of: dict,
          say) -> list[str]:
    root, notebooks = manifest.REPO_ROOT, []
    for k in katas:
        stub, _ = pristine_stub(k)
        state.write_atomic(build / k.stub, stub.encode("utf-8"))
        shutil.copyfile(root / k.readme, build / k.readme)
        if (root / k.notebook).is_file():
            (build / "notebooks").mkdir(exist_ok=True)
            shutil.copyfile(root / k.notebook, build / k.notebook)
            notebooks.append(k.notebook)
    _copy_grader(build / "grader", katas)
    shares = record_public(build / "grader" / "public", katas, say)
    (build / "pyproject.toml").write_text(workflow.pyproject(), encoding="utf-8")
    if (root / ".gitignore").is_file():
        shutil.copyfile(root / ".gitignore", build / ".gitignore")
    if workflow_text is not None:
        (build / ".github" / "workflows").mkdir(parents=True)
        (build / ".github" / "workflows" / "classroom.yml").write_text(workflow_text, encoding="utf-8")
    table = "\n".join(f"- kata {k.id} — {k.title} (level {k.level}, about {k.minutes} min): `katas/{k.id}/{k.file}`"
                      for k in katas)
    hint = "\nNotebooks, one a kata, are in `notebooks/`; their check cell runs the same public checks." if notebooks else ""
    ci = CI_NOTE.format(points=choice.describe(points_of)) if workflow_text is not None else ""
    text = STUDENT_README.format(covers=covers, table=table, notebooks=hint, first=katas[0].id,
                                 shares="\n".join(_share_line(k, shares[k.id]) for k in katas), paged=paged_note(katas),
                                 ci=ci)
    (build / "README.md").write_text(text, encoding="utf-8")
    return notebooks
