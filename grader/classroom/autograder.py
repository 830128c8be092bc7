"""``kvkata autograder``: a Gradescope autograder for a level's katas, and the grading it runs there.

    kvkata autograder --level 2 [--only] --out autograder.zip [--visibility after_published] ...
    kvkata autograder --kata 03 --points 03=10 --seed 4242 --out kata03.zip

The zip holds, at its root, what Gradescope asks for (see Gradescope's autograder specification):
``setup.sh`` (run once when the image is built: a virtual environment with a CPU build of torch
and this project), ``run_autograder`` (run for every submission), and the project itself with
the level's hidden checks, references and known mistakes. Students never see the zip.

For each submission, ``run_autograder`` finds the kata files wherever they are in
``/autograder/submission`` (the files alone, a ``katas/`` tree, or a zip of either), grades them
exactly as ``kvkata grade`` does (a sandboxed worker per kata, time and memory limits, replayed
against the reference), and writes ``/autograder/results/results.json``: one test per check with
its diagnosis and hint as output, worth its kata's points over the kata's checks (``--points``;
one point a check by default). The builder prints the total, which is the assignment's points
to enter in Gradescope. The settings file (``kvkata-autograder.json``) keeps the katas, points and
seed chosen when it was built. Whatever happens, the file is written. The environment
variable ``KVKATA_AUTOGRADER_ROOT`` (default ``/autograder``) moves the whole tree, which is how
the project's tests run the real script.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

from grader import manifest, state
from grader.classroom import choice, handouts
from grader.classroom.cohort import sandbox as cohort
from grader.errors import UsageError

VISIBILITY = ("visible", "hidden", "after_due_date", "after_published")  # Gradescope's settings
SETTINGS_FILE = "kvkata-autograder.json"
UNZIP_LIMIT = 64 * 2**20  # bytes a submission's zips may unpack to

PICK_PYTHON = """\
# A Python 3.10 or newer that can make a venv: the image's, else one from apt (its python3, else a
# versioned package), else a clear error. Sets $python.
usable() {
  command -v "$1" >/dev/null 2>&1 &&
    "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1
}
find_python() {
  for candidate in python3 python3.13 python3.12 python3.11 python3.10; do
    if usable "$candidate"; then echo "$candidate"; return 0; fi
  done
  return 1
}
if ! python=$(find_python); then
  apt-get update || true
  apt-get install -y python3 python3-venv python3-pip || true
  for version in 3.12 3.11 3.10; do
    python=$(find_python) && break
    apt-get install -y "python$version" "python$version-venv" || true
  done
  python=$(find_python) || {
    echo "setup.sh: found no Python 3.10 or newer with venv, even after apt-get; choose a newer base image" \\
      "(Ubuntu 22.04 or later) in the autograder settings" >&2
    exit 1
  }
fi
"""

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, when it builds the autograder's image.
set -euo pipefail
root="${KVKATA_AUTOGRADER_ROOT:-/autograder}"
""" + PICK_PYTHON + """\
"$python" -m venv "$root/venv"
"$root/venv/bin/python" -m pip install --upgrade pip
"$root/venv/bin/python" -m pip install --index-url https://download.pytorch.org/whl/cpu "torch>=2.3"
"$root/venv/bin/python" -m pip install "$root/source"
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission. It always leaves results/results.json behind.
# One block, read whole before it runs: bash reads a script as it goes, and a changed file changes nothing.
{
root="${KVKATA_AUTOGRADER_ROOT:-/autograder}"
python="$root/venv/bin/python"
[ -x "$python" ] || python=python3
cd "$root/source" && PYTHONPATH="$root/source${PYTHONPATH:+:$PYTHONPATH}" "$python" -m grader.classroom.autograder run
if [ ! -s "$root/results/results.json" ]; then
  mkdir -p "$root/results"
  printf '%s\\n' '{"score": 0, "output": "The autograder itself could not run, so nothing was graded (not your fault): please tell your instructor.", "tests": []}' > "$root/results/results.json"
fi
exit 0
}
"""


