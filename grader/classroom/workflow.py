"""A handout's GitHub Classroom workflow (``.github/workflows/classroom.yml``) and its pyproject.

The workflow runs each kata's public checks as one test of GitHub Classroom's command grader
(``classroom-resources/autograding-command-grader``: the test scores its ``max-score`` when the
command exits 0, nothing otherwise), then Classroom's reporter
(``classroom-resources/autograding-grading-reporter``) sends the points to the assignment's grade
column and to the run's check summary. The command grader hands the command only ``PATH`` and
``HOME``, and reads ``max-score`` as a whole number: a kata's points must be whole here.
"""
from __future__ import annotations

import json
import tomllib

from grader import manifest
from grader.classroom.choice import number
from grader.errors import UsageError

HEAD = """# GitHub Classroom autograding: each kata's public checks are one test worth the kata's points,
# scored when every public check of the kata passes; the reporter sends the points to Classroom.
# The run is red until every kata passes (a student starts from stubs that fail).
name: Autograding Tests
on:
  push:
  repository_dispatch:
  workflow_dispatch:
permissions:
  checks: write
  actions: read
  contents: read
jobs:
  run-autograding-tests:
    runs-on: ubuntu-latest
    if: github.actor != 'github-classroom[bot]'
    timeout-minutes: 60
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
          cache: pip
          cache-dependency-path: pyproject.toml
      - name: Install (PyTorch for the CPU, then this project)
        run: |
          python -m pip install --upgrade pip
          python -m pip install torch --index-url https://download.pytorch.org/whl/cpu
          python -m pip install -e .
"""

STEP = """      - name: kata {id} ({points} points)
        id: {step}
        uses: classroom-resources/autograding-command-grader@v1
        with:
          test-name: {name}
          command: kvkata check {id} --device cpu
          timeout: 15
          max-score: {points}
"""

REPORTER = """      - name: Autograding Reporter
        if: always()
        uses: classroom-resources/autograding-grading-reporter@v1
        env:
{env}
        with:
          runners: {runners}
"""


def step_id(kata_id: str) -> str:
    return f"kata-{kata_id}"


def text(katas: list[manifest.Kata], points: dict[str, float]) -> str:
    """The workflow for these katas; a kata's points must be whole (the command grader's max-score)."""
    broken = [k.id for k in katas if points[k.id] != int(points[k.id])]
    if broken:
        raise UsageError(f"--points: kata(s) {', '.join(broken)} have fractional points; GitHub Classroom's command "
                         "grader counts whole points (or add --no-ci)")
    steps = "".join(STEP.format(id=k.id, step=step_id(k.id), points=number(points[k.id]),
                                name=json.dumps(f"kata {k.id} · {k.title}", ensure_ascii=False)) for k in katas)
    env = "\n".join(f'          {step_id(k.id).upper()}_RESULTS: "${{{{steps.{step_id(k.id)}.outputs.result}}}}"'
                    for k in katas)
    return HEAD + steps + REPORTER.format(env=env, runners=",".join(step_id(k.id) for k in katas))


# -- the handout's pyproject ----------------------------------------------------------------------
PYPROJECT = """[build-system]
requires = {build_requires}
build-backend = "setuptools.build_meta"

[project]
name = "kv-cache-katas-handout"
version = {version}
description = "A handout of the KV-cache katas: stubs to fill in, checked by their public checks."
requires-python = {python}
dependencies = {dependencies}

[project.optional-dependencies]
notebooks = {notebooks}
models = {models}

[project.scripts]
kvkata = "grader.cli:main"

[tool.setuptools.packages.find]
include = ["grader*"]

[tool.setuptools.package-data]
grader = ["*.toml", "public/*.pt.xz", "checks/promises/*.toml", "results/*.json"]

[tool.pytest.ini_options]
testpaths = ["katas"]
addopts = {addopts}
pythonpath = ["."]
filterwarnings = {filterwarnings}
"""


def pyproject() -> str:
    """The handout's own pyproject: what installs its grader and runs its katas' checks, naming no
    part of the repository that a handout leaves out (the bench, mutation testing, the classroom)."""
    with open(manifest.REPO_ROOT / "pyproject.toml", "rb") as handle:
        repo = tomllib.load(handle)
    project, pytest_ini = repo["project"], repo["tool"]["pytest"]["ini_options"]
    return PYPROJECT.format(build_requires=json.dumps(repo["build-system"]["requires"]),
                            version=json.dumps(project["version"]), python=json.dumps(project["requires-python"]),
                            dependencies=json.dumps(project["dependencies"]),
                            notebooks=json.dumps(project["optional-dependencies"]["notebooks"]),
                            models=json.dumps(project["optional-dependencies"]["models"]),
                            addopts=json.dumps(pytest_ini["addopts"]),
                            filterwarnings=json.dumps(pytest_ini.get("filterwarnings", [])))
