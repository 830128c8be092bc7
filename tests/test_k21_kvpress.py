"""Kata 21's reference against kvpress's SnapKV: a committed snapshot of kvpress's outputs on fixed
inputs (tests/snapshots/k21_kvpress.py made it, in an environment of its own, as kvpress needs
transformers < 5.3), compared here without kvpress; and, where kvpress is installed, the snapshot
against kvpress itself."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from grader import manifest
from grader.engine import targets

SPEC = importlib.util.spec_from_file_location("k21_kvpress", manifest.REPO_ROOT / "tests/snapshots/k21_kvpress.py")
snapshot = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(snapshot)
CASES = snapshot.load()["cases"]
REF = targets.reference(manifest.get("21")).namespace


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_snapkv_scores_equal_kvpress(case):
    q, keys = torch.tensor(case["q_window"]), torch.tensor(case["keys"])
    ours = REF["snapkv_scores"](q, keys, case["kernel_size"])
    theirs = torch.tensor(case["scores"])
    assert ours.shape == theirs.shape and ours.dtype == torch.float32
    assert (ours - theirs).abs().max() <= 1e-6 * theirs.abs().max(), (ours - theirs).abs().max()


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_snapkv_keep_keeps_what_kvpress_keeps(case):
    scores = REF["snapkv_scores"](torch.tensor(case["q_window"]), torch.tensor(case["keys"]), case["kernel_size"])
    kept = REF["snapkv_keep"](scores, case["n_kept"], case["window"])
    assert kept.tolist() == case["kept"]


def test_the_snapshot_is_what_kvpress_gives():
    try:
        import kvpress  # noqa: F401
        import transformers
    except ImportError:
        pytest.skip(f"kvpress is not installed: {snapshot.INSTALL}")
    if tuple(int(p) for p in transformers.__version__.split(".")[:2]) >= (5, 3):
        pytest.skip(f"kvpress needs transformers < 5.3, found {transformers.__version__}: {snapshot.INSTALL}")
    fresh = snapshot.make()["cases"]
    for new, old in zip(fresh, CASES):
        assert new["kept"] == old["kept"]
        assert torch.allclose(torch.tensor(new["scores"]), torch.tensor(old["scores"]), rtol=1e-6, atol=1e-9)
