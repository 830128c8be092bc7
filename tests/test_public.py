"""Handouts check themselves: each kata's public record (grader.public_record.tape) lets its checks run
where there is no reference and no mistake catalogue (grader.public_record.public).

Held here: the public checks pass the reference and fail the untouched stub; they catch at least
90% of each kata's catalogue and name each caught mistake alone, as the full grader does; bugs
the catalogue does not know are caught and named as nothing; the public inputs are not the
grading inputs; a level-1 handout grades with pytest, ``kvkata check``, a notebook's check cell
and its GitHub Classroom workflow; and no function body of a solution or a known mistake is in a
handout.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from functools import lru_cache
from pathlib import Path

import pytest
import torch
import yaml

from conftest import UNKNOWN_CASES, slow, unknown_bug
from grader import checks, manifest, mistakes
from grader.engine import diagnosis, targets
from grader.classroom import handouts
from grader.public_record import public, tape, tape_keys
from grader.engine import Ctx, run_check

pytestmark = slow  # every kata's public record is made first (the whole catalogue run on public inputs)

KATAS = list(manifest.load().values())
IDS = [k.id for k in KATAS]
GOAL = 0.9  # the share of a kata's catalogue its public checks alone must catch


RECORD_LIMIT = 10 * 10**6  # bytes a kata's public record may take: a handout must fit a GitHub repository with room


class _Lazy(dict):
    """A kata's entry made the first time a test asks for it: a worker makes the records of the katas it runs."""

    def __init__(self, make):
        super().__init__()
        self._make = make

    def __missing__(self, kata_id: str):
        self[kata_id] = self._make(kata_id)
        return self[kata_id]


@pytest.fixture(scope="session")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Each kata's public record, made once a process (as ``kvkata assign`` makes it) and saved as a handout
    holds it. The tests of one kata run in one worker (conftest.group), so each record is made once a run."""
    folder = tmp_path_factory.mktemp("records")
    return _Lazy(lambda kata_id: tape.save(folder, tape.record(kata_id)))


@pytest.fixture(scope="session")
def records(saved) -> dict[str, dict]:
    """The saved records, read back as a handout reads them."""
    return _Lazy(lambda kata_id: tape_keys.decode(saved[kata_id].read_bytes()))


@pytest.mark.parametrize("kata_id", IDS)
def test_a_public_record_takes_at_most_10_mb(kata_id, saved):
    size = saved[kata_id].stat().st_size
    assert saved[kata_id].name == f"{kata_id}{tape_keys.SUFFIX}"
    assert size <= RECORD_LIMIT, f"kata {kata_id}: its public record takes {size:,} bytes"


_GRADED: dict[tuple[str, int], dict[str, list]] = {}  # (kata, id of the record) -> every target's results


def graded_all(kata_id: str, record: dict) -> dict[str, list]:
    """Every public check's results on the reference, the stub and each known mistake, graded once a record
    (the record is kept alive by the fixture that made it, so its id is not reused)."""
    key = (kata_id, id(record))
    if key not in _GRADED:
        kata = manifest.get(kata_id)
        targets_ = [("reference", targets.reference(kata)), ("stub", targets.stub(kata))] + \
            [(m.name, t) for m, t in mistakes.load(kata_id)]
        _GRADED[key] = {name: graded(kata_id, target, record) for name, target in targets_}
    return _GRADED[key]


def outcomes(kata_id: str, record: dict) -> dict[str, list]:
    """Every public check's result, message and diagnoses on the reference, the stub and each known mistake."""
    return {name: [(r.check.id, r.status, r.message, r.diagnoses) for r in results]
            for name, results in graded_all(kata_id, record).items()}


@pytest.mark.parametrize("kata_id", IDS)
def test_the_saved_record_grades_exactly_as_the_record_made(kata_id, saved, records):
    """What a handout reads back (equal tensors kept once, compressed) grades the reference, the stub
    and every known mistake with the same results, messages and diagnoses as the record as made."""
    made = tape.record(kata_id)  # the record as the recorder made it, in memory (one process makes it once)
    assert outcomes(kata_id, records[kata_id]) == outcomes(kata_id, made)


