"""Grade a kata without pytest: the engine behind the plugin, the CLI, notebooks and tests."""
from __future__ import annotations

import re
import time

from grader import checks, manifest, render, state
from grader.engine import CheckTimeout, Ctx, Result, hangs, reconcile, report, run_check, targets, time_limit
from grader.public_record import public, records
from grader.runtime import pick_device, single_thread  # noqa: F401  (grade.pick_device: the front ends' name for it)

DEFAULT_TIMEOUT = 60.0


def gradable(kata: manifest.Kata) -> bool:
    """Whether this copy can grade the kata: it has the reference, or (a handout) its public record."""
    return records.gradable(kata)


def context(kata: manifest.Kata, target: targets.Target, device, seed: int = 0) -> tuple[Ctx, tuple]:
    """The checks' context and the known mistakes: the reference and the catalogue in the full
    repository; in a handout, the kata's public record (grader.public_record.public)."""
    if public.active(kata.id):
        return public.PublicCtx(target, kata.id, device), public.known_mistakes(kata.id)
    from grader import mistakes  # here, not at the top: a handout has no grader/mistakes

    return Ctx(target, targets.reference(kata), device, seed), mistakes.load(kata.id)


def load(kata: manifest.Kata, spec: str, root=None, timeout: float | None = None) -> targets.Target:
    """``targets.resolve`` within ``timeout`` seconds: a file whose import never ends fails to load, saying so."""
    try:
        with time_limit(timeout):
            return targets.resolve(kata, spec, root)
    except CheckTimeout:
        label = kata.stub if spec == "stub" else spec
        raise targets.TargetLoadError(report.IMPORT_TIMED_OUT.format(label=label, seconds=timeout)) from None


def checks_for(kata_id: str) -> list:
    """The checks that run in this copy: every one in the repository, the public ones in a handout."""
    return public.checks_of(kata_id, checks.for_kata(kata_id).all)


def public_header(kata: manifest.Kata) -> str:
    """In a handout, what ran: "public checks: N of M; ..."; empty in the full repository."""
    return public.header(kata.id, len(checks.for_kata(kata.id).all)) if public.active(kata.id) else ""


def grade(kata_id: str, target: targets.Target | str = "stub", device: str = "cpu", seed: int = 0,
          timeout: float | None = DEFAULT_TIMEOUT, diagnose: bool = True, only: list[str] | None = None) -> list[Result]:
    """Run every check of the kata against ``target`` (a Target, "stub", "solution" or a path); with
    ``only``, just the checks of those ids, in the kata's order."""
    kata = manifest.get(kata_id)
    chosen = checks_for(kata.id)
    if only is not None:
        unknown = sorted(set(only) - {c.id for c in chosen})
        if unknown:
            raise ValueError(f"only: kata {kata.id} has no check {unknown[0]!r}")
        chosen = [c for c in chosen if c.id in set(only)]
    if isinstance(target, str):
        target = targets.resolve(kata, target)
    single_thread()
    ctx, known = context(kata, target, pick_device(device), seed)
    try:
        results = [run_check(check, ctx, known if diagnose else (), timeout) for check in chosen]
        return reconcile(results, ctx, known) if diagnose else results
    finally:
        hangs.restore(target)  # a function that hung is the learner's again (a notebook's, say)


def summary(kata: manifest.Kata, results: list[Result]) -> str:
    """``kata 03: 5/14 checks pass — start with task 1, repeat_kv``."""
    passed = sum(r.passed for r in results)
    line = report.SUMMARY.format(kata=kata.id, passed=passed, total=len(results))
    failing = [r for r in results if not r.passed]
    if failing:
        line += next_step(kata, [culprit(kata, r) for r in failing])
    else:
        later = [k for k in manifest.load().values() if k.id > kata.id]
        line += report.ALL_PASS.format(next=f"pytest katas/{later[0].id}" if later else "you have done every kata")
    return line


def culprit(kata: manifest.Kata, result: Result) -> str:
    """The API name a failed check points at: the function of a README task whose result differed first,
    where the result says which, else the name the check exercises first. In order: the function a stub
    left unimplemented, or that hung; the call a comparison named; the first line of the message that begins with an
    API name (the label of the result that differed), or the step of a program marked as the failing one
    (``→  4  append_token(0, 0)``); the first API name the message calls "your" one; the
    learner's function a crash came through."""
    failure = result.failure
    hung = re.search(r"(?:hung in|it calls) `([\w.]+)`", result.message) \
        if result.status in ("timeout", "not-run") else None
    candidates = [_not_implemented(result.message) if result.status == "not-implemented" else None,
                  hung.group(1) if hung else None, failure.culprit if failure is not None else None]
    if result.status == "fail":
        candidates += [_marked_step(kata, result.message), _leading_name(kata, result.message),
                       _your_name(kata, result.message),
                       _crashed_in(kata, result.message)]
    for name in candidates:
        name = (kata.api_name(name) or name) if name else None  # a method of a class a task asks for stays as named
        if name and kata.task_number(name) is not None:
            return name
    return result.check.uses


def _message_lines(message: str) -> list[str]:
    """The lines of a failure message that say what happened: not the input it happened on, nor a trace of
    the learner's code (whose source lines may begin with any name)."""
    lines = []
    for line in message.splitlines():
        line = line.strip().lstrip("·-•→ ").strip()
        if line.startswith('File "'):
            break
        if line and not line.startswith("on input"):
            lines.append(line)
    return lines


