"""A worker's control group (grader.classroom.cohort.cgroups): one memory ceiling for the worker and every
process it starts, and every process left in the group killed at the end, wherever it went."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from grader.classroom.cohort import cgroups

pytestmark = pytest.mark.skipif(not cgroups.probe(), reason="no writable cgroup v1 memory and pids hierarchy here")
MB = 2**20


SCRIPT = """
import json, os, sys, time
from grader.classroom.cohort import cgroups
spec, budget, each, children, linger = json.loads(sys.argv[1])
cgroups.join(spec, budget)  # a small process: what it holds when it joins is a few MB
def hold():
    held = bytearray(each)
    for i in range(0, each, 4096):  # touched, so the pages are really the process'
        held[i] = 1
    time.sleep(0.3)
pids = [os.fork() for _ in range(children)]
if 0 in pids:
    if linger:
        os.setsid()
        time.sleep(60)
    hold()
    os._exit(0)
hold()
killed = [os.waitpid(pid, 0)[1] for pid in pids] if not linger else []
sys.exit(1 if any(os.WIFSIGNALED(status) for status in killed) else 0)  # whichever of the three the kernel chose
"""


def _worker(group: cgroups.Group, budget: int, each: int, children: int, linger: bool = False):
    """A small process that joins ``group`` with ``budget`` bytes, forks ``children``, and each of them and it
    holds ``each`` bytes (children that ``linger`` detach and sleep instead)."""
    import json
    import subprocess
    import sys
    from conftest import ROOT
    return subprocess.run([sys.executable, "-c", SCRIPT, json.dumps([group.spec(), budget, each, children, linger])],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def test_a_worker_and_its_children_share_one_ceiling():
    group = cgroups.Group(f"kvkata-test-{os.getpid()}")
    try:  # three processes, each well within the budget alone, together above it: the kernel kills one of them
        ran = _worker(group, 100 * MB, 45 * MB, children=2)
        assert group.out_of_memory() and ran.returncode != 0
        group.kill()
    finally:
        group.remove()
    assert not group.folders["memory"].exists() and not group.folders["pids"].exists()


def test_within_the_ceiling_nothing_is_killed_and_the_group_is_left_clean():
    group = cgroups.Group(f"kvkata-test-{os.getpid()}")
    try:
        ran = _worker(group, 100 * MB, 20 * MB, children=2)
        assert ran.returncode == 0 and not group.out_of_memory()
        assert group.pids() == [] and group.kill() == 0
    finally:
        group.remove()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] not in "ZX"
    except (OSError, IndexError):
        return False


def test_what_a_worker_left_in_its_group_is_killed_wherever_it_went():
    group = cgroups.Group(f"kvkata-test-{os.getpid()}")
    try:  # a child in a session of its own, outliving the worker
        ran = _worker(group, 100 * MB, MB, children=1, linger=True)
        assert ran.returncode == 0
        left = group.pids()
        assert len(left) == 1 and _alive(left[0])
        assert group.kill() == 1 and group.pids() == [] and not _alive(left[0])
    finally:
        group.remove()


@pytest.mark.slow
def test_a_cohort_grades_kata_16s_pair_inside_a_group_and_removes_it(tmp_path):
    """Kata 16's checks fork a pair of processes from the worker: with the group's ceiling over all three, the
    reference still passes every check, and no group is left behind."""
    from grader import manifest
    from grader.classroom.cohort import grading, launch
    from grader.classroom.cohort import sandbox as cohort

    kata = manifest.get("16")
    (tmp_path / "sub" / "katas" / "16").mkdir(parents=True)
    (tmp_path / "sub" / kata.stub).write_text((manifest.REPO_ROOT / kata.solution).read_text())
    settings = cohort.Settings(timeout=300, memory_mb=1024, walls={**launch.walls(), "cgroups": True})
    (row,) = cohort.grade_all(grading.jobs_for([str(tmp_path / "sub")], None, False), settings)
    assert row["status"] == "pass" and row["passed"] == row["total"], row["note"]
    assert not [p for c in cgroups.CONTROLLERS for p in cgroups._own(c).glob(f"kvkata-{os.getpid()}-*")]
