"""What the test files share: the katas, a committed copy of the repository for tests that drive
``kvkata`` in a subprocess, the bugs no mistake catalogue knows, and a grader that remembers nothing
from the test before (but for a kata's known mistakes graded in turn).

Tiers: a bare ``pytest`` is the quick tier (every test not marked ``slow``) in two processes; ``pytest -m slow``
runs the rest, ``pytest --full`` everything (``bash .ci/run`` runs the quick tier, then the slow one).
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from grader import grade, manifest, mistakes
from grader.engine import diagnosis, targets
from grader.mistakes import Mistake

ROOT = manifest.REPO_ROOT
KATAS = list(manifest.load().values())
IDS = [k.id for k in KATAS]
K01 = manifest.get("01")
MISTAKES = [(k.id, m) for k in KATAS for m in mistakes.catalogue(k.id)]
SKIP = shutil.ignore_patterns(".git", ".kvkata", "__pycache__", ".hypothesis", ".pytest_cache", "*.egg-info",
                              ".benchmarks", "handout-level*")


# -- tiers ------------------------------------------------------------------------------------------------
slow = pytest.mark.slow  # left out of a bare ``pytest`` (the quick tier); ``pytest -m slow`` or ``--full`` runs it
QUICK = "not slow"
RECORD_CACHE = "KVKATA_RECORD_CACHE"  # where a run keeps the public records it made, shared by its workers
SPOT_CHECK = "KVKATA_MUTATION_SPOT_CHECK"  # the kata whose recorded mutation run is redone anyway (tests/test_mutation.py)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true",
                     help="every test, the slow tier included (a bare pytest runs the quick tier only)")


def _bare(config: pytest.Config) -> bool:
    """``pytest`` with no paths: the command the README gives."""
    return config.args_source == pytest.Config.ArgsSource.TESTPATHS


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """A bare ``pytest`` is the quick tier, in two processes where pytest-xdist is installed (before xdist
    reads ``-n``). Any ``-m``, ``-n`` or path given on the command line wins."""
    if _bare(config) and not config.option.markexpr and not config.getoption("full"):
        config.option.markexpr = QUICK  # on xdist's workers too: each parses the command line again
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return
    parallel = _bare(config) or config.getoption("full")
    if (parallel and config.option.numprocesses is None
            and not config.getoption("usepdb") and not config.getoption("collectonly") and (os.cpu_count() or 1) > 1):
        config.option.numprocesses = 2
    if config.option.numprocesses and config.option.dist in ("no", "load"):
        config.option.dist = "loadgroup"  # a module's shared venvs, records and models are made once (SHARED)


# Modules whose fixtures build something costly once (a venv, every public record, a model, a built zip): all
# their tests go to one worker, so that it is built once a run rather than once a worker.
SHARED = {"test_user_paths", "test_public", "test_autograder", "test_notebooks", "test_classroom", "test_whisper",
          "test_models", "test_beam_search", "test_engine", "test_bench_models", "test_playground"}
PER_KATA = {"test_public"}  # of those, modules whose tests taking a kata_id build what they share once a kata
GROUPED = "kvkata_grouped"  # the word a controller sends its workers: tests go to workers by group
# What the shell may hold that changes how the project behaves, never inherited by a test (a test that needs one
# sets its own): a state folder, an autograder root, kept sandboxes.
OURS = ("KVKATA_STATE", "KVKATA_AUTOGRADER_ROOT", "KVKATA_KEEP_SANDBOXES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist: tell each worker whether tests are sent by group (a worker parses the command line again, and
    the ``loadgroup`` chosen in pytest_cmdline_main is not on it: without this word a worker would never mark
    its tests' groups, and every test would go wherever a worker is free)."""
    node.workerinput[GROUPED] = node.config.option.dist == "loadgroup"


def pytest_configure(config: pytest.Config) -> None:
    """The shell's settings of ours dropped; one spot check a run, drawn by the controller (its workers
    inherit the environment)."""
    for name in OURS:
        os.environ.pop(name, None)
    if hasattr(config, "workerinput"):
        if config.workerinput.get(GROUPED):
            config.option.loadgroup = True  # read by xdist's worker when it collects: it adds "@group" to each id
        return
    if not os.environ.get(SPOT_CHECK):
        os.environ[SPOT_CHECK] = random.choice(IDS)
    if RECORD_CACHE not in os.environ:  # each kata's public record made once a run (grader.public_record.kept)
        os.environ[RECORD_CACHE] = tempfile.mkdtemp(prefix="kvkata-records-")
        config.add_cleanup(lambda: shutil.rmtree(os.environ.pop(RECORD_CACHE), ignore_errors=True))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if group := _group(item):
            item.add_marker(pytest.mark.xdist_group(group))


