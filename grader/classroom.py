"""The instructor's commands: ``kvkata assign`` makes a handout of a level's katas, ``kvkata grade``
grades a cohort's submissions (each isolated, see grader.cohort) and writes the reports."""
from __future__ import annotations

import csv
import io
import json
import re
import shutil
import tempfile
from pathlib import Path
from xml.etree import ElementTree as ET

from grader import checks, cohort, learner, manifest, state
from grader.errors import UsageError

CSV_COLUMNS = ["submission", "kata", "passed", "total", "status", "diagnosis", "note", "seconds"]
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
    return text.replace("-p grader.plugin", "-p grader.handout")


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


# -- grade ----------------------------------------------------------------------------------
def _names(roots: list[Path]) -> list[str]:
    names = [r.name or str(r) for r in roots]
    return [str(r) if names.count(n) > 1 else n for r, n in zip(roots, names)]


def jobs_for(paths: list[str], level: int | None, only: bool) -> list[cohort.Job]:
    """Every submission × kata to grade; a clear error for a path that is no folder or a kata
    that cannot be graded here."""
    roots = list(dict.fromkeys(Path(p) for p in paths))
    for r in roots:
        if not r.is_dir():
            raise UsageError(f"{r}: not a folder; a submission is a folder holding katas/NN/<file>")
    if level is not None:
        katas = katas_for(level, only)
    else:
        katas = [k for k in manifest.load().values() if any(cohort.find_file(r, k) for r in roots)]
        if not katas:
            raise UsageError("no kata file in any submission (expected katas/NN/<file>, e.g. katas/01/append.py)")
    for k in katas:
        try:
            checks.for_kata(k.id)
        except ModuleNotFoundError:
            raise UsageError(f"kata {k.id} has no checks yet, so it cannot be graded") from None
    missing = [k.id for k in katas if not (manifest.REPO_ROOT / k.solution).is_file()]
    if missing:
        raise UsageError(f"kata(s) {', '.join(missing)}: no reference solution in {manifest.REPO_ROOT / 'solutions'}, "
                         "so they cannot be graded here")
    return [cohort.Job(name, root, k, cohort.find_file(root, k)) for root, name in zip(roots, _names(roots)) for k in katas]


def write_csv(rows: list[dict], path: Path) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    state.write_atomic(path, buffer.getvalue().encode("utf-8"))


def write_json(rows: list[dict], path: Path, settings: cohort.Settings) -> None:
    data = {"settings": vars(settings), "rows": rows}
    state.write_atomic(path, json.dumps(data, indent=2).encode("utf-8"))


def write_junit(rows: list[dict], path: Path) -> None:
    """JUnit XML: a test suite per submission, a test case per kata × check."""
    suites = ET.Element("testsuites", name="kvkata")
    for submission in dict.fromkeys(r["submission"] for r in rows):
        mine = [r for r in rows if r["submission"] == submission]
        cases = [(r, c) for r in mine for c in r["checks"]]
        failures = sum(c["status"] != "pass" for _, c in cases)
        suite = ET.SubElement(suites, "testsuite", name=submission, tests=str(len(cases)), failures=str(failures),
                              time=f"{sum(r['seconds'] for r in mine):.2f}")
        for r, c in cases:
            case = ET.SubElement(suite, "testcase", classname=f"{submission}.kata{r['kata']}", name=c["title"])
            if c["status"] != "pass":
                kind = "skipped" if c["status"] == "not-implemented" else "failure"
                node = ET.SubElement(case, kind, message=f"{c['status']}: {c['message'].splitlines()[0] if c['message'] else ''}")
                node.text = c["message"]
    state.write_atomic(path, ET.tostring(suites, encoding="utf-8", xml_declaration=True))


def grade(paths: list[str], settings: cohort.Settings, level: int | None = None, only: bool = False,
          csv_path: str | None = None, json_path: str | None = None, junit_path: str | None = None,
          progress=None) -> str:
    """Grade every submission × kata and write the reports; the cohort summary, to print."""
    jobs = jobs_for(paths, level, only)
    if progress:
        progress(f"grading {len(jobs)} submission × kata pair(s), {settings.jobs} at a time, "
                 f"{settings.timeout:g} s each at most")
    rows = cohort.grade_all(jobs, settings, progress)
    for path, write in ((csv_path, write_csv), (junit_path, write_junit)):
        if path:
            write(rows, Path(path))
    if json_path:
        write_json(rows, Path(json_path), settings)
    return cohort.summary(rows)