# -- building the zip -------------------------------------------------------------------------
def build(level: int | None, out: str, only: bool = False, visibility: str = "visible",
          stdout_visibility: str = "hidden", timeout: float = 60.0, memory_mb: int = 4096,
          kata_ids: list[str] | None = None, points: str | None = None, seed: int = 0) -> str:
    """Write the autograder zip; what was written, to print (with the total points for Gradescope)."""
    for name, value in (("--visibility", visibility), ("--stdout-visibility", stdout_visibility)):
        if value not in VISIBILITY:
            raise UsageError(f"{name} {value}: expected one of {', '.join(VISIBILITY)}")
    katas = handouts.katas_for(level, only, kata_ids)
    handouts.require_solutions(katas, "an autograder")
    points_of = choice.points(points, katas)
    dest = Path(out).resolve()
    settings = {"level": level, "only": only, "katas": [k.id for k in katas], "visibility": visibility,
                "stdout_visibility": stdout_visibility, "timeout": timeout, "memory_mb": memory_mb,
                "points": points_of, "seed": seed}
    with tempfile.TemporaryDirectory(prefix="kvkata-autograder-") as tmp:
        source = Path(tmp) / "source"
        _copy_project(source, katas)
        (source / SETTINGS_FILE).write_text(json.dumps(settings, indent=2), encoding="utf-8")
        (source / "setup.sh").write_text(SETUP_SH, encoding="utf-8")
        (source / "run_autograder").write_text(RUN_AUTOGRADER, encoding="utf-8")
        dest.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(source.rglob("*")):
                if path.is_file():
                    info = zipfile.ZipInfo(str(path.relative_to(source)), date_time=(2020, 1, 1, 0, 0, 0))
                    info.external_attr = (0o755 if path.name in ("setup.sh", "run_autograder") else 0o644) << 16
                    archive.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)
    total = choice.number(sum(points_of.values()))
    return (f"wrote {dest}: a Gradescope autograder for {len(katas)} kata(s) "
            f"({', '.join(k.id for k in katas)}), one test per check, visibility {visibility}, seed {seed}\n"
            f"points per kata: {choice.describe(points_of)}\n"
            f"enter {total} as the assignment's total points in Gradescope; upload the zip as its autograder "
            "(Configure Autograder → Zip file upload)")


def _copy_project(dest: Path, katas: list[manifest.Kata]) -> None:
    """The package with only these katas' checks, references and mistakes, and what installs it."""
    ids = {k.id for k in katas}
    kept = {p.name for p in handouts.check_modules(ids)} | set(handouts.SHARED_CHECKS)

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in ("__pycache__", "pristine") or n.endswith(".pyc")}
        if Path(folder).name == "checks":
            skip |= {n for n in names if n.endswith(".py") and n not in kept}
        if Path(folder).name == "mistakes":
            skip |= {n for n in names if n.startswith("k") and n.endswith(".py") and n[1:-3] not in ids}
        return skip

    shutil.copytree(manifest.PACKAGE_DIR, dest / "grader", ignore=ignore)
    (dest / "grader" / "manifest.toml").write_text(handouts.manifest_text(ids), encoding="utf-8")
    shared = [manifest.get("06").solution] if handouts.paged_copy_needed(katas) else []  # grader/paged.py loads it
    for relative in shared + [p for k in katas for p in (k.solution, k.stub, k.readme)]:
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(manifest.REPO_ROOT / relative, dest / relative)
    shutil.copyfile(manifest.REPO_ROOT / "pyproject.toml", dest / "pyproject.toml")
    shutil.copyfile(manifest.REPO_ROOT / "README.md", dest / "README.md")


# -- finding the kata files in a submission -----------------------------------------------------
def unpack(folder: Path, into: Path) -> list[str]:
    """Copy the submission to ``into``, unpacking zips (safely: no path outside, bounded size);
    notes on what could not be read."""
    notes, budget = [], UNZIP_LIMIT
    shutil.copytree(folder, into, symlinks=False, ignore_dangling_symlinks=True, dirs_exist_ok=True)
    for archive in sorted(into.rglob("*.zip")):
        target = archive.with_suffix("")
        try:
            with zipfile.ZipFile(archive) as opened:
                for info in opened.infolist():
                    path = (target / info.filename).resolve()
                    if info.is_dir() or not path.is_relative_to(target.resolve()):
                        continue
                    budget -= info.file_size
                    if budget < 0:
                        raise ValueError(f"unpacks to more than {UNZIP_LIMIT // 2**20} MB")
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(opened.read(info))
        except (zipfile.BadZipFile, ValueError, OSError) as exc:
            notes.append(f"could not unpack {archive.name}: {exc}")
    return notes


def find_kata_files(tree: Path, katas: list[manifest.Kata]) -> dict[str, Path]:
    """The best file for each kata: ``katas/NN/<file>``, then ``NN/<file>``, then any ``<file>``
    (the shortest path, should there be several)."""
    found = {}
    files = sorted((p for p in tree.rglob("*.py") if p.is_file() and "__MACOSX" not in p.parts),
                   key=lambda p: (len(p.parts), str(p)))
    for k in katas:
        named = [p for p in files if p.name == k.file]
        ranked = ([p for p in named if p.parent.name == k.id and p.parent.parent.name == "katas"]
                  + [p for p in named if p.parent.name == k.id] + named)
        if ranked:
            found[k.id] = ranked[0]
    return found