def test_equal_tensors_are_kept_once_and_nothing_is_rounded():
    x = torch.randn(3, 4, dtype=torch.float64)
    record = {"kata": "01", "a": [x.clone(), x.clone(), x.clone().t()], "b": {"y": x.clone().to(torch.bfloat16)},
              "c": (x.clone() + 2**-40,)}
    back = tape_keys.decode(tape_keys.encode(record))
    first, again, turned = back["a"]
    assert first.untyped_storage().data_ptr() == again.untyped_storage().data_ptr()  # written once
    assert turned.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()  # other strides: its own
    assert torch.equal(turned, x.t()) and turned.stride() == x.t().stride()
    assert back["b"]["y"].dtype == torch.bfloat16 and torch.equal(back["c"][0], x + 2**-40)  # bit for bit
    assert not torch.equal(back["c"][0], x)


def graded(kata_id: str, target, record: dict) -> list:
    ctx = public.PublicCtx(target, kata_id, "cpu", record)
    known = public.known_mistakes(kata_id, record)
    return [run_check(c, ctx, known, 60) for c in checks.for_kata(kata_id).all if c.id in record["public"]]


@pytest.mark.parametrize("kata_id", IDS)
def test_public_checks_pass_the_reference_and_catch_the_catalogue(kata_id, records):
    record = records[kata_id]
    assert record["public"] and set(record["public"]) <= {c.id for c in checks.for_kata(kata_id).all}
    results = graded_all(kata_id, record)
    assert [r.status for r in results["reference"]] == ["pass"] * len(record["public"])
    assert {r.status for r in results["stub"]} == {"not-implemented"}
    caught, wrong = [], []
    for mistake in mistakes.catalogue(kata_id):
        failed = [r for r in results[mistake.name] if not r.passed]
        if failed:
            caught.append(mistake.name)
            assert any(mistake.name in r.diagnoses for r in failed), (mistake.name, [r.message for r in failed])
        wrong += [(mistake.name, r.check.id, d) for r in failed for d in r.diagnoses if d != mistake.name]
    assert not wrong, wrong
    total = len(mistakes.catalogue(kata_id))
    assert tape.share(record) == {"public": len(record["public"]), "checks": len(checks.for_kata(kata_id).all),
                                  "caught": len(caught), "mistakes": total}
    assert len(caught) >= GOAL * total, f"kata {kata_id}: the public checks catch {len(caught)} of {total}"


@pytest.mark.parametrize("kata_id,name", UNKNOWN_CASES, ids=[f"{k}-{n}" for k, n in UNKNOWN_CASES])
def test_an_unknown_bug_fails_a_public_check_and_is_named_as_nothing(kata_id, name, records):
    failed = [r for r in graded(kata_id, unknown_bug(kata_id, name), records[kata_id]) if not r.passed]
    assert failed and not [d for r in failed for d in r.diagnoses]


@pytest.mark.parametrize("kata_id", IDS)
def test_the_public_inputs_are_not_the_grading_inputs(kata_id, records):
    """The instructor's grading (seed 0) draws other inputs: tuning to the public ones does not pass it."""
    kata, record = manifest.get(kata_id), records[kata_id]
    ctx = Ctx(targets.reference(kata), targets.reference(kata), "cpu", 0)
    drawn = public_drawn = 0
    for check in checks.for_kata(kata_id).all:
        for site in diagnosis.sites(check, ctx):
            if site.strategy is None:
                continue
            grading = {repr(e) for e in diagnosis.drawn(ctx, check, site)}
            mine = [repr(e) for e in record["examples"].get(f"{check.id}/{site.number}", [])]
            drawn += len(mine)
            public_drawn += sum(e not in grading for e in mine)
    assert record["seed"] != 0
    assert drawn == 0 or public_drawn >= 0.8 * drawn, f"{public_drawn} of {drawn} public inputs are new"


# -- a handout ---------------------------------------------------------------------------------------
def bodies(source: str) -> dict[str, str]:
    """Function bodies (docstrings aside) of a dozen AST nodes or more, by their dump."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            module = ast.Module(body=body, type_ignores=[])
            if sum(1 for _ in ast.walk(module)) >= 12:
                found[ast.dump(module)] = node.name
    return found


def secret_bodies(katas) -> dict[str, str]:
    """The bodies of the katas' solutions and known mistakes that their stubs do not give away."""
    return _secret_bodies(tuple(k.id for k in katas))


