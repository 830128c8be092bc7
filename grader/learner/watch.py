"""``kvkata watch [NN]``: re-grade a kata each time its file is saved, in one warm process.

The watcher imports torch, the grader, the checks, the references and the known mistakes once,
and runs each kata's checks once on its reference (``prime``), so the children it forks find that
work done. Each grading runs in such a child (grader.learner.live), which streams its results back: the
watcher says "grading kata NN…" at the save, shows the check that failed last first, each failing
check as it is known and the board line at the end. A newer save cancels a grading in progress;
a loop stops the grading at its first timeout; a file that crashes or exits ends only its child.
Results go to the board exactly as ``kvkata check`` saves them.

Saves are noticed through file-system notifications (inotify) where they work, else by polling
(grader.learner.changes). The watcher probes the notifications when it starts and polls by itself where
none arrive (WSL drives, network folders), and it also compares the files every few seconds as a
safety net.
"""
from __future__ import annotations

import select
import time

from grader import manifest, render
from grader.learner import changes, live
from grader.learner import tools as learner
from grader.errors import UsageError

CHECK_TIMEOUT = 10.0  # seconds one check may run in the watcher (a hang shows quickly)
TICK = 0.2  # seconds between looks at the files while polling during a grading
OVERDUE = "the check \"{check}\" ran past {seconds:g} s and could not be stopped from inside, so the grading was stopped"


# -- warming up ------------------------------------------------------------------------------
def warm_up(katas: list[manifest.Kata]) -> None:
    """Import what grading needs, once, before any child is forked (torch runs on one thread here,
    grade.single_thread, so no thread pool exists to break in the children)."""
    from grader import grade
    from grader.engine import targets
    from grader.public_record import public

    grade.single_thread()
    for k in katas:
        grade.checks_for(k.id)
        if public.active(k.id):
            public.load(k.id)
        elif grade.gradable(k):
            grade.context(k, targets.reference(k), "cpu")  # the reference and the mistake catalogue


_PRIMED: set[str] = set()


def prime(k: manifest.Kata) -> None:
    """Run ``k``'s checks once here on the reference, and list the inputs a diagnosis draws, so that
    every child forked later finds them done (a fork forgets what its children computed)."""
    from grader import grade
    from grader.engine import diagnosis, run_check, targets
    from grader.public_record import public

    if k.id in _PRIMED or public.active(k.id) or not grade.gradable(k):
        return
    _PRIMED.add(k.id)
    ctx, _ = grade.context(k, targets.reference(k), grade.pick_device("cpu"))
    for check in grade.checks_for(k.id):
        run_check(check, ctx, (), None)
        for site in diagnosis.sites(check, ctx):
            diagnosis.drawn(ctx, check, site)


# -- what the learner sees --------------------------------------------------------------------
class Verdict:
    """Shows a grading's events as they come: the first failing check in full, every further failing check
    in one line, the first one's diagnosis once it is known (headed by that check's title when other lines
    came between), the checks not run once, then the board line."""

    def __init__(self, k: manifest.Kata, first: str | None, say):
        from grader import checks

        self.kata, self.first, self.say = k, first, say
        self.by_id = {c.id: c for c in checks.for_kata(k.id).all}
        self.results: dict[str, object] = {}
        self.shown: str | None = None  # the failing check shown in full
        self.grouped: dict[str, int] = {}  # one line, at the end, for the checks with the same message
        self.said_since = 0  # lines said since the failing check shown in full (its diagnosis comes later)

    def show(self, event: dict) -> None:
        from grader.engine import Result

        kind, check = event.get("event"), self.by_id.get(event.get("check"))
        if kind not in ("result", "explained") or check is None:
            return
        r = Result(check, event["status"], event["message"], event["diagnoses"], event["seconds"])
        before, self.results[check.id] = self.results.get(check.id), r
        if kind == "explained":
            extra = [line.strip() for line in (r.message[len(before.message):] if before is not None
                                               else r.message).splitlines() if line.strip()]
            if extra and self.said_since:  # other lines came between: say which check it belongs to
                self.say(f"  {render.mark(r.status)} {check.title} (shown in full above):")
            if extra:
                self.say("\n".join("      " + line for line in extra))
            self.said_since = 0
        elif r.status == "pass":
            if check.id == self.first:
                self.say(f"  ✓ {check.title} — passes now")
                self.said_since += 1
        elif r.status in ("not-run", "not-implemented"):
            self.grouped[r.message] = self.grouped.get(r.message, 0) + 1
        elif self.shown is None:
            self.shown, self.said_since = check.id, 0
            self.say("\n".join("  " + line for line in render.result_lines([r])))
        elif r.message == self.results[self.shown].message:  # a file that would not load, say
            same = f"fail the same way: {r.message.splitlines()[0]}"
            self.grouped[same] = self.grouped.get(same, 0) + 1
        else:
            self.say("  " + render.result_lines([r], verbose=False)[0])
            self.said_since += 1

    def finish(self, seconds: float) -> list:
        """The board line; the results in the kata's order."""
        from grader import grade

        for reason, n in self.grouped.items():
            self.say(f"  · {n} {'more ' if reason.startswith('fail the same') else ''}check(s) {reason}")
        results = [self.results[c.id] for c in grade.checks_for(self.kata.id) if c.id in self.results]
        self.say(f"[{time.strftime('%H:%M:%S')}] {grade.summary(self.kata, results)}  ({seconds:.2f} s)")
        if sum(not r.passed and r.status != "not-run" for r in results) > 1:
            self.say(f"  `kvkata check {self.kata.id}` shows every failing check's message")
        return results


