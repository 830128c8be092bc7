"""How the suite spreads over workers: a module that builds something costly once (SHARED) keeps all its
tests on one worker, and test_public keeps each kata's tests together, so nothing costly is built twice a run."""
from __future__ import annotations

import re
import subprocess
import sys
from types import SimpleNamespace

from conftest import ROOT, _group

CHEAP = ["test_equal_tensors_are_kept_once_and_nothing_is_rounded",
         "test_a_handout_carries_every_checks_module_its_katas_import"]


def test_a_shared_modules_tests_run_on_one_worker_under_xdist():
    ran = subprocess.run([sys.executable, "-m", "pytest", "tests/test_public.py", "-n", "2", "--full", "-v",
                          "-p", "no:cacheprovider", "-k", " or ".join(CHEAP)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    lines = {name: re.search(rf"\[(gw\d)\] .*PASSED tests/test_public.py::{name}(\S*)", ran.stdout) for name in CHEAP}
    assert all(lines.values()), ran.stdout[-3000:]
    assert {m.group(2) for m in lines.values()} == {"@test_public"}, "the workers did not mark the tests' group"
    assert len({m.group(1) for m in lines.values()}) == 1, "one module's tests went to two workers"


def _item(module: str, **params):
    return SimpleNamespace(module=SimpleNamespace(__name__=module), callspec=SimpleNamespace(params=params))


def test_test_public_groups_a_katas_tests_by_kata():
    assert _group(_item("test_public", kata_id="16")) == "test_public-16"
    assert _group(_item("test_public", kata_id="16", name="x")) == "test_public-16"
    assert _group(_item("test_public")) == "test_public"
    assert _group(_item("test_user_paths", kata_id="16")) == "test_user_paths"
    assert _group(_item("test_katas", kata_id="16")) is None  # nothing built once: any worker