@lru_cache(maxsize=None)
def _secret_bodies(ids: tuple[str, ...]) -> dict[str, str]:
    found = {}
    for k in map(manifest.get, ids):
        reference = (manifest.REPO_ROOT / k.solution).read_text(encoding="utf-8")
        given = bodies((manifest.REPO_ROOT / k.stub).read_text(encoding="utf-8"))
        variants = [(reference, k.solution)] + [(m.apply(reference), f"mistake {m.name!r}") for m in mistakes.catalogue(k.id)]
        for source, where in variants:
            found.update({dump: f"{where}: {name}" for dump, name in bodies(source).items() if dump not in given})
    for path in (manifest.PACKAGE_DIR / "mistakes").glob("*.py"):
        found.update({dump: f"{path.name}: {name}" for dump, name in bodies(path.read_text(encoding="utf-8")).items()})
    return found


def leaked(folder: Path, katas, but=()) -> list[str]:
    """Secret bodies of ``katas`` in ``folder``'s Python files, leaving out those ``but``'s hold too."""
    allowed = secret_bodies(but)
    secret = {dump: where for dump, where in secret_bodies(katas).items() if dump not in allowed}
    files = [p for p in folder.rglob("*.py") if ".venv" not in p.relative_to(folder).parts]  # a student's venv
    return [f"{path.relative_to(folder)}: {name} is {secret[dump]}" for path in files
            for dump, name in bodies(path.read_text(encoding="utf-8")).items() if dump in secret]


@pytest.fixture(scope="module")
def handout(tmp_path_factory, records) -> Path:
    out = tmp_path_factory.mktemp("handout") / "level1"
    handouts.assign(1, str(out))
    return out


def run(folder: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "KVKATA_STATE"}
    environment.update(PYTHONPATH=str(folder), **(env or {}))
    return subprocess.run([sys.executable, *args], cwd=folder, env=environment, capture_output=True, text=True,
                          timeout=600)


def test_a_handout_names_the_tiled_repeat_and_passes_a_correct_file(handout):
    k03 = manifest.get("03")
    reference = (manifest.REPO_ROOT / k03.solution).read_text(encoding="utf-8")
    tiled = next(m for m in mistakes.catalogue("03") if m.name == "tiled repeat instead of interleave")
    total = len(checks.for_kata("03").all)
    (handout / k03.stub).write_text(tiled.apply(reference), encoding="utf-8")
    wrong = run(handout, "-m", "pytest", "katas/03")
    out = wrong.stdout + wrong.stderr
    assert wrong.returncode == 1 and f"public checks: {total} of {total}" in out, out[-3000:]
    assert "this looks like a known mistake: tiled repeat instead of interleave" in out and "Traceback" not in out
    (handout / k03.stub).write_text(reference, encoding="utf-8")
    right = run(handout, "-m", "pytest", "katas/03")
    assert right.returncode == 0 and f"{total} passed" in right.stdout, right.stdout[-3000:]
    checked = run(handout, "-m", "grader.cli", "check", "03")
    assert checked.returncode == 0 and f"{total}/{total} checks pass" in checked.stdout, checked.stdout
    shutil.copyfile(manifest.REPO_ROOT / k03.stub, handout / k03.stub)


def test_a_notebook_check_cell_in_a_handout_runs_the_public_checks(handout):
    k01 = manifest.get("01")
    cell = (f"ns = {{}}; exec(open({str(manifest.REPO_ROOT / k01.solution)!r}).read(), ns)\n"
            "from grader.grade import report_namespace\nreport_namespace('01', ns, 'cpu')")
    ran = run(handout, "-c", cell, env={"KVKATA_STATE": str(handout / ".state")})
    total = len(checks.for_kata("01").all)
    assert ran.returncode == 0 and f"{total}/{total} checks pass" in ran.stdout, ran.stdout + ran.stderr
    assert "public checks:" in ran.stdout
    picture = run(handout, "-c", "from grader.learner.pictures import plot_memory\nassert plot_memory() is None")
    assert picture.returncode == 0 and "does not hold (a handout)" in picture.stdout, picture.stdout + picture.stderr


