"""Every path as its user meets it, each in a new virtual environment where this repository's
``grader`` is not importable: the quick start in a fresh copy of the repository, a level-1, a level-2,
a level-5 and a level-6 handout installed as their README says, and the Gradescope zip's ``setup.sh`` and
``run_autograder`` in a clean root.

What is shared, to keep the tier within minutes: one venv per kind, made once a session. PyTorch is
the one package not installed from an index in them: a venv gets the torch this test process runs
(the build pip gave it, whatever it is) through a stand-in wheel named ``torch`` whose ``.pth``
file puts a folder of links to torch and its own requirements on the path. That stands for the
user's first step on a CPU machine (``pip install torch --index-url …/whl/cpu``), costs seconds
instead of a 1–5 GB install per venv, and brings nothing of this repository. Every other package
comes from wherever pip resolves packages here; the Gradescope setup runs offline, from a wheel
folder that pip fills first (``pip download``).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from grader import manifest, mistakes
from grader.public_record import tape_keys
from grader.classroom import autograder, handouts
from conftest import copy_repo
from test_public import leaked

pytestmark = pytest.mark.slow
BIN = "Scripts" if os.name == "nt" else "bin"
TIMINGS: dict[str, float] = {}  # what each path cost, printed at the end of the session


# -- torch, as the user's own first install ------------------------------------------------------
def _requirements(name: str) -> dict[str, metadata.Distribution]:
    """``name``'s distribution and those it requires (on this platform, no extras), installed here."""
    found, todo = {}, [name]
    while todo:
        wanted = canonicalize_name(todo.pop())
        if wanted in found:
            continue
        try:
            dist = metadata.distribution(wanted)
        except metadata.PackageNotFoundError:
            continue
        found[wanted] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def _link_farm(folder: Path) -> Path:
    """A folder of links to torch's files and its requirements' (their top-level names only)."""
    folder.mkdir(parents=True)
    for dist in _requirements("torch").values():
        for top in sorted({Path(f).parts[0] for f in dist.files or []}):
            if top in ("..", "__pycache__") or top.endswith((".dist-info", ".pth")) or (folder / top).exists():
                continue
            source = Path(dist.locate_file(top))
            if source.exists():
                (folder / top).symlink_to(source, target_is_directory=source.is_dir())
    if not (folder / "torch").exists():
        raise RuntimeError("torch's files could not be found from its metadata")
    return folder


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _torch_wheel(wheelhouse: Path, farm: Path) -> Path:
    """A wheel named torch, at this process' torch version, whose only file puts ``farm`` on the path. It
    carries torch's entry points: newer torch registers its process-group backends (gloo) through them."""
    version = metadata.version("torch")
    info = f"torch-{version}.dist-info"
    files = {"torch_from_this_machine.pth": f"{farm}\n".encode(),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    entry_points = metadata.distribution("torch").read_text("entry_points.txt")
    if entry_points:
        files[f"{info}/entry_points.txt"] = entry_points.encode()
    record = "\n".join([_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]) + "\n"
    path = wheelhouse / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in {**files, f"{info}/RECORD": record.encode()}.items():
            wheel.writestr(name, data)
    return path


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> Path:
    """The stand-in torch wheel; the Gradescope test adds the project's other requirements."""
    tmp = tmp_path_factory.mktemp("torch")
    house = tmp / "wheels"
    house.mkdir()
    _torch_wheel(house, _link_farm(tmp / "torch-files"))
    return house


def clean_env(venv: Path | None = None, **extra: str) -> dict[str, str]:
    """The environment a user's shell has: no PYTHONPATH, no setting of ours (a state folder, …), no pip
    setting of this shell's (a folder of wheels in PIP_FIND_LINKS would offer pip another torch), no active venv.
    pip's configuration files are the machine's, as a user's are."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("PYTEST_", "PIP_", "KVKATA_"))}
    path = [str(Path(sys.executable).parent), env.get("PATH", "")]
    if venv is not None:
        path.insert(0, str(venv / BIN))
        env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = os.pathsep.join(path)
    env.update(extra)
    return env


def sh(script: str, cwd: Path, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def ok(ran: subprocess.CompletedProcess, code: int = 0) -> str:
    out = ran.stdout + ran.stderr
    assert ran.returncode == code, f"exit {ran.returncode}, expected {code}:\n{out[-4000:]}"
    return out


def readme_block(readme: str, heading: str) -> list[str]:
    """The commands of the first ``bash`` block under ``heading``, comments dropped."""
    section = readme.split(heading, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def torch_line(wheelhouse: Path) -> str:
    """The user's own torch install (here: this machine's torch, from the stand-in wheel and nowhere else:
    ``--isolated`` leaves out pip's configuration files and variables, which may name other wheels of torch)."""
    return f"python -m pip install --quiet --isolated --no-index --find-links {wheelhouse} torch"


def grader_file(venv: Path, cwd: Path) -> str:
    ran = subprocess.run([str(venv / BIN / "python"), "-c", "import grader; print(grader.__file__)"],
                         cwd=cwd, env=clean_env(venv), capture_output=True, text=True, timeout=120)
    return ok(ran).strip().splitlines()[-1]


def test_a_users_venv_takes_no_setting_from_the_shell_running_the_tests(tmp_path, wheelhouse, monkeypatch):
    """A shell whose PIP_FIND_LINKS offers another torch of the same version, built for this platform (so pip
    would prefer it) and unable to install, and whose KVKATA_STATE names a folder: the venvs of these tests get the
    stand-in torch, and see neither setting."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    version, tag = metadata.version("torch"), f"cp{sys.version_info[0]}{sys.version_info[1]}"
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(decoy / f"torch-{version}-{tag}-{tag}-manylinux_2_17_x86_64.whl", "w") as wheel:
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n"
                                           "Requires-Dist: kvkata-no-such-package\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
                                        f"Tag: {tag}-{tag}-manylinux_2_17_x86_64\n")
        wheel.writestr(f"{info}/RECORD", "")
    monkeypatch.setenv("PIP_FIND_LINKS", str(decoy))
    monkeypatch.setenv("KVKATA_STATE", str(tmp_path / "state"))
    venv = tmp_path / "venv"
    ok(subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300))
    env = clean_env(venv)
    assert not [k for k in env if k.startswith(("PIP_", "KVKATA_"))]
    shell = {**env, "PIP_FIND_LINKS": str(decoy)}  # even where the variable reaches pip, the torch step ignores it
    ok(sh(torch_line(wheelhouse), tmp_path, shell))
    shown = ok(sh("python -m pip show torch", tmp_path, env))
    assert f"Version: {metadata.version('torch')}" in shown, shown


# -- the quick start ----------------------------------------------------------------------------
def test_the_quick_start_in_a_fresh_copy_shows_the_board(tmp_path, wheelhouse):
    started = time.monotonic()
    clone = copy_repo(tmp_path / "clone")
    first = readme_block((clone / "README.md").read_text(encoding="utf-8"), "## Quick start")[0]
    assert first.startswith("pip install -e .") and first.endswith("kvkata"), first
    venv = tmp_path / "venv"
    ok(subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300))
    out = ok(sh(f"{torch_line(wheelhouse)} && {first}", clone, clean_env(venv)))
    assert grader_file(venv, tmp_path) == str(clone / "grader" / "__init__.py")
    assert all(f"  {k.id}  {k.title}" in out for k in manifest.load().values()), out[-3000:]
    assert "next: kata 01" in out and "Traceback" not in out and "Failed to initialize NumPy" not in out
    TIMINGS["quick start"] = time.monotonic() - started


# -- a handout in its own venv -------------------------------------------------------------------------
@pytest.fixture(scope="session")
def installed(tmp_path_factory, wheelhouse):
    """A handout per level, made by ``kvkata assign`` and set up as its README says, made once."""
    made = {}

    def make(level: int) -> Path:
        if level not in made:
            started = time.monotonic()
            folder = tmp_path_factory.mktemp(f"level{level}") / "handout"
            handouts.assign(level, str(folder))
            lines = readme_block((folder / "README.md").read_text(encoding="utf-8"), "## Set up")
            assert lines[0] == "python -m venv .venv && . .venv/bin/activate", lines
            assert "pip install -e ." in lines and "kvkata" in lines, lines
            script = " && ".join(["set -e", lines[0], torch_line(wheelhouse), *lines[1:]])
            ran = sh(script, folder, clean_env())
            made[level] = (folder, ok(ran))
            TIMINGS[f"level-{level} handout set up"] = time.monotonic() - started
        return made[level]

    return make


def caught_mistake(folder: Path, kata_id: str) -> tuple[str, int]:
    """A known mistake the handout's public record says its public checks catch, and how many are public."""
    record = tape_keys.decode((folder / "grader" / "public" / f"{kata_id}{tape_keys.SUFFIX}").read_bytes())
    caught = [name for name, outcomes in record["outcomes"].items()
              if any(found is not None and found[0] != "pass" for found in outcomes.values())]
    assert caught, f"kata {kata_id}: the public checks catch no known mistake"
    return caught[0], len(record["public"])


def venv_run(folder: Path, command: str, **env: str) -> subprocess.CompletedProcess:
    return sh(command, folder, clean_env(folder / ".venv", **env))


@pytest.mark.parametrize("level,kata_id", [(1, "03"), (2, "06"), (5, "16"), (6, "21")])
def test_a_handout_in_its_own_venv_names_a_mistake_and_passes_the_reference(installed, level, kata_id):
    folder, setup = installed(level)
    started = time.monotonic()
    assert grader_file(folder / ".venv", folder.parent) == str(folder / "grader" / "__init__.py")
    for k in handouts.katas_for(level):
        assert f"  {k.id}  {k.title}" in setup, setup[-3000:]  # the README's `kvkata`: the board
    assert "Traceback" not in setup and "Failed to initialize NumPy" not in setup, setup[-3000:]
    assert not (folder / "solutions").exists() and not (folder / "grader" / "mistakes").exists()
    assert not leaked(folder, list(manifest.load().values()))  # no body of any kata's reference or mistake

    kata = manifest.get(kata_id)
    name, public = caught_mistake(folder, kata_id)
    reference = (manifest.REPO_ROOT / kata.solution).read_text(encoding="utf-8")
    mistake = next(m for m in mistakes.catalogue(kata_id) if m.name == name)
    (folder / kata.stub).write_text(mistake.apply(reference), encoding="utf-8")
    wrong = venv_run(folder, f"pytest katas/{kata_id} -p no:randomly")
    out = ok(wrong, 1)
    assert f"this looks like a known mistake: {name}" in out and "public checks:" in out, out[-3000:]
    assert "Traceback" not in out
    (folder / kata.stub).write_text(reference, encoding="utf-8")
    right = ok(venv_run(folder, f"pytest katas/{kata_id} -p no:randomly"))
    assert re.search(rf"\b{public} passed\b", right), right[-3000:]
    shutil.copyfile(manifest.REPO_ROOT / kata.stub, folder / kata.stub)
    TIMINGS[f"level-{level} handout: wrong and right file"] = time.monotonic() - started


@pytest.mark.parametrize("level", [1, 2])
def test_a_handouts_classroom_workflow_runs_its_own_commands(installed, level, tmp_path):
    """Each kata's command-grader test runs its command in the handout's venv, as Classroom's command
    grader runs it (PATH and HOME only): every one fails on the stubs."""
    folder, _ = installed(level)
    flow = yaml.safe_load((folder / ".github" / "workflows" / "classroom.yml").read_text(encoding="utf-8"))
    steps = flow["jobs"]["run-autograding-tests"]["steps"]
    install = next(s["run"] for s in steps if "pip install -e ." in s.get("run", ""))
    assert "download.pytorch.org/whl/cpu" in install  # the CPU build, as the README's line
    tests = [s for s in steps if s.get("uses", "").startswith("classroom-resources/autograding-command-grader@")]
    assert len(tests) == len(handouts.katas_for(level))
    venv = clean_env(folder / ".venv")
    env = {"PATH": venv["PATH"], "HOME": venv.get("HOME", str(tmp_path)), "KVKATA_STATE": str(tmp_path / "state")}
    for test in tests:
        ran = subprocess.run(test["with"]["command"], shell=True, cwd=folder, env=env, capture_output=True, text=True,
                             timeout=600)
        assert ran.returncode == 1 and "Traceback" not in ran.stdout + ran.stderr, (test["id"], ran.stderr[-2000:])


NOTEBOOK_RUN = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": sys.argv[2]}}).execute()
check = [c for c in nb.cells if "check" in c.get("metadata", {}).get("tags", [])]
print("".join(o.get("text", "") for c in check for o in c.get("outputs", [])))
"""


def test_a_notebook_check_cell_runs_in_the_handouts_venv(installed, tmp_path):
    """Notebook 01 with the reference in place of its stub cells, executed in the level-1 venv by a
    Jupyter kernel (nbclient and ipykernel only: the whole notebooks extra adds JupyterLab)."""
    folder, _ = installed(1)
    started = time.monotonic()
    ok(venv_run(folder, "python -m pip install --quiet nbclient ipykernel"))
    k01 = manifest.get("01")
    nb = nbformat.read(folder / k01.notebook, as_version=4)
    tagged = [i for i, c in enumerate(nb.cells) if "stub" in c.get("metadata", {}).get("tags", [])]
    assert tagged and any("check" in c.get("metadata", {}).get("tags", []) for c in nb.cells)
    reference = nbformat.v4.new_code_cell((manifest.REPO_ROOT / k01.solution).read_text(encoding="utf-8"))
    nb.cells = nb.cells[:tagged[0]] + [reference] + [c for i, c in enumerate(nb.cells) if i > tagged[0] and i not in tagged]
    filled = tmp_path / "01.ipynb"
    nbformat.write(nb, filled)
    (tmp_path / "run.py").write_text(NOTEBOOK_RUN, encoding="utf-8")
    out = ok(venv_run(folder, f"python {tmp_path / 'run.py'} {filled} {folder}", KVKATA_STATE=str(tmp_path / "state")))
    _, public = caught_mistake(folder, "01")
    assert f"{public}/{public} checks pass" in out and "public checks:" in out, out[-3000:]
    TIMINGS["notebook check cell"] = time.monotonic() - started


# -- the Gradescope zip ----------------------------------------------------------------------------------
GRADESCOPE_TOP = {"score", "execution_time", "output", "output_format", "test_output_format", "test_name_format",
                  "visibility", "stdout_visibility", "extra_data", "tests", "leaderboard"}
GRADESCOPE_TEST = {"score", "max_score", "status", "name", "name_format", "number", "output", "output_format",
                   "tags", "visibility", "extra_data"}
GRADESCOPE_VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}


def check_gradescope_fields(results: dict) -> None:
    """results.json as Gradescope's autograder specification describes it."""
    assert set(results) <= GRADESCOPE_TOP, set(results) - GRADESCOPE_TOP
    assert isinstance(results["tests"], list) and results["tests"]
    for key in ("visibility", "stdout_visibility"):
        assert results.get(key, "visible") in GRADESCOPE_VISIBILITY
    assert isinstance(results.get("output", ""), str) and isinstance(results.get("execution_time", 0), (int, float))
    for test in results["tests"]:
        assert set(test) <= GRADESCOPE_TEST, set(test) - GRADESCOPE_TEST
        assert isinstance(test["score"], (int, float)) and isinstance(test["max_score"], (int, float))
        assert test.get("status", "passed") in ("passed", "failed") and isinstance(test["name"], str)
        assert test.get("visibility", "visible") in GRADESCOPE_VISIBILITY
    assert results["score"] == pytest.approx(sum(t["score"] for t in results["tests"]))


def fill_wheelhouse(house: Path, source: Path) -> None:
    """The project's requirements and build backend (torch aside), downloaded as pip resolves them."""
    project = tomllib.loads((source / "pyproject.toml").read_text(encoding="utf-8"))
    wanted = [r for r in project["project"]["dependencies"] if canonicalize_name(Requirement(r).name) != "torch"]
    wanted += project["build-system"]["requires"]
    ran = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(house), *wanted],
                         env=clean_env(), capture_output=True, text=True, timeout=900)
    ok(ran)