def last_failed(k: manifest.Kata) -> str | None:
    """The first check of ``k`` that did not pass in the latest results on the board."""
    saved = learner.saved_results().get(k.id, {}).get("checks")
    if not isinstance(saved, dict):
        return None
    return next((cid for cid, entry in saved.items() if isinstance(entry, dict) and entry.get("status") != "pass"), None)


def next_pending(katas: list[manifest.Kata], after: manifest.Kata | None = None) -> manifest.Kata | None:
    """The first kata whose latest results do not all pass: from the start, or the ones after
    ``after`` (then round to the ones before it)."""
    saved = learner.saved_results()
    order = katas if after is None else [k for k in katas if k.id > after.id] + [k for k in katas if k.id < after.id]
    for k in order:
        entry = saved.get(k.id, {})
        if not (entry.get("total") and entry.get("passed") == entry.get("total")):
            return k
    return None


# -- the loop ---------------------------------------------------------------------------------
def run(kata_id: str | None, poll: bool, interval: float, seed: int, timeout: float, say=print) -> int:
    """Watch until Ctrl-C. Grading runs on the CPU: the checks' tensors are tiny, and a CUDA context
    cannot be shared with forked children (``kvkata check NN --device cuda`` grades on a GPU)."""
    from grader import grade

    katas = [k for k in manifest.load().values() if grade.gradable(k)]
    if not katas:
        raise UsageError("no kata can be graded here (no reference solutions, no public records): your instructor "
                         "grades your work")
    current = learner.kata(kata_id) if kata_id else (next_pending(katas) or katas[0])
    warm_up(katas)
    files = {manifest.REPO_ROOT / k.stub: k for k in katas}
    watcher = changes.Watcher(list(files), poll=poll, interval=interval)
    say(f"watching {len(files)} kata files ({watcher.mode}); now: kata {current.id}, edit {current.stub}. "
        "Ctrl-C to stop.")
    session = Session(katas, files, watcher, seed, timeout, say)
    try:
        pending = [current]
        while True:
            while pending:
                k = pending.pop(0)
                moved_on, newer = session.grade(k)
                pending = list(dict.fromkeys(newer + pending))
                current = moved_on or current
            pending = list(dict.fromkeys(files[path] for path in watcher.wait()))
    except KeyboardInterrupt:
        say("\nstopped watching; `kvkata` shows the board.")
        return 0
    finally:
        session.stop()
        watcher.close()


class Session:
    """The watcher's gradings, one at a time, each cancelled when a newer save arrives."""

    def __init__(self, katas, files, watcher, seed: int, timeout: float, say):
        self.katas, self.files, self.watcher = katas, files, watcher
        self.seed, self.timeout, self.say = seed, timeout, say
        self.first: dict[str, str | None] = {}  # kata id -> the check that failed last
        self.live: live.Grading | None = None

    def grade(self, k: manifest.Kata) -> tuple[manifest.Kata | None, list[manifest.Kata]]:
        """Grade ``k`` and show it: (the kata to move on to when it passes, katas saved meanwhile)."""
        self.say(f"grading kata {k.id}…")
        prime(k)
        first = self.first[k.id] if k.id in self.first else last_failed(k)
        grading = self.live = live.Grading(k, self.seed, self.timeout, first)
        verdict, saved, overran = Verdict(k, first, self.say), [], None
        while grading.ended is None:
            notify = self.watcher.fileno()
            select.select([grading.fd] + ([notify] if notify is not None else []), [], [], TICK)
            for event in grading.events():
                verdict.show(event)
            saved = list(dict.fromkeys(saved + [self.files[path] for path in self.watcher.wait(0)]))
            if k in saved:  # this file again: its grading is out of date
                grading.cancel()
                self.say(f"  (saved again: this grading of kata {k.id} is cancelled)")
                self.live = None
                return None, [k] + [other for other in saved if other is not k]
            if grading.overdue():
                grading.cancel()
                overran = OVERDUE.format(check=verdict.by_id[grading.running].title, seconds=self.timeout)
        self.live = None
        return self._finish(k, grading, verdict, overran), saved

    def _finish(self, k, grading, verdict, overran: str | None) -> manifest.Kata | None:
        seconds = time.monotonic() - grading.started
        if grading.ended != "done":
            why = overran or f"your code ended the grading process ({grading.ended})"
            self.say(f"[{time.strftime('%H:%M:%S')}] kata {k.id} · {k.title}: not graded — {why}")
            return None
        results = verdict.finish(seconds)
        failing = [r for r in results if not r.passed]
        if failing:
            self.first[k.id] = verdict.shown or failing[0].check.id
        learner.save_results(k, results, "cpu")
        if failing:
            return None
        following = next_pending(self.katas, k)
        self.say(f"  kata {k.id} passes. " + (f"Next: kata {following.id} — {following.title}: edit {following.stub}"
                                               if following else "Every kata passes."))
        return following

    def stop(self) -> None:
        if self.live is not None:
            self.live.cancel()
