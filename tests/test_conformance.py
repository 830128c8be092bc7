"""Every promise of the SPEC and of a kata's README has a check, and the table that says which is
complete: every public name, every argument's bad input, every tensor's dtype and device."""
from __future__ import annotations

import pytest

from grader import checks, manifest
from grader.checks import conformance

ROOT = manifest.REPO_ROOT
KATAS = list(manifest.load().values())
IDS = [k.id for k in KATAS]
FIELDS = {"api", "kind", "arg", "says", "source", "checks", "exempt"}


def _table(kata) -> list[dict]:
    path = conformance.table_path(kata.id)
    assert path.is_file(), f"kata {kata.id} has no conformance table {path.relative_to(ROOT)}"
    promises = conformance.load(kata.id)
    assert promises, f"{path.name} lists no promise"
    return promises


@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_promises_are_well_formed(kata):
    names = conformance.public_arguments(ROOT / kata.stub)
    known = {c.id for c in checks.for_kata(kata.id).all}
    for p in _table(kata):
        where = f"k{kata.id}.toml: {p.get('api')} / {p.get('kind')} / {p.get('arg', '')}"
        assert set(p) <= FIELDS, f"{where}: unknown field(s) {sorted(set(p) - FIELDS)}"
        assert p.get("api") in names, f"{where}: api is not a public name of {kata.stub}"
        assert p.get("kind") in conformance.KINDS, f"{where}: kind must be one of {conformance.KINDS}"
        assert p.get("source") in conformance.SOURCES, f"{where}: source must be one of {conformance.SOURCES}"
        assert isinstance(p.get("says"), str) and p["says"].strip(), f"{where}: says what is promised"
        assert ("arg" in p) == (p["kind"] == "bad-input"), f"{where}: arg goes with kind = 'bad-input', only there"
        if "arg" in p:
            assert p["arg"] in names[p["api"]], f"{where}: {p['api']} has no argument {p['arg']!r}"
        ids = p.get("checks")
        assert isinstance(ids, list), f"{where}: checks must be a list of check ids"
        unknown = [i for i in ids if i not in known]
        assert not unknown, f"{where}: no check named {unknown} in grader/checks/k{kata.id}.py"
        if not ids:
            assert isinstance(p.get("exempt"), str) and p["exempt"].strip(), f"{where}: no check and no exempt reason"
        if p["kind"] == "device":
            assert "keeps_the_device" in ids, f"{where}: device promises point to keeps_the_device"


@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_every_public_name_has_a_promise(kata):
    covered = {p["api"] for p in _table(kata)}
    missing = [name for name in conformance.public_arguments(ROOT / kata.stub) if name not in covered]
    assert not missing, f"k{kata.id}.toml: no promise about {missing}"


@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_every_argument_has_a_bad_input_promise(kata):
    covered = {(p["api"], p.get("arg")) for p in _table(kata) if p.get("kind") == "bad-input"}
    missing = [f"{name}({arg})" for name, args in conformance.public_arguments(ROOT / kata.stub).items()
               for arg in args if (name, arg) not in covered]
    assert not missing, f"k{kata.id}.toml: no bad-input promise (or exempt reason) for {missing}"


@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_every_tensor_name_has_dtype_and_device_promises(kata):
    promises = _table(kata)
    missing = [f"{name}: {kind}" for name in sorted(conformance.tensor_names(ROOT / kata.stub))
               for kind in ("dtype", "device")
               if not any(p["api"] == name and p["kind"] == kind for p in promises)]
    assert not missing, f"k{kata.id}.toml: missing {missing}"
    if any(p["kind"] == "device" for p in promises):
        assert "keeps_the_device" in {c.id for c in checks.for_kata(kata.id).all}, \
            f"grader/checks/k{kata.id}.py has no check keeps_the_device"


WIDE_FIELDS = {"kind", "says", "checks", "exempt"}


@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_every_wide_kind_is_exercised_or_exempt(kata):
    """Each kind of input beyond the drawn ones is named once per table: the checks that reach it, or why
    it does not apply to this kata."""
    known = {c.id for c in checks.for_kata(kata.id).all}
    entries = conformance.load_wide(kata.id)
    for entry in entries:
        where = f"k{kata.id}.toml: wide / {entry.get('kind')}"
        assert set(entry) <= WIDE_FIELDS, f"{where}: unknown field(s) {sorted(set(entry) - WIDE_FIELDS)}"
        assert entry.get("kind") in conformance.WIDE, f"{where}: kind must be one of {sorted(conformance.WIDE)}"
        assert isinstance(entry.get("says"), str) and entry["says"].strip(), f"{where}: says what is exercised"
        ids = entry.get("checks")
        assert isinstance(ids, list), f"{where}: checks must be a list of check ids"
        unknown = [i for i in ids if i not in known]
        assert not unknown, f"{where}: no check named {unknown} in grader/checks/k{kata.id}.py"
        if not ids:
            assert isinstance(entry.get("exempt"), str) and entry["exempt"].strip(), \
                f"{where}: no check and no exempt reason"
    kinds = [e.get("kind") for e in entries]
    missing = [k for k in conformance.WIDE if k not in kinds]
    twice = sorted({k for k in kinds if kinds.count(k) > 1})
    assert not missing, f"k{kata.id}.toml: no [[wide]] entry for {missing}"
    assert not twice, f"k{kata.id}.toml: more than one [[wide]] entry for {twice}"