def test_the_gradescope_zip_sets_up_offline_and_grades_a_submission(tmp_path, wheelhouse):
    started = time.monotonic()
    zip_path = tmp_path / "autograder.zip"
    autograder.build(1, str(zip_path), only=True, timeout=30)
    root = tmp_path / "autograder"
    with zipfile.ZipFile(zip_path) as archive:
        archive.extractall(root / "source")
    for script in ("setup.sh", "run_autograder"):
        os.chmod(root / "source" / script, 0o755)
    house = tmp_path / "wheels"
    shutil.copytree(wheelhouse, house)
    fill_wheelhouse(house, root / "source")
    offline = clean_env(KVKATA_AUTOGRADER_ROOT=str(root), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(house))
    ok(sh("bash ./setup.sh", root / "source", offline))
    assert grader_file(root / "venv", root) != str(root / "source" / "grader" / "__init__.py")  # installed
    assert not grader_file(root / "venv", root).startswith(str(manifest.REPO_ROOT))
    TIMINGS["gradescope setup.sh"] = time.monotonic() - started

    shutil.copyfile(root / "source" / "run_autograder", root / "run_autograder")  # as Gradescope copies it
    os.chmod(root / "run_autograder", 0o755)
    k01, k03 = manifest.get("01"), manifest.get("03")
    tiled = next(m for m in mistakes.catalogue("03") if m.name == "tiled repeat instead of interleave")
    (root / "submission" / "katas" / "01").mkdir(parents=True)
    (root / "submission" / "katas" / "03").mkdir(parents=True)
    shutil.copyfile(manifest.REPO_ROOT / k01.solution, root / "submission" / k01.stub)
    (root / "submission" / k03.stub).write_text(tiled.apply((manifest.REPO_ROOT / k03.solution).read_text()))
    ok(sh("./run_autograder", root, clean_env(KVKATA_AUTOGRADER_ROOT=str(root)), timeout=900))
    results = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    check_gradescope_fields(results)
    by_kata = {k: [t for t in results["tests"] if t["number"].startswith(f"{k}.")] for k in ("01", "02", "03", "04")}
    assert by_kata["01"] and all(t["status"] == "passed" for t in by_kata["01"]), by_kata["01"]
    failed = [t for t in by_kata["03"] if t["status"] == "failed"]
    assert failed and any(tiled.name in t["output"] for t in failed), [t["output"] for t in failed]
    assert by_kata["02"] and all(t["status"] == "failed" for t in by_kata["02"] + by_kata["04"])
    TIMINGS["gradescope zip in all"] = time.monotonic() - started


def teardown_module(module) -> None:
    for what, seconds in TIMINGS.items():
        print(f"user paths · {what}: {seconds:.0f} s", file=sys.stderr)
