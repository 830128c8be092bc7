"""The learner's tools around the board: grading a kata's file, the hint ladder, resetting a
kata to its untouched stub (the learner's file is backed up first, never lost) and the diff from
stub to reference.

The untouched stub is looked up in git: the newest committed version of ``katas/NN/<file>`` that
still looks like a stub (every public function and method but ``__init__`` raises
NotImplementedError), so a learner who commits their progress still gets the real stub back.
Outside git (a handout), ``grader/pristine/NN/<file>`` is used when ``kvkata assign`` left it there.
"""
from __future__ import annotations

import difflib
import time
from pathlib import Path

from grader import manifest, state
from grader.errors import UsageError
from grader.stubs import pristine_stub

HINTS = "hints.json"
BACKUPS = "backups"


def kata(kata_id: str) -> manifest.Kata:
    """The kata, or a UsageError naming the valid ids."""
    try:
        return manifest.get(kata_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# -- grading the learner's own file (in this process, like ``pytest katas/NN``) ------------
def grade_file(k: manifest.Kata, spec: str, device: str = "cpu", seed: int = 0, timeout: float | None = None):
    """Results of every check of ``k`` on ``spec`` ("stub" or a path); a file that will not import
    fails every check with the reason, as the pytest plugin does."""
    from grader import grade  # here, not at the top: grading imports torch, and `kvkata` starts without it
    from grader.engine import report, Result, targets

    if not grade.gradable(k):
        raise UsageError(f"kata {k.id}: there is no reference solution here ({k.solution}) and no public record, so "
                         "nothing can be graded in this copy; your instructor grades it with `kvkata grade`")
    try:
        kata_checks = grade.checks_for(k.id)
    except ModuleNotFoundError:
        raise UsageError(f"kata {k.id} has no checks yet") from None
    try:
        target = grade.load(k, spec, timeout=timeout or grade.DEFAULT_TIMEOUT)
        device = str(grade.pick_device(device))
    except targets.TargetLoadError as exc:
        return [Result(c, "fail", report.LOAD_FAILED.format(reason=exc)) for c in kata_checks]
    except ValueError as exc:
        raise UsageError(f"--{exc}") from None
    return grade.grade(k.id, target, device=device, seed=seed, timeout=timeout or grade.DEFAULT_TIMEOUT)


def summary_line(k: manifest.Kata, results) -> str:
    """One Markdown line for a CI job summary: the kata, checks passed, and the first failure."""
    passed, total = sum(r.passed for r in results), len(results)
    line = f"- {'✅' if passed == total else '❌'} kata {k.id} {k.title}: {passed}/{total} checks pass"
    failing = next((r for r in results if not r.passed), None)
    if failing is not None:
        first = failing.message.splitlines()[0] if failing.message else failing.status
        line += f" — first failing: {failing.check.title} ({first[:160]})"
        if failing.diagnoses:
            line += f"; looks like: {', '.join(failing.diagnoses)}"
    return line


def append_summary(path: str, lines: list[str]) -> None:
    """Append ``lines`` to a job-summary file (created when absent)."""
    with open(path, "a", encoding="utf-8") as out:
        out.write("### KV-cache katas: public checks\n\n" + "\n".join(lines) + "\n")


def saved_results(name: str = state.RESULTS) -> dict:
    """The latest results of each kata, as the board shows them (``state.NOTEBOOK_RESULTS``: of the
    notebooks' check cells)."""
    results = state.load_results(name=name)
    return {k: v for k, v in results.items() if isinstance(v, dict)} if isinstance(results, dict) else {}


def save_results(k: manifest.Kata, results, device: str) -> None:
    from grader import grade  # here, not at the top: grading imports torch, and `kvkata` starts without it

    state.save_results(grade.record(k, results, "stub", device))


def forget_results(kata_id: str) -> None:
    path = state.state_dir() / state.RESULTS
    results = state.read_json(path, {})
    if isinstance(results, dict) and results.pop(kata_id, None) is not None:
        state.write_json(path, results)


# -- hints ----------------------------------------------------------------------------------
def hint_text(k: manifest.Kata, numbers: range, task: int | None = None) -> str:
    total = len(k.hints)
    about = f", about task {task}, where your latest run fails first" if task is not None else ""
    parts = [f"hint {n} of {total} for kata {k.id} ({k.title}{about}):\n" + _indent(k.hints[n - 1]) for n in numbers]
    return "\n\n".join(parts)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def next_hint(k: manifest.Kata, shown: int, show_all: bool, task: int | None = None) -> tuple[str, int]:
    """The text to print and the new count of hints shown, given ``shown`` so far. ``task``: the task the
    latest run points at; the ladder jumps to the first hint about it when that one was not shown yet."""
    total = len(k.hints)
    if total == 0:
        return f"kata {k.id} has no hints.", 0
    if show_all:
        return hint_text(k, range(1, total + 1)), total
    about = next((n for n, tasks in enumerate(k.hint_tasks, start=1) if task in tasks), None)
    if about is not None and about > shown:
        shown = about - 1
    else:
        about = None
    if shown >= total:
        return (f"all {total} hints of kata {k.id} are shown already:\n\n" + hint_text(k, range(1, total + 1)), total)
    shown += 1
    more = total - shown
    tail = f"\n\n({more} more: run the same command again)" if more else "\n\n(that was the last hint)"
    return hint_text(k, range(shown, shown + 1), task if about else None) + tail, shown


def failing_task(k: manifest.Kata) -> int | None:
    """The task the board's latest run of ``k`` points at ("start with task N"), if it failed."""
    task = saved_results().get(k.id, {}).get("first_task")
    return task if isinstance(task, int) and not isinstance(task, bool) else None


def hint(k: manifest.Kata, show_all: bool = False) -> str:
    """The learner's next hint of ``k``, opening at the hint about the task the latest run fails first; the
    count shown is remembered in the state folder."""
    path = state.state_dir() / HINTS
    counts = state.read_json(path, {})
    counts = counts if isinstance(counts, dict) else {}
    text, counts[k.id] = next_hint(k, int(counts.get(k.id, 0) or 0), show_all, failing_task(k))
    state.write_json(path, counts)
    return text


# -- reset ----------------------------------------------------------------------------------
def backup(path: Path, k: manifest.Kata) -> Path:
    """Copy ``path`` into the state folder's backups under a timestamped name; that name."""
    folder = state.state_dir() / BACKUPS / k.id
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = folder / f"{k.file}.{stamp}", 1
    while target.exists():
        n += 1
        target = folder / f"{k.file}.{stamp}-{n}"
    state.write_atomic(target, path.read_bytes())
    return target


def reset(k: manifest.Kata) -> list[str]:
    """Put the untouched stub back in ``katas/NN``; the learner's file goes to a backup first."""
    text, origin = pristine_stub(k)
    path = manifest.REPO_ROOT / k.stub
    lines = []
    if path.is_file():
        if path.read_bytes() == text.encode("utf-8"):
            return [f"{k.stub} is already the untouched stub; nothing to do."]
        lines.append(f"saved your {k.stub} to {backup(path, k)}")
    state.write_atomic(path, text.encode("utf-8"))
    forget_results(k.id)
    lines.append(f"restored {k.stub} to the untouched stub (from {origin})")
    return lines


# -- the reference --------------------------------------------------------------------------
def passed(k: manifest.Kata) -> bool:
    """Whether the latest run of ``k`` on the board passed every check."""
    saved = state.load_results().get(k.id) or {}
    return bool(saved.get("total")) and saved.get("passed") == saved.get("total")


def solution_diff(k: manifest.Kata, unlocked: bool) -> str:
    """The unified diff from the untouched stub to the reference solution, once ``unlocked``
    (the kata passes, or the learner insists)."""
    reference = manifest.REPO_ROOT / k.solution
    if not reference.is_file():
        raise UsageError(f"there is no reference solution here ({k.solution}); ask your instructor")
    if not unlocked:
        raise UsageError(f"kata {k.id} does not pass yet: solve it first (pytest katas/{k.id}), "
                         f"or see the reference now with `kvkata solution {k.id} --force`")
    stub, origin = pristine_stub(k)
    diff = difflib.unified_diff(stub.splitlines(True), reference.read_text(encoding="utf-8").splitlines(True),
                                fromfile=f"{k.stub} (untouched stub, {origin})", tofile=k.solution)
    return "".join(diff)
