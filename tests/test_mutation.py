"""The mutation tester: its operators, that it kills known mutants of a small kata quickly, and that the
reviewed list of equivalent mutants parses and names only mutants that still exist."""
from __future__ import annotations

import functools
import os
import warnings

import pytest

from grader import manifest
from grader.mutation import mutants, proof, runner, summary
from conftest import SPOT_CHECK

SNIPPET = '''\
def f(x, cache=None):
    """A docstring is never mutated."""
    if cache is not None:
        x = x.contiguous().float()
    if len(x) != 4:
        raise ValueError(f"x: expected 4, got {len(x)}")
    return x[1:3], 64
'''


def _ids(source: str) -> list[str]:
    return [m.id for m in mutants(source)]


def test_the_field_operators_apply():
    ids = _ids(SNIPPET)
    for expected in ("`is not None` → truthiness: if cache is not None:",
                     "copy `.contiguous()` dropped: x = x.contiguous().float()",
                     "dtype cast `.float()` dropped: x = x.contiguous().float()",
                     "`!=` → `<`: if len(x) != 4:",
                     "slice start +1: return x[1:3], 64",
                     "slice stop -1: return x[1:3], 64",
                     "constant 64 → 256: return x[1:3], 64",
                     "`raise` dropped: raise ValueError(f\"x: expected 4, got {len(x)}\")"):
        assert expected in ids, expected
    assert len(ids) == len(set(ids)), "mutant ids must be unique"
    assert not any("docstring" in i or "expected 4, got" in i and "raise" not in i for i in ids)


def test_every_mutant_parses_and_differs_from_the_original():
    for m in mutants(SNIPPET):
        compile(m.source, "<mutant>", "exec")
        assert m.source != SNIPPET


def test_mutant_ids_do_not_depend_on_line_numbers():
    shifted = "import math\n\n" + SNIPPET
    assert _ids(shifted) == _ids(SNIPPET)


def test_known_mutants_of_kata_01_are_killed_and_the_reference_survives():
    outcomes = runner.run("01", jobs=1, only="dim=2")
    assert outcomes and all(o.killed for o in outcomes), [(o.mutant.id, o.how) for o in outcomes if not o.killed]
    assert any(o.how.startswith("append_kv_grows") for o in outcomes)


def test_a_mutant_that_hangs_is_killed_by_the_timeout():
    kata = manifest.get("01")
    reference = runner.warm_up(kata)
    source = (manifest.REPO_ROOT / kata.solution).read_text(encoding="utf-8")
    hanging = source + "\nwhile True:\n    pass\n"
    [outcome] = runner.grade_all(kata, reference, [runner.Mutant("hangs", "test", 0, hanging)], 1, 1.0)
    assert outcome.killed and outcome.how == "timeout"


def test_the_equivalents_list_parses_and_every_listed_mutant_exists():
    listed = summary.equivalents()
    assert listed, "the reviewed list is empty"
    ids = {}
    for kata_id, mutant_id in listed:
        if kata_id not in ids:
            ids[kata_id] = {m.id for m in runner.kata_mutants(manifest.get(kata_id))}
        assert mutant_id in ids[kata_id], f"kata {kata_id}: no mutant {mutant_id!r} any more; update the list"


def test_a_bad_entry_of_the_list_is_a_clear_error(tmp_path):
    bad = tmp_path / "eq.toml"
    bad.write_text('[[equivalent]]\nkata = "01"\nmutant = "x"\n', encoding="utf-8")
    with pytest.raises(ValueError, match="reason"):
        summary.equivalents(bad)


# Prove once, re-prove what changed (grader/mutation/proof.py): a kata's whole run is redone when what decides it
# changed since its recorded run, or when it is the run's spot check (drawn in conftest.py, or set in
# KVKATA_MUTATION_SPOT_CHECK); otherwise its recorded run, made from exactly today's inputs, stands.
EVERY_KATA = list(manifest.load())
RECORD = "KVKATA_MUTATION_RECORD"  # set: each kata run again is recorded in grader/mutation_proofs.json


@functools.cache
def _plan() -> list[str]:
    listed = summary.equivalents()
    fingerprints = {k: proof.fingerprint(k, equivalents=listed) for k in EVERY_KATA}
    return proof.to_rerun(EVERY_KATA, proof.load(), fingerprints, os.environ.get(SPOT_CHECK))