def test_the_handout_readme_prints_each_katas_catch_share(handout, records):
    text = (handout / "README.md").read_text(encoding="utf-8")
    assert "cannot be graded" not in text
    for k in handouts.katas_for(1):
        share = tape.share(records[k.id])
        row = re.search(rf"(?m)^\| {k.id} .*\| (\d+) of (\d+) \| (\d+) of (\d+) \((\d+)%\) \|$", text)
        assert row, k.id
        assert [int(g) for g in row.groups()[:4]] == [share["public"], share["checks"], share["caught"], share["mistakes"]]
        assert int(row.group(5)) >= 100 * GOAL


def test_a_handout_holds_no_reference_code(handout, tmp_path):
    """No body of any kata's solution or known mistake, and no checks module of a kata it does not
    assign (nor the recorder, which needs them): in the level-1 handout and in the grader of the
    largest one."""
    assert not (handout / "solutions").exists() and not (handout / "grader" / "mistakes").exists()
    assert not (handout / "grader" / "public_record" / "tape.py").exists()
    assert not leaked(handout, KATAS)
    assert sorted(p.name for p in (handout / "grader" / "checks").glob("*.py")) == \
        ["__init__.py", "k01.py", "k02.py", "k03.py", "k04.py"]
    assert sorted(p.name for p in (handout / "grader" / "checks" / "promises").iterdir()) == \
        [f"k{k.id}.toml" for k in handouts.katas_for(1)]
    everything = handouts.katas_for(max(k.level for k in KATAS))  # the grader of the largest handout
    handouts._copy_grader(tmp_path / "grader", everything)
    assert not leaked(tmp_path, KATAS) and not (tmp_path / "grader" / handouts.PAGED_COPY).exists()
    assert leaked(manifest.REPO_ROOT / "solutions", everything), "the test must be able to fail"
    in_paged = [line for line in leaked(manifest.PACKAGE_DIR, KATAS) if line.startswith("paged.py:")]
    assert not in_paged, f"grader/paged.py loads kata 06's reference and holds no copy of it: {in_paged}"


def test_a_level4_only_handout_carries_kata_06s_paged_cache_and_says_so(tmp_path):
    """Katas 11 and 13 build on kata 06's cache: without kata 06, the handout gets a copy of its
    reference (and nothing else of kata 06), which grader/paged.py loads; with it, the student's."""
    level4 = handouts.katas_for(4, only=True)
    folder = tmp_path / "level4"
    handouts._copy_grader(folder / "grader", level4)
    k06 = [manifest.get("06")]
    assert not leaked(folder, [k for k in KATAS if k.id != "06"], but=k06)  # kata 10 shares a function with 06
    found = leaked(folder, k06)
    assert found and {line.split(":")[0] for line in found} == {f"grader/{handouts.PAGED_COPY}"}, found
    shipped = {p.name for p in (folder / "grader" / "checks").glob("*.py")}
    assert "k08.py" not in shipped and "k06_programs.py" not in shipped  # the shared harness is in checks/support
    loads = run(folder, "-c", "import grader.paged as p, grader.checks.k11, grader.checks.k13; print(p.source_file())")
    assert loads.returncode == 0 and loads.stdout.strip() == str(folder / "grader" / handouts.PAGED_COPY), loads.stderr
    note = handouts.paged_note(level4)
    assert "Katas 11 and 13 build on" in note and "copy of kata 06's reference" in note
    with_06 = handouts.katas_for(4)
    assert not handouts.paged_copy_needed(with_06) and "your own `katas/06/paged.py`" in handouts.paged_note(with_06)
    own = tmp_path / "with06"
    handouts._copy_grader(own / "grader", with_06)
    (own / "katas" / "06").mkdir(parents=True)
    shutil.copyfile(manifest.REPO_ROOT / manifest.get("06").stub, own / "katas" / "06" / "paged.py")
    loads = run(own, "-c", "import grader.paged as p; print(p.source_file())")
    assert loads.returncode == 0 and loads.stdout.strip() == str(own / "katas" / "06" / "paged.py"), loads.stderr
    assert not (own / "grader" / handouts.PAGED_COPY).exists()
    none = tmp_path / "level1"
    handouts._copy_grader(none / "grader", handouts.katas_for(1))
    fails = run(none, "-c", "import grader.paged")
    assert fails.returncode == 1 and "ImportError: grader.paged: no paged cache to load" in fails.stderr, fails.stderr
    assert handouts.paged_note(handouts.katas_for(1)) == ""


