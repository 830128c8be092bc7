"""``kvkata prairielearn``: a PrairieLearn question graded by an external grader, and its grading.

    kvkata prairielearn --kata 01 --out questions/kvkata-01 [--points 01=10] [--seed 4242]

The folder is a PrairieLearn question (see PrairieLearn's "External Grading" documentation):

    info.json       the question, with ``externalGradingOptions``: the grader's Docker image, the
                    entry point ``/grade/tests/run.sh`` and a timeout (at most 600 s)
    question.html   a file upload for each kata's file, and the grader's results
    tests/          copied to ``/grade/tests`` when a submission is graded, never shown to students:
                    ``run.sh`` (the entry point), ``Dockerfile`` (the image: Python, a CPU build of
                    torch and this project's dependencies) and ``source/``, the project with these
                    katas' checks, references and known mistakes, as in the Gradescope zip

For each submission, PrairieLearn puts the student's files in ``/grade/student``; ``run.sh`` grades
them exactly as the Gradescope autograder does (grader.classroom.autograder: a sandboxed worker per
kata, replayed against the reference) and writes ``/grade/results/results.json``: ``score`` (the
fraction of the points scored), ``message``, ``output`` and one test per check with ``points``,
``max_points`` and the check's message as ``output``. A grader that fails writes ``gradable: false``
(the student loses no attempt). ``KVKATA_PRAIRIELEARN_ROOT`` (default ``/grade``) moves the tree,
which is how the project's tests run the real entry point.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import tomllib
import traceback
import uuid
from pathlib import Path

from grader import manifest, state
from grader.classroom import autograder, choice, handouts
from grader.errors import UsageError

TIMEOUT_LIMIT = 600  # seconds: PrairieLearn's most for a grading job
ENTRYPOINT = "/grade/tests/run.sh"

RUN_SH = """\
#!/usr/bin/env bash
# PrairieLearn runs this for every submission; it always leaves results/results.json behind.
root="${KVKATA_PRAIRIELEARN_ROOT:-/grade}"
mkdir -p "$root/results"
python="${KVKATA_PYTHON:-python3}"
cd "$root/tests/source" && PYTHONPATH="$root/tests/source${PYTHONPATH:+:$PYTHONPATH}" \\
  "$python" -m grader.classroom.prairielearn run
if [ ! -s "$root/results/results.json" ]; then
  printf '%s\\n' '{"gradable": false, "format_errors": ["The grader itself could not run, so nothing was graded (not your fault): please tell your instructor."]}' > "$root/results/results.json"
fi
"""

DOCKERFILE = """\
# The external grader's image: build it from this folder and push it where PrairieLearn pulls from
# (Docker Hub), under the name in ../info.json:  docker build -t {image} . && docker push {image}
FROM python:3.11-slim
RUN python -m pip install --no-cache-dir torch --index-url https://download.pytorch.org/whl/cpu \\
 && python -m pip install --no-cache-dir {dependencies}
"""

QUESTION_HTML = """\
<pl-question-panel>
  <p>{intro}</p>
  <p>Upload your file{plural}: {files}. Each check of a kata is worth the kata's points over its checks
  ({points}); the checks run on inputs you have not seen.</p>
  <pl-file-upload file-names="{names}"></pl-file-upload>
</pl-question-panel>

<pl-submission-panel>
  <pl-external-grader-results></pl-external-grader-results>
  <pl-file-preview></pl-file-preview>
</pl-submission-panel>
"""


def build(out: str, level: int | None, only: bool = False, kata_ids: list[str] | None = None,
          points: str | None = None, seed: int = 0, timeout: float = 60.0, memory_mb: int = 4096,
          image: str = "kvkata-grader", force: bool = False) -> str:
    """Write the question's folder; what was written, to print."""
    katas = handouts.katas_for(level, only, kata_ids)
    handouts.require_solutions(katas, "a PrairieLearn question")
    names = [k.file for k in katas]
    if len(set(names)) < len(names):
        raise UsageError(f"katas {', '.join(k.id for k in katas)} name the same file ({', '.join(names)}); "
                         "PrairieLearn uploads files by name: make one question per kata")
    points_of = choice.points(points, katas)
    dest = Path(out).resolve()
    if dest.exists() and not force:
        raise UsageError(f"--out {dest} exists already; choose another folder, or add --force to replace it")
    job = min(TIMEOUT_LIMIT, int(60 + timeout * len(katas)))
    settings = {"level": level, "only": only, "katas": [k.id for k in katas], "visibility": "visible",
                "stdout_visibility": "hidden", "timeout": timeout, "memory_mb": memory_mb, "points": points_of,
                "seed": seed}
    with tempfile.TemporaryDirectory(prefix="kvkata-prairielearn-", dir=dest.parent if dest.parent.is_dir() else None) as tmp:
        folder = Path(tmp) / "question"
        _write(folder, katas, settings, image, job)
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(folder), dest)
    return (f"wrote {dest}: a PrairieLearn question for {len(katas)} kata(s) ({', '.join(k.id for k in katas)}), "
            f"graded externally with seed {seed}, timeout {job} s\n"
            f"points per kata: {choice.describe(points_of)}; PrairieLearn records the fraction scored\n"
            f"build the grader's image: docker build -t {image} {dest / 'tests'} && docker push {image}; "
            "then put the folder in your course's questions/")


