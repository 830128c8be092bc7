"""The pytest plugin: ``pytest katas/03`` grades kata 03's file with the hidden checks.

Hooks appear in lifecycle order; options live in one ``kata`` group, mirrored as ini keys.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grader import grade, manifest, render, state
from grader.engine import Ctx, reconcile, report, Result, run_check, targets

SETTINGS = pytest.StashKey[dict]()
RESULTS = pytest.StashKey[dict]()
CONTEXTS = pytest.StashKey[dict]()  # kata id -> (ctx, known mistakes, results reconciled) of its file: ``final_results``
OPTIONS = {
    # name: (default, help)
    "target": ("stub", "what to grade: stub (your file in katas/NN), solution, or a PATH (file or folder)"),
    "device": ("auto", "auto (CUDA when present), cpu or cuda"),
    "seed": ("0", "seed for the inputs the checks draw; the same seed gives the same run"),
    "timeout": (str(grade.DEFAULT_TIMEOUT), "seconds one check may run before it fails as timed out"),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kata", "KV-cache katas grading")
    for name, (default, help_text) in OPTIONS.items():
        group.addoption(f"--kata-{name}", dest=f"kata_{name}", default=None, help=f"{help_text} (default {default})")
        parser.addini(f"kata_{name}", help_text, default=default)


def pytest_configure(config: pytest.Config) -> None:
    def value(name: str) -> str:
        given = config.getoption(f"kata_{name}")
        return str(given if given is not None else config.getini(f"kata_{name}"))

    try:
        device = grade.pick_device(value("device"))
    except ValueError as exc:
        raise pytest.UsageError(f"--kata-{exc}") from None
    try:
        seed, timeout = int(value("seed")), float(value("timeout"))
    except ValueError:
        raise pytest.UsageError(
            f"--kata-seed must be an integer and --kata-timeout a number of seconds; "
            f"got {value('seed')!r} and {value('timeout')!r}"
        ) from None
    grade.single_thread()
    config.stash[SETTINGS] = {"target": value("target"), "device": device, "seed": seed, "timeout": timeout}
    config.stash[RESULTS] = {}
    config.stash[CONTEXTS] = {}
    _reject_unknown_katas(config)


def _reject_unknown_katas(config: pytest.Config) -> None:
    katas = manifest.load()
    for arg in config.args:
        parts = Path(arg.split("::")[0]).parts
        if "katas" in parts:
            index = parts.index("katas")
            if index + 1 < len(parts) and parts[index + 1] not in katas:
                raise pytest.UsageError(
                    f"unknown kata {parts[index + 1]!r} in {arg!r}; valid ids: {', '.join(katas)}"
                )


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    kata = _kata_of(file_path, parent.config.rootpath)
    if kata is not None:
        return KataFile.from_parent(parent, path=file_path, kata=kata)
    return None


def _kata_of(path: Path, root: Path) -> manifest.Kata | None:
    try:
        relative = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return None
    for kata in manifest.load().values():
        if relative == kata.stub:
            return kata
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = config.stash[SETTINGS]["target"]
    katas = {item.kata.id for item in items if isinstance(item, KataItem)}
    if len(katas) > 1 and Path(spec).expanduser().is_file():
        raise pytest.UsageError(
            f"--kata-target={spec} is one file but {len(katas)} katas were collected; "
            "grade one kata at a time, or point at a folder holding katas/NN/<file>"
        )


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    files = {item.parent: None for item in items if isinstance(item, KataItem)}
    settings = config.stash[SETTINGS]
    lines = []
    for kata_file in files:
        kata = kata_file.kata
        public = grade.public_header(kata)
        lines.append(
            f"kata {kata.id} ({kata.title}) · target {kata_file.target_label()} · "
            f"device {settings['device']} · torch {torch.__version__} · "
            + ("the handout's public inputs" if public else f"seed {settings['seed']}")
        )
        if public:
            lines.append(f"kata {kata.id}: {public}")
        lines += session_note(config, kata)
    return lines


SESSION_NOTE = ("kata {kata}: an interview session of this kata is open. This run grades {stub}, the repository's "
                "file, not the session's ({file}); `kvkata check` grades the session's file")


def session_note(config: pytest.Config, kata: manifest.Kata) -> list[str]:
    """During an interview session of ``kata``, which file this run grades, and how to grade the session's."""
    session = state.open_session(config.rootpath)
    if config.stash[SETTINGS]["target"] != "stub" or session is None or session.get("kata") != kata.id:
        return []
    return [SESSION_NOTE.format(kata=kata.id, stub=kata.stub, file=session["file"])]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    result = getattr(item, "result", None)
    if call.when == "call" and result is not None:
        report.kata_status = result.status
    return report


def pytest_report_teststatus(report, config: pytest.Config):
    """A check of an untouched stub, or one not run because its function hung in an earlier check, is its
    own category: one line in the kata summary, no section."""
    status = getattr(report, "kata_status", None)
    if status == "not-implemented":
        return "not implemented", "n", ("NOT IMPLEMENTED", {"yellow": True})
    if status == "not-run":  # a function hung in an earlier check: said once there, one line each here
        return "not run", "-", ("NOT RUN", {"yellow": True})
    return None