def graders(flow: dict) -> list[dict]:
    """The workflow's command-grader steps, one a kata."""
    steps = flow["jobs"]["run-autograding-tests"]["steps"]
    return [s for s in steps if s.get("uses", "").startswith("classroom-resources/autograding-command-grader@")]


def test_the_classroom_workflow_scores_each_kata_through_classrooms_actions(handout, tmp_path):
    """One command-grader test a kata, worth its points, the reporter given every one of them; each
    test's command fails on the stubs and passes on the solutions, run as the grader runs it (with
    PATH and HOME only)."""
    flow = yaml.safe_load((handout / ".github" / "workflows" / "classroom.yml").read_text(encoding="utf-8"))
    assert "push" in flow[True] and "repository_dispatch" in flow[True]  # YAML 1.1 reads the key `on` as True
    assert flow["permissions"]["checks"] == "write"
    steps = flow["jobs"]["run-autograding-tests"]["steps"]
    python = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python@"))
    assert python["with"]["cache"] == "pip" and python["with"]["cache-dependency-path"] == "pyproject.toml"
    assert any("pip install -e ." in s.get("run", "") for s in steps)
    level1, tests = handouts.katas_for(1), graders(flow)
    assert [t["id"] for t in tests] == [f"kata-{k.id}" for k in level1]
    assert [t["with"]["max-score"] for t in tests] == [len(checks.for_kata(k.id).all) for k in level1]  # one a check
    reporter = steps[-1]
    assert reporter["uses"].startswith("classroom-resources/autograding-grading-reporter@")
    assert reporter["with"]["runners"].split(",") == [t["id"] for t in tests]
    assert reporter["env"] == {f"{t['id'].upper()}_RESULTS": f"${{{{steps.{t['id']}.outputs.result}}}}" for t in tests}
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "PYTHONPATH": str(handout),
           "KVKATA_STATE": str(tmp_path / "state")}

    def exits(test: dict) -> int:
        command = test["with"]["command"].replace("kvkata ", f"{sys.executable} -m grader.cli ", 1)
        return subprocess.run(command, shell=True, cwd=handout, env=env, capture_output=True, timeout=600).returncode

    assert [exits(t) for t in tests] == [1] * len(tests)  # red from the first push: the stubs fail
    for k in level1:
        shutil.copyfile(manifest.REPO_ROOT / k.solution, handout / k.stub)
    try:
        assert [exits(t) for t in tests] == [0] * len(tests)
    finally:
        for k in level1:
            shutil.copyfile(manifest.REPO_ROOT / k.stub, handout / k.stub)
    readme = (handout / "README.md").read_text(encoding="utf-8")
    assert "red until every kata passes" in readme
    bare = tmp_path / "bare"
    handouts.assign(1, str(bare), only=True, ci=False)
    assert not (bare / ".github").exists() and "GitHub Classroom" not in (bare / "README.md").read_text()