# -- grading one submission -------------------------------------------------------------------------
def results_json(rows: list[dict], settings: dict, seconds: float, notes: list[str]) -> dict:
    """Gradescope's results: a test per check, worth its kata's points (settings' ``points``; one a
    check in a zip built without them) over the kata's checks."""
    tests, lines = [], []
    for row in rows:
        worth = choice.per_check(settings.get("points", {}).get(row["kata"], row["total"]), row["total"])
        lines.append(f"kata {row['kata']}: {row['passed']}/{row['total']} checks pass ({row['status']})"
                     + (f" — {row['note']}" if row["note"] else ""))
        for number, check in enumerate(row["checks"], 1):
            passed = check["status"] == "pass"
            tests.append({"name": f"kata {row['kata']} · {check['title']}", "number": f"{row['kata']}.{number}",
                          "score": worth if passed else 0.0, "max_score": worth,
                          "status": "passed" if passed else "failed", "output": check["message"],
                          "visibility": settings["visibility"]})
    return {"score": round(float(sum(t["score"] for t in tests)), 6), "execution_time": round(seconds),
            "output": "\n".join(notes + lines), "visibility": settings["visibility"],
            "stdout_visibility": settings["stdout_visibility"], "tests": tests}


def grade_submission(root: Path) -> dict:

    started = time.monotonic()
    settings = json.loads((root / "source" / SETTINGS_FILE).read_text(encoding="utf-8"))
    katas = [manifest.get(i) for i in settings["katas"]]
    with tempfile.TemporaryDirectory(prefix="kvkata-submission-") as tmp:
        notes = unpack(root / "submission", Path(tmp) / "unpacked") if (root / "submission").is_dir() else \
            ["the submission folder is missing"]
        files = find_kata_files(Path(tmp) / "unpacked", katas) if (Path(tmp) / "unpacked").is_dir() else {}
        jobs = [cohort.Job("submission", Path(tmp) / "unpacked", k, files.get(k.id)) for k in katas]
        if not files:
            notes.append("no kata file was found in the submission: upload "
                         + ", ".join(f"katas/{k.id}/{k.file}" for k in katas))
        rows = cohort.grade_all(jobs, cohort.Settings(timeout=settings["timeout"], memory_mb=settings["memory_mb"],
                                                      jobs=min(2, os.cpu_count() or 1),
                                                      seed=settings.get("seed", 0)))
    walls = cohort.walls()
    notes.append(f"isolation: {walls['isolation']}" + (f" (without {walls['missing']})" if walls["missing"] else ""))
    return results_json(rows, settings, time.monotonic() - started, notes)


def close_to_workers(root: Path) -> None:
    """Run as root (as on Gradescope), workers become users who own nothing (grader.classroom.cohort.confine):
    the results, the references, the mistakes and the hidden checks are root's alone, and so is this script."""
    if os.geteuid() != 0:
        return
    (root / "results").mkdir(parents=True, exist_ok=True)
    for folder in (root / "results", root / "source" / "solutions", root / "source" / "grader" / "mistakes",
                   root / "source" / "grader" / "checks"):
        if folder.is_dir():
            os.chown(folder, 0, 0)
            os.chmod(folder, 0o700)
    script = root / "source" / "run_autograder"
    if script.is_file():
        os.chown(script, 0, 0)
        os.chmod(script, 0o755)


def run(root: Path) -> int:
    """Grade ``root/submission`` into ``root/results/results.json``, which is written whatever happens."""
    out = root / "results" / "results.json"
    try:
        close_to_workers(root)
        data = grade_submission(root)
    except BaseException as exc:  # never leave Gradescope without a results file
        traceback.print_exc()
        data = {"score": 0.0, "output": "The autograder failed while grading, so nothing was graded (not your "
                f"fault): please tell your instructor. ({type(exc).__name__}: {exc})", "tests": []}
    state.write_atomic(out, json.dumps(data, indent=2).encode("utf-8"))
    print(data["output"])
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["run"]:
        print("usage: python -m grader.classroom.autograder run   (inside a Gradescope autograder; "
              "build one with `kvkata autograder`)", file=sys.stderr)
        return 2
    return run(Path(os.environ.get("KVKATA_AUTOGRADER_ROOT", "/autograder")))


if __name__ == "__main__":
    sys.exit(main())