def test_every_kata_has_a_recorded_run_that_kills_every_non_equivalent_mutant():
    records = proof.load()
    assert sorted(records) == EVERY_KATA, f"no recorded run for {sorted(set(EVERY_KATA) - set(records))}"
    assert not [k for k, r in records.items() if not summary.passed(r)], "a recorded run left mutants alive"
    listed = summary.equivalents()
    old = proof.stale(EVERY_KATA, records, {k: proof.fingerprint(k, equivalents=listed) for k in EVERY_KATA})
    if old:  # not a failure: the slow tier redoes them; the warning says how to record them
        warnings.warn(f"mutation runs to redo (their inputs changed): katas {' '.join(old)}; "
                      f"record them with `{proof.refresh_command(old)}`", stacklevel=1)


@pytest.mark.slow
@pytest.mark.parametrize("kata_id", EVERY_KATA)
def test_every_non_equivalent_mutant_is_killed(kata_id):
    if kata_id not in _plan():
        record = proof.load()[kata_id]
        assert summary.passed(record), record
        return
    listed = summary.equivalents()
    decided_by = proof.fingerprint(kata_id, equivalents=listed)
    outcomes = runner.run(kata_id, jobs=2)
    figures = summary.figures(kata_id, outcomes, listed)
    if os.environ.get(RECORD):  # a developer's run records what it proved, as python -m grader.mutation does
        proof.save({kata_id: summary.record(figures, decided_by)})
    assert not figures.surviving, [o.mutant.id for o in figures.surviving]
    assert not figures.stale, f"listed as equivalent but killed: {[o.mutant.id for o in figures.stale]}"
    assert not figures.gone, f"listed as equivalent but no longer a mutant: {figures.gone}"


def _edited(relative: str, text: str = "\n# edited\n"):
    def read(path: str) -> str:
        return proof._read(path) + (text if path == relative else "")
    return read


@pytest.mark.parametrize("edited, expected", [
    ("grader/checks/k03.py", ["03"]),
    ("grader/mistakes/k10.py", ["10"]),
    ("solutions/06/paged.py", None),  # kata 06, and every kata whose checks run kata 06's paged cache
    ("grader/engine/core.py", EVERY_KATA),
    ("grader/mutation/operators.py", EVERY_KATA),
    ("katas/03/gqa.py", []),  # a stub decides nothing
])
def test_a_change_reruns_the_mutation_of_the_katas_it_decides_and_no_other(edited, expected):
    listed = summary.equivalents()
    before = {k: proof.fingerprint(k, equivalents=listed) for k in EVERY_KATA}
    after = {k: proof.fingerprint(k, _edited(edited), listed) for k in EVERY_KATA}
    records = {k: {"fingerprint": f} for k, f in before.items()}
    again = proof.to_rerun(EVERY_KATA, records, after, None)
    if expected is None:
        users = [k for k in EVERY_KATA if "grader/paged.py" in proof.inputs(k)]
        assert users and "11" in users and "14" in users, users
        expected = sorted({"06", *users})
    assert again == expected
    assert proof.to_rerun(EVERY_KATA, records, after, "18") == sorted({*expected, "18"})  # and the spot check


def test_a_changed_equivalents_entry_reruns_its_kata_only():
    listed = summary.equivalents()
    changed = {key: (reason + " (reworded)" if key[0] == "07" else reason) for key, reason in listed.items()}
    old = {k: proof.fingerprint(k, equivalents=listed) for k in EVERY_KATA}
    new = {k: proof.fingerprint(k, equivalents=changed) for k in EVERY_KATA}
    assert [k for k in EVERY_KATA if old[k] != new[k]] == ["07"]


def test_the_command_names_a_bad_kata_id_and_defaults_to_every_kata(capsys):
    from grader.mutation.__main__ import main

    with pytest.raises(SystemExit, match="expected ids among 01"):
        main(["99"])
    assert main(["--list", "--only", "raise"]) == 0
    listed = {line.split("\t")[0] for line in capsys.readouterr().out.splitlines()}
    assert listed == set(manifest.load())  # every reference has a raise to drop


def test_a_handout_leaves_out_the_mutation_tools_and_their_lists(tmp_path):
    from grader.classroom import handouts

    handouts._copy_grader(tmp_path / "grader", [manifest.get("01")])
    assert not [p.name for p in (tmp_path / "grader").iterdir() if p.name.startswith("mutation")]
    assert (tmp_path / "grader" / "checks" / "support" / "envelope.py").is_file()  # the checks need it