def test_a_single_kata_handout_carries_the_learners_commands_only(tmp_path):
    """``--kata 04 --points 04=10``: kata 04 alone, worth 10 in its workflow; no instructor's part
    (the classroom, the bench and its sound file, mutation testing) and a pyproject naming none;
    the instructor's commands refuse clearly; and, under umask 002, files a group can read and write."""
    old = os.umask(0o002)
    try:
        out = tmp_path / "kata04"
        said = handouts.assign(None, str(out), kata_ids=["4"], points="04=10")
    finally:
        os.umask(old)
    assert "04: 10 (total 10)" in said
    assert sorted(p.name for p in (out / "katas").iterdir()) == ["04"]
    assert [t["with"]["max-score"] for t in graders(yaml.safe_load((out / ".github" / "workflows" / "classroom.yml")
                                                                    .read_text()))] == [10]
    for part in ("classroom", "bench", "mutation", "mutation_equivalents.toml", "mutation_report.md"):
        assert not (out / "grader" / part).exists(), part
    assert not list(out.rglob("*.wav"))
    text = (out / "pyproject.toml").read_text(encoding="utf-8")
    for name in ("grader.mutation", "grader.bench", "grader.classroom", "importlinter", "tests"):
        assert name not in text, name
    assert tomllib.loads(text)["tool"]["pytest"]["ini_options"]["testpaths"] == ["katas"]
    for command in (["grade", "."], ["assign", "--level", "1"], ["autograder", "--level", "1"], ["bench"],
                    ["prairielearn", "--kata", "01", "--out", "q"]):
        refused = run(out, "-m", "grader.cli", *command)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert refused.stderr.startswith(f"kvkata: error: `kvkata {command[0]}` is not in a handout"), refused.stderr
    helped = run(out, "-m", "grader.cli", "--help")
    assert "check" in helped.stdout and "assign" not in helped.stdout and "autograder" not in helped.stdout
    assert out.stat().st_mode & 0o777 == 0o775
    for path in [out / "katas" / "04" / manifest.get("04").file, out / "grader" / "public" / f"04{tape_keys.SUFFIX}",
                 out / "README.md", out / "grader" / "pristine" / "04" / manifest.get("04").file]:
        assert path.stat().st_mode & 0o777 == 0o664, (path, oct(path.stat().st_mode))


def test_a_handout_carries_every_checks_module_its_katas_import():
    """What Python loads when it imports a kata's checks is what the handout copies, however the import
    is spelled (a module imported under another name included)."""
    script = ("import importlib, json, sys\n"
              "found = {}\n"
              "for kata_id in sys.argv[1:]:\n"
              "    for name in [m for m in sys.modules if m.startswith('grader.checks.k')]:\n"
              "        del sys.modules[name]\n"
              "    importlib.import_module(f'grader.checks.k{kata_id}')\n"
              "    found[kata_id] = sorted(m.split('.')[2] + '.py' for m in sys.modules if m.startswith('grader.checks.k'))\n"
              "print(json.dumps(found))\n")
    ids = list(manifest.load())
    ran = subprocess.run([sys.executable, "-c", script, *ids], capture_output=True, text=True,
                         cwd=manifest.REPO_ROOT, env={**os.environ, "PYTHONPATH": str(manifest.REPO_ROOT)})
    assert ran.returncode == 0, ran.stderr[-2000:]
    loaded = json.loads(ran.stdout)
    for kata_id in ids:
        copied = sorted(p.name for p in handouts.check_modules({kata_id}))
        assert copied == loaded[kata_id], f"kata {kata_id}: the handout copies {copied}, its checks import {loaded[kata_id]}"


def test_a_kept_record_is_copied_until_what_decided_it_changes(tmp_path, monkeypatch):
    """KVKATA_RECORD_CACHE: the second handout of a kata copies the record the first made, byte for byte; an
    edit to the kata's checks, a module they import or the recorder gives another key, so a record is made."""
    from grader.public_record import kept
    from grader.sources import read

    monkeypatch.setenv(kept.CACHE, str(tmp_path / "cache"))
    first, copied = kept.record_into(tmp_path / "a", "02")
    assert not copied
    again, copied = kept.record_into(tmp_path / "b", "02")
    assert copied and again == first
    assert (tmp_path / "a" / "02.pt.xz").read_bytes() == (tmp_path / "b" / "02.pt.xz").read_bytes()

    def edited(path: str):
        return lambda relative: read(relative) + ("\n# edited\n" if relative == path else "")
    for path in ("grader/checks/k02.py", "grader/engine/core.py", "grader/public_record/tape.py", "solutions/02/offsets.py"):
        assert kept.key("02", edited(path)) != kept.key("02"), path
    assert kept.key("02", edited("grader/checks/k05.py")) == kept.key("02")