def final_results(config: pytest.Config, kata_id: str) -> list[Result]:
    """The kata's results so far, each named mistake kept only where it agrees with the learner's file on
    every check both were graded on (grader.engine.run.reconcile); worked out again only after more ran."""
    raw: list[Result] = config.stash[RESULTS].get(kata_id, [])
    context = config.stash[CONTEXTS].get(kata_id)
    if context is None:  # the file did not load: nothing was named
        return raw
    ctx, known, done = context
    if done is None or len(done) != len(raw):
        done = reconcile(raw, ctx, known)
        config.stash[CONTEXTS][kata_id] = (ctx, known, done)
    return done


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    by_kata: dict[str, list[Result]] = config.stash.get(RESULTS, {})
    if not by_kata:
        return
    terminalreporter.section("kata summary")
    saved = {}
    for kata_id in sorted(by_kata):
        kata, results = manifest.get(kata_id), final_results(config, kata_id)
        for line in render.result_lines([r for r in results if r.status == "not-implemented"]):
            terminalreporter.write_line("  " + line)
        for line in grade.not_run_lines(results):
            terminalreporter.write_line(line)
        terminalreporter.write_line(grade.summary(kata, results))
        for line in session_note(config, kata):
            terminalreporter.write_line(line)
        for line in looks_like(results):
            terminalreporter.write_line(line)
        saved.update(grade.record(kata, results, config.stash[SETTINGS]["target"], str(config.stash[SETTINGS]["device"])))
    if config.stash[SETTINGS]["target"] == "stub":
        try:
            state.save_results(saved, config.rootpath)
        except OSError as exc:
            terminalreporter.write_line(f"kvkata: could not save results ({exc})")


def looks_like(results: list[Result]) -> list[str]:
    """One line per named mistake: the check it is explained under, and how many more name it."""
    named: dict[str, list[str]] = {}
    for r in results:
        for name in r.diagnoses:
            named.setdefault(name, []).append(r.check.title)
    return [f"  {titles[0]}: looks like {name}" + (f" (and {len(titles) - 1} more check(s))" if len(titles) > 1 else "")
            for name, titles in named.items()]


class KataFailed(Exception):
    def __init__(self, result: Result):
        super().__init__(result.message)
        self.result = result


class FinalMessage:
    """A failed check's message as pytest prints it, at the end of the run: by then every check of the kata
    has run, so the mistakes it names agree with all of them (``final_results``)."""

    def __init__(self, item: "KataItem"):
        self.item = item

    def __str__(self) -> str:
        for result in final_results(self.item.config, self.item.kata.id):
            if result.check.id == self.item.check.id:
                return result.message
        return self.item.result.message

    def toterminal(self, tw) -> None:
        for line in str(self).splitlines():
            tw.line(line)


class KataFile(pytest.File):
    """A kata's file: its items are the kata's hidden checks, bound to the target."""

    def __init__(self, *, kata: manifest.Kata, **kwargs):
        super().__init__(**kwargs)
        self.kata = kata
        self._ctx: Ctx | None = None
        self.mistakes: tuple = ()
        self._load_error: str | None = None

    def collect(self):
        for check in grade.checks_for(self.kata.id):
            yield KataItem.from_parent(self, name=check.id, check=check)

    def target_label(self) -> str:
        spec = self.config.stash[SETTINGS]["target"]
        return self.kata.stub if spec == "stub" else ("the reference" if spec == "solution" else spec)

    def context(self) -> Ctx | None:
        """The target loaded once for all checks; None (with ``load_error`` set) when it won't import."""
        if self._ctx is None and self._load_error is None:
            settings = self.config.stash[SETTINGS]
            try:
                target = grade.load(self.kata, settings["target"], self.config.rootpath, settings["timeout"])
            except targets.TargetLoadError as exc:
                self._load_error = str(exc)
                return None
            self._ctx, self.mistakes = grade.context(self.kata, target, settings["device"], settings["seed"])
            self.config.stash[CONTEXTS][self.kata.id] = (self._ctx, self.mistakes, None)
        return self._ctx


class KataItem(pytest.Item):
    def __init__(self, *, check, **kwargs):
        super().__init__(**kwargs)
        self.check = check
        self.kata = self.parent.kata

    def runtest(self) -> None:
        ctx = self.parent.context()
        if ctx is None:
            result = Result(self.check, "fail", report.LOAD_FAILED.format(reason=self.parent._load_error))
        else:
            settings = self.config.stash[SETTINGS]
            result = run_check(self.check, ctx, self.parent.mistakes, settings["timeout"])
        self.result = result
        self.config.stash[RESULTS].setdefault(self.kata.id, []).append(result)
        if not result.passed:
            raise KataFailed(result)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, KataFailed):
            return FinalMessage(self)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"kata {self.kata.id} · {self.check.title}"