def _marked_step(kata: manifest.Kata, message: str) -> str | None:
    """The API name the step a program listing marks with → calls (``→  4  append_token(0, 0)``)."""
    for line in message.splitlines():
        step = re.match(r"\s*→\s*(?:\d+\s+)?([A-Za-z_]\w*)\(", line)
        if step and kata.api_name(step.group(1)):
            return step.group(1)
    return None


def _leading_name(kata: manifest.Kata, message: str) -> str | None:
    """The API name the first line of ``message`` that starts with one starts with (``attention_mask(2) differs``,
    ``swap_in(cache, pool, 0) · free host blocks``, ``prefill_worker's stats``)."""
    for line in _message_lines(message):
        word = re.match(r"(?:your )?([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)(?![A-Za-z0-9_])", line)
        if word:
            for name in (word.group(1), word.group(1).split(".")[-1], word.group(1).split(".")[0]):
                if kata.api_name(name):
                    return name
    return None


def _crashed_in(kata: manifest.Kata, message: str) -> str | None:
    """The outermost of the learner's functions in a crash's trace that the API names."""
    for word in re.findall(r'File "[^"]*", line \d+, in ([A-Za-z_][\w.]*)', message):
        name = kata.api_name(word) or kata.api_name(word.split(".")[-1])
        if name:
            return name
    return None


def _your_name(kata: manifest.Kata, message: str) -> str | None:
    """The first API name the message calls "your" one (``…, but your update raised ValueError``)."""
    for line in _message_lines(message):
        for word in re.findall(r"\byour ([A-Za-z_]\w*)", line):
            if kata.api_name(word):
                return word
    return None


def _not_implemented(message: str) -> str | None:
    """The stub function a "not implemented yet: NAME" result names."""
    head = report.NOT_IMPLEMENTED.split("{")[0]
    return message[len(head):].split()[0] if message.startswith(head) and message[len(head):].strip() else None


def first_task(kata: manifest.Kata, results: list[Result]) -> int | None:
    """The README number of the task "start with task N" names for ``results``; None when all pass (or
    no failing name belongs to a task)."""
    failing = [culprit(kata, r) for r in results if not r.passed]
    task = min((kata.task_number(name) or len(kata.tasks) + 1 for name in failing), default=None)
    return task if task is not None and task <= len(kata.tasks) else None


def next_step(kata: manifest.Kata, failing: list[str]) -> str:
    """`` — start with task 3, max_batch_size``: the README's number of the earliest task a failing
    check exercises (never past an earlier failing task), and the first failing name of that task."""
    numbered = [(kata.task_number(name) or len(kata.tasks) + 1, order, name) for order, name in enumerate(failing)]
    task, _, name = min(numbered)
    if task > len(kata.tasks):
        return report.NEXT_STEP.format(task="?", name=name)
    step = report.NEXT_STEP.format(task=task, name=name)
    helpers = kata.tasks[:task - 1]
    if helpers and all(n.startswith("_") for names in helpers for n in names):  # checked only through this task
        step += report.BUILT_ON.format(tasks="task 1" if task == 2 else f"tasks 1–{task - 1}")
    return step


def not_run_lines(results: list[Result]) -> list[str]:
    """The checks not run because a function hung in an earlier one: the reason once, then their titles."""
    by_reason: dict[str, list[str]] = {}
    for r in results:
        if r.status == "not-run":
            by_reason.setdefault(r.message, []).append(r.check.title)
    lines = []
    for reason, titles in by_reason.items():
        lines.append(f"  · {len(titles)} check(s) " + reason.replace("not run: it calls", "not run: each calls", 1) + ":")
        lines += [f"      {title}" for title in titles]
    return lines


def record(kata: manifest.Kata, results: list[Result], target_label: str, device: str) -> dict:
    """The saved form of one kata's run, for the board."""
    return {
        kata.id: {
            "target": target_label,
            "device": device,
            "passed": sum(r.passed for r in results),
            "total": len(results),
            "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "checks": {r.check.id: {"status": r.status, "diagnoses": r.diagnoses} for r in results},
            "first_task": first_task(kata, results),  # the task the summary points at (kvkata hint opens there)
        }
    }


def report_namespace(kata_id: str, namespace: dict, device: str = "auto") -> list[Result]:
    """Grade names defined in a notebook, print a report and note it on the board, next to (never
    instead of) the results of the kata's file; never raises for the learner's code."""
    kata = manifest.get(kata_id)
    picked = str(pick_device(device))
    results = grade(kata.id, targets.from_namespace(namespace), device=picked)
    if public_header(kata):
        print(public_header(kata))
    print("\n".join(render.result_lines(results)))
    print(summary(kata, results))
    if all(r.status == "not-implemented" for r in results):
        return results  # an untouched notebook marks nothing on the board
    try:  # kept apart from the file's results: the board shows both, each named
        state.save_results(record(kata, results, "notebook", picked), name=state.NOTEBOOK_RESULTS)
    except OSError as exc:  # a read-only folder must not stop the notebook
        print(f"(the board was not updated: {exc})")
    return results