def _write(folder: Path, katas: list[manifest.Kata], settings: dict, image: str, job: int) -> None:
    source = folder / "tests" / "source"
    autograder._copy_project(source, katas)
    state.write_atomic(source / autograder.SETTINGS_FILE, json.dumps(settings, indent=2).encode("utf-8"))
    state.write_atomic(folder / "tests" / "run.sh", RUN_SH.encode("utf-8"))
    (folder / "tests" / "run.sh").chmod(0o777 & ~state.umask())
    dependencies = " ".join(f"'{d}'" for d in _dependencies() if not d.startswith("torch"))
    state.write_atomic(folder / "tests" / "Dockerfile",
                       DOCKERFILE.format(image=image, dependencies=dependencies).encode("utf-8"))
    title = f"KV-cache kata {katas[0].id}: {katas[0].title}" if len(katas) == 1 else \
        f"KV-cache katas {', '.join(k.id for k in katas)}"
    info = {"uuid": str(uuid.uuid4()), "title": title, "topic": "KV cache", "tags": ["kvkata"], "type": "v3",
            "singleVariant": True, "gradingMethod": "External",
            "externalGradingOptions": {"enabled": True, "image": image, "entrypoint": ENTRYPOINT, "timeout": job}}
    state.write_atomic(folder / "info.json", (json.dumps(info, indent=2) + "\n").encode("utf-8"))
    files = ", ".join(f"<code>{k.file}</code> (kata {k.id}, {k.title})" for k in katas)
    html = QUESTION_HTML.format(intro=f"Fill in the kata{'s' if len(katas) > 1 else ''} from the handout "
                                f"(<code>katas/NN/README.md</code>) and upload the file{'s' if len(katas) > 1 else ''} here.",
                                plural="s" if len(katas) > 1 else "", files=files,
                                points=choice.describe(settings["points"]), names=", ".join(k.file for k in katas))
    state.write_atomic(folder / "question.html", html.encode("utf-8"))


def _dependencies() -> list[str]:
    with open(manifest.REPO_ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["dependencies"]


# -- grading one submission, inside the grader's container -------------------------------------------
def results(gradescope: dict) -> dict:
    """PrairieLearn's results from the Gradescope results of the same grading: ``score`` in [0, 1]."""
    tests = [{"name": t["name"], "points": t["score"], "max_points": t["max_score"], "message": t["status"],
              "output": t["output"]} for t in gradescope["tests"]]
    most = sum(t["max_points"] for t in tests)
    scored = sum(t["points"] for t in tests)
    return {"gradable": True, "score": round(scored / most, 6) if most else 0.0,
            "message": f"{choice.number(round(scored, 2))} of {choice.number(round(most, 2))} points",
            "output": gradescope.get("output", ""), "tests": tests}


def run(root: Path) -> int:
    """Grade ``root/student`` into ``root/results/results.json``, which is written whatever happens."""
    out = root / "results" / "results.json"
    try:
        with tempfile.TemporaryDirectory(prefix="kvkata-pl-") as tmp:
            (Path(tmp) / "source").symlink_to(root / "tests" / "source")
            (Path(tmp) / "submission").symlink_to(root / "student")
            data = results(autograder.grade_submission(Path(tmp)))
    except BaseException as exc:  # never leave PrairieLearn without a results file
        traceback.print_exc()
        data = {"gradable": False, "format_errors": ["The grader failed while grading, so nothing was graded (not "
                f"your fault): please tell your instructor. ({type(exc).__name__}: {exc})"]}
    state.write_atomic(out, json.dumps(data, indent=2).encode("utf-8"))
    print(data.get("message") or data.get("format_errors"))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["run"]:
        print("usage: python -m grader.classroom.prairielearn run   (inside PrairieLearn's external grader; "
              "build a question with `kvkata prairielearn`)", file=sys.stderr)
        return 2
    return run(Path(os.environ.get("KVKATA_PRAIRIELEARN_ROOT", "/grade")))


if __name__ == "__main__":
    sys.exit(main())