def _group(item: pytest.Item) -> str | None:
    """The worker an item must share with others: its module's, where the module builds something costly once;
    a kata's own, where the module builds it once a kata (test_public: a kata's public record and its grading)."""
    module = item.module.__name__ if getattr(item, "module", None) else ""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if module in PER_KATA and "kata_id" in params:
        return f"{module}-{params['kata_id']}"
    return module if module in SHARED else None


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if config.option.markexpr == QUICK and _bare(config):
        terminalreporter.write_line(
            "quick tier: the tests marked slow (handouts in new virtual environments, cohorts, every known mistake, "
            "mutation runs) were left out; `pytest -m slow` runs them, `pytest --full` runs everything, "
            "`bash .ci/run` runs both tiers as CI does", bold=True)


def first_of_each_kata_fast(cases: list[tuple], ids: list[str]) -> list:
    """``cases`` (kata id first) as parameters: the first case of each kata in the inner loop, the
    others marked ``slow``."""
    seen: set[str] = set()
    params = []
    for case, case_id in zip(cases, ids):
        params.append(pytest.param(*case, id=case_id, marks=() if case[0] not in seen else slow))
        seen.add(case[0])
    return params


# -- a copy of the repository, and kvkata run in it ---------------------------------------------------
def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=kvkata", "-c", "user.email=kvkata@example.com", *args], cwd=repo,
                   check=True, capture_output=True)


def _ignore(folder: str, names: list[str]) -> set[str]:
    """What a copy leaves out: caches, handouts, and any virtual environment (a folder holding pyvenv.cfg),
    whatever it is called: a venv inside the checkout holds gigabytes of torch."""
    return set(SKIP(folder, names)) | {n for n in names if (Path(folder) / n / "pyvenv.cfg").is_file()}


def copy_repo(dest: Path) -> Path:
    """The repository copied to ``dest`` and committed there (so the untouched stubs are in git)."""
    shutil.copytree(ROOT, dest, ignore=_ignore)
    if shutil.which("git"):
        git(dest, "init", "-q")
        git(dest, "add", "-A")
        git(dest, "commit", "-qm", "the katas")
    else:  # no git: the stubs as `kvkata assign` keeps them in handouts
        for kata in KATAS:
            (dest / "grader" / "pristine" / kata.id).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(dest / kata.stub, dest / "grader" / "pristine" / kata.id / kata.file)
    return dest


