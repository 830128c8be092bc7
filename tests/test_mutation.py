"""The mutation tester: its operators, that it kills known mutants of a small kata quickly, and that the
reviewed list of equivalent mutants parses and names only mutants that still exist."""
from __future__ import annotations

import pytest

from grader import manifest
from grader.mutation import mutants, runner, summary

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


# Katas 14-17 grade each mutant through real process pairs, stand-in devices or a seq2seq model: their
# 1,151 mutants take longer than CI allows beside everything else, so their figures come from
# `python -m grader.mutation 14 15 16 17` (grader/mutation_report.md), run when their checks change.
WHOLE_RUN_IN_CI = [k for k in manifest.load() if k not in ("14", "15", "16", "17")]


@pytest.mark.slow
@pytest.mark.parametrize("kata_id", WHOLE_RUN_IN_CI)
def test_every_non_equivalent_mutant_is_killed(kata_id):
    outcomes = runner.run(kata_id, jobs=2)
    figures = summary.figures(kata_id, outcomes, summary.equivalents())
    assert not figures.surviving, [o.mutant.id for o in figures.surviving]
    assert not figures.stale, f"listed as equivalent but killed: {[o.mutant.id for o in figures.stale]}"


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