def kvkata(repo: Path, *args: str, stdin: str = "", cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KVKATA_STATE"}
    env["PYTHONPATH"] = str(repo)
    return subprocess.run([sys.executable, "-m", "grader.cli", *args], cwd=cwd or repo, env=env, input=stdin,
                          capture_output=True, text=True, timeout=300)


def usage_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("kvkata: error:") and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


# -- bugs no catalogue holds ------------------------------------------------------------------------------
_SCALE = ("/ math.sqrt(self.head_dim)", "/ self.head_dim")  # scores divided by D instead of sqrt(D)

# kata -> name -> edits of the reference (each text occurs once).
UNKNOWN = {
    "01": {
        "scores divided by head_dim": (_SCALE,),
        "heads merged without the transpose": (
            ("out = out.transpose(1, 2).reshape(B, T, self.d_model)", "out = out.reshape(B, T, self.d_model)"),),
    },
    "02": {
        "positions start one past the cache": (
            ("torch.arange(past_len, past_len + new_len, device=device)",
             "torch.arange(past_len + 1, past_len + new_len + 1, device=device)"),),
        "scores divided by head_dim": (_SCALE,),
        "heads merged without the transpose": (
            ("out = out.transpose(1, 2).reshape(B, T, self.d_model)", "out = out.reshape(B, T, self.d_model)"),),
    },
    "03": {
        "scores divided by head_dim": (_SCALE,),
        "heads merged without the transpose": (
            ("out = out.transpose(1, 2).reshape(B, T, self.n_q_heads * self.head_dim)",
             "out = out.reshape(B, T, self.n_q_heads * self.head_dim)"),),
    },
    "04": {
        "cache bytes counted twice": (
            ('return _count("batch", batch) * _count("seq_len", seq_len) * per_token',
             'return 2 * _count("batch", batch) * _count("seq_len", seq_len) * per_token'),),
        "a negative batch when the weights do not fit": (
            ("    if free < 0:  # not even the weights fit\n        return 0\n", ""),),
    },
    "05": {
        "values written with the keys": (("V[:, :, start:end] = v_new", "V[:, :, start:end] = k_new"),),
        "keys stored doubled": (("K[:, :, start:end] = k_new", "K[:, :, start:end] = 2 * k_new"),),
    },
    "06": {
        "a chunk's values written with its keys": (
            ("pages_v[blocks, :, offsets] = v.transpose(0, 1)", "pages_v[blocks, :, offsets] = k.transpose(0, 1)"),),
        "each slot one further on in its block": (
            ("slots = [table[p // P] * P + p % P for p in", "slots = [table[p // P] * P + (p + 1) % P for p in"),),
    },
    "07": {
        "the cache returns its keys as values": (
            ("return apply_rope(K, slots, self.rope_base), V", "return apply_rope(K, slots, self.rope_base), K"),),
        "heads merged without the transpose": (
            ("self.wo(out.transpose(1, 2).reshape(B, T, self.d_model))", "self.wo(out.reshape(B, T, self.d_model))"),),
        "scores divided by head_dim": (_SCALE,),
    },
    "08": {
        "greedy picks the least likely token": (("return logits.argmax(-1)", "return logits.argmin(-1)"),),
        "prompt positions start at 1": (
            ("positions = (slots[None, :P] - first[:, None]).clamp(min=0)",
             "positions = (slots[None, :P] - first[:, None] + 1).clamp(min=0)"),),
    },
}
UNKNOWN_CASES = [(kata, name) for kata, bugs in UNKNOWN.items() for name in bugs]


def unknown_bug(kata_id: str, name: str, filename: str | None = None) -> targets.Target:
    """The reference of ``kata_id`` with the edits of ``UNKNOWN[kata_id][name]``, as a target."""
    reference = (ROOT / manifest.get(kata_id).solution).read_text(encoding="utf-8")
    source = Mistake(name, "", "", UNKNOWN[kata_id][name]).apply(reference)
    return targets.from_source(source, filename or f"<unknown bug {kata_id}: {name}>", f"unknown bug {name!r}")


def built(kata_id: str) -> dict[str, targets.Target]:
    """The kata's known mistakes, each built into a target, by name."""
    return {m.name: t for m, t in mistakes.load(kata_id)}


# -- what the grader remembers ----------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def fresh_memory(request):
    """Every test starts with a grader that remembers nothing (grader.engine.diagnosis.forget): what a
    known mistake did on an input, the calls a check makes and the inputs it draws. Otherwise a test
    runs faster or slower according to the tests before it, and one tier's time depends on the other.
    The one sharing kept on purpose: ``grade_in_turn``."""
    if "grade_in_turn" not in request.fixturenames:
        diagnosis.forget()
    yield


class _InTurn:
    """``grade.grade`` (with diagnoses) that keeps the grader's memory from one call to the next while
    they grade the same kata, and starts from nothing when the kata changes."""

    def __init__(self):
        self.kata: str | None = None

    def __call__(self, kata_id: str, target: targets.Target) -> list:
        if kata_id != self.kata:
            diagnosis.forget()
            self.kata = kata_id
        return grade.grade(kata_id, target)


@pytest.fixture(scope="session")
def grade_in_turn() -> _InTurn:
    """Grade the mistakes of one kata one after the other: they share what each taught the grader
    about the others (their outputs on the further inputs that tell them apart), less work than each
    from nothing. A test's time then depends only on the same kata's tests just before it."""
    return _InTurn()


@pytest.fixture(scope="module")
def tiny():
    """A small random Llama (2 layers, 4 query heads over 2 KV heads, a vocabulary of 64), the same in every test."""
    import torch
    from grader.nn import Llama, LlamaConfig
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, rope_theta=100000.0)
    return Llama(config).eval()
