"""Interview practice: a timed session on a fresh copy of a kata, its submission, the follow-up
questions, a quiz of the numeric ones, and the history of past sessions.

The open session is one JSON file in the state folder (``session.json``), written atomically, so
it survives a crash or a closed terminal; its work lives in ``sessions/<id>/``, never in ``katas/``.
"""
from __future__ import annotations

import math
import random
import re
import sys
import time
from pathlib import Path

from grader import manifest, render, state
from grader.learner import tools as learner
from grader.errors import UsageError
from grader.stubs import pristine_stub

SESSION = state.SESSION
HISTORY = "history.json"
FOLDER = "sessions"
NUMBER = re.compile(r"[-+]?(?:\d[\d_,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
TRIES = 3  # times an answer holding no readable number is asked for
TYPO = ("{line!r} is not {what} I can read (write a number like 12345 or 12,345, units after it are fine; "
        "several separated by spaces or \", \"): try again")


def _path(name: str) -> Path:
    return state.state_dir() / name


def current() -> dict | None:
    """The open session, or None; a session file of the wrong shape is set aside with a warning."""
    session = state.read_json(_path(SESSION), None)
    if session is None:
        return None
    if not isinstance(session, dict) or not {"id", "kata", "file", "started_epoch", "minutes"} <= session.keys():
        aside = _path(SESSION).with_name(f"{SESSION}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        _path(SESSION).replace(aside)
        print(f"kvkata: {_path(SESSION)} did not describe a session; moved it to {aside}", file=sys.stderr)
        return None
    return session


def history() -> list[dict]:
    entries = state.read_json(_path(HISTORY), [])
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _append_history(entry: dict) -> None:
    entries = [e for e in history() if e.get("id") != entry["id"]]
    state.write_json(_path(HISTORY), entries + [entry])


def passed(k: manifest.Kata) -> bool:
    """Whether an interview session on ``k`` passed every check."""
    return any(e.get("kata") == k.id and e.get("total") and e.get("passed") == e.get("total") for e in history())


# -- starting -------------------------------------------------------------------------------
def pick(kata_id: str | None, level: int | None, rng: random.Random | None = None) -> manifest.Kata:
    """The kata asked for, or one of the level practised least so far (ties drawn at random)."""
    if kata_id is not None:
        return learner.kata(kata_id)
    katas = [k for k in manifest.load().values() if level is None or k.level == level]
    if not katas:
        levels = sorted({k.level for k in manifest.load().values()})
        raise UsageError(f"no kata has level {level}; levels: {', '.join(map(str, levels))}")
    done = [e.get("kata") for e in history()]
    fewest = min(done.count(k.id) for k in katas)
    return (rng or random.Random()).choice([k for k in katas if done.count(k.id) == fewest])


def start(k: manifest.Kata, minutes: int | None, abandon: bool) -> str:
    """Open a session on a fresh stub of ``k``; the brief to print."""
    open_session = current()
    if open_session and not abandon:
        raise UsageError(f"an interview session is open (kata {open_session['kata']}, started "
                         f"{open_session.get('started', '?')}, {time_left(open_session)}): finish it with "
                         "`kvkata submit`, or start a new one with `kvkata interview ... --abandon`")
    if minutes is not None and minutes <= 0:
        raise UsageError(f"--minutes: expected a positive number of minutes, got {minutes}")
    stub, _ = pristine_stub(k)
    notes = [_abandon(open_session)] if open_session else []
    now = time.time()
    session_id = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f"-{k.id}"
    folder = _path(FOLDER) / session_id
    while folder.exists():
        session_id += "x"
        folder = _path(FOLDER) / session_id
    state.write_atomic(folder / k.file, stub.encode("utf-8"))
    readme = manifest.REPO_ROOT / k.readme
    if readme.is_file():
        text = session_readme(readme.read_text(encoding="utf-8"), folder / k.file)
        state.write_atomic(folder / "README.md", text.encode("utf-8"))
    session = {"id": session_id, "kata": k.id, "dir": str(folder), "file": str(folder / k.file),
               "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)), "started_epoch": now,
               "minutes": minutes or k.minutes, "hints_used": 0}
    state.write_json(_path(SESSION), session)
    return "\n".join(notes + [brief(k, session)])


def session_readme(text: str, file: Path) -> str:
    """The kata's README for a session: its commands grade the session's file, not ``katas/NN``."""
    run = ("```bash\n"
           f"kvkata check               # grade your file, {file}; the session stays open\n"
           "kvkata hint                # a nudge when stuck (counted in the session)\n"
           "kvkata submit              # grade it a last time, record the time, close the session\n"
           "```")
    text = re.sub(r"(?ms)(^## Run it\s*\n\s*)```.*?```", lambda m: m.group(1) + run, text, count=1)
    note = (f"> Interview session: your file is `{file}`. `kvkata check` grades it and shows the time "
            "left; `kvkata submit` ends the session.\n\n")
    head, _, rest = text.partition("\n")
    return f"{head}\n\n{note}{rest.lstrip()}" if head.startswith("# ") else note + text


def time_left(session: dict, now: float | None = None) -> str:
    """``12:34 left of 30:00``, or ``3:05 over the 30:00`` once the time is up."""
    limit = 60 * float(session["minutes"])
    left = float(session["started_epoch"]) + limit - (time.time() if now is None else now)
    whole = f"{int(limit // 60)}:{int(limit % 60):02d}"
    seconds = int(abs(left))
    return (f"{seconds // 60}:{seconds % 60:02d} left of {whole}" if left >= 0
            else f"{seconds // 60}:{seconds % 60:02d} over the {whole}")


def check(session: dict, device: str = "cpu", seed: int = 0, timeout: float | None = None) -> tuple[str, int]:
    """Grade the open session's file without closing the session; the text to print and the exit code."""
    from grader import grade

    k = learner.kata(session["kata"])
    results = learner.grade_file(k, session["file"], device=device, seed=seed, timeout=timeout)
    lines = [f"interview session {session['id']} · kata {k.id} · {session['file']}"]
    lines += render.result_lines(results) + ["", grade.summary(k, results),
                                              f"time: {time_left(session)} — finish with `kvkata submit`"]
    return "\n".join(lines), int(not all(r.passed for r in results))


def _abandon(session: dict) -> str:
    entry = _entry(session, None, time.time())
    entry["status"] = "abandoned"
    _append_history(entry)
    _path(SESSION).unlink(missing_ok=True)
    return f"abandoned the session on kata {session['kata']} (its files stay in {session.get('dir')})\n"


def brief(k: manifest.Kata, session: dict) -> str:
    deadline = time.localtime(session["started_epoch"] + 60 * session["minutes"])
    tasks = "\n".join(f"  {n}. {', '.join(task)}" for n, task in enumerate(k.tasks, start=1))
    return (f"interview session {session['id']}\n"
            f"kata {k.id} · {k.title} · level {k.level}\n"
            f"time: {session['minutes']} min — deadline {time.strftime('%H:%M:%S', deadline)}\n\n"
            f"{_goal(Path(session['dir']) / 'README.md')}tasks:\n{tasks}\n\n"
            f"the brief:         {Path(session['dir']) / 'README.md'}\n"
            f"edit this file:    {session['file']}\n"
            f"check it:          kvkata check       (as often as you like; it shows the time left)\n"
            f"when you are done: kvkata submit      (a hint, counted: kvkata hint)")


def _goal(readme: Path) -> str:
    """The README's Goal section, if there is one."""
    if not readme.is_file():
        return ""
    match = re.search(r"^## Goal\s*\n(.*?)(?=^## |\Z)", readme.read_text(encoding="utf-8"), re.S | re.M)
    return match.group(1).strip() + "\n\n" if match else ""


# -- during and after -----------------------------------------------------------------------
def require() -> dict:
    session = current()
    if session is None:
        raise UsageError("no interview session is open; start one with `kvkata interview --kata NN` "
                         "(or --level N)")
    return session


def use_hint(session: dict, show_all: bool) -> str:
    k = learner.kata(session["kata"])
    text, session["hints_used"] = learner.next_hint(k, int(session.get("hints_used", 0)), show_all)
    state.write_json(_path(SESSION), session)
    return f"{text}\n(interview session: {session['hints_used']} hint(s) used)"


def _entry(session: dict, results, now: float) -> dict:
    elapsed = now - float(session["started_epoch"])
    over = max(0.0, elapsed - 60 * float(session["minutes"]))
    return {"id": session["id"], "kata": session["kata"], "started": session.get("started"),
            "minutes": session["minutes"], "elapsed_s": round(elapsed, 1),
            "passed": None if results is None else sum(r.passed for r in results),
            "total": None if results is None else len(results),
            "hints_used": int(session.get("hints_used", 0)), "overtime": over > 0, "overtime_s": round(over, 1),
            "dir": session.get("dir"), "status": "submitted",
            "checks": None if results is None else {r.check.id: r.status for r in results}}


def submit(device: str = "cpu", timeout: float | None = None) -> tuple[str, int]:
    """Grade the open session's file, record it in the history, close the session."""
    session = require()
    k = learner.kata(session["kata"])
    results = learner.grade_file(k, session["file"], device=device, timeout=timeout)
    entry = _entry(session, results, time.time())
    _append_history(entry)  # first the record, then closing: a crash in between loses nothing
    _path(SESSION).unlink(missing_ok=True)
    from grader import grade  # here, not at the top: grading imports torch, and `kvkata` starts without it

    minutes, seconds = divmod(int(entry["elapsed_s"]), 60)
    timing = f"time: {minutes}:{seconds:02d} of {session['minutes']}:00"
    if entry["overtime"]:
        timing += f" — {int(entry['overtime_s'] // 60)}:{int(entry['overtime_s'] % 60):02d} over"
    lines = render.result_lines(results) + ["", grade.summary(k, results), timing,
                                             f"hints used: {entry['hints_used']}", "", followups(k)]
    return "\n".join(lines), 0 if entry["passed"] == entry["total"] else 1


def followups(k: manifest.Kata) -> str:
    if not k.followups:
        return f"kata {k.id} has no follow-up questions."
    lines = ["follow-up questions an interviewer would ask next:"]
    for n, f in enumerate(k.followups, start=1):
        lines.append(f"  {n}. {f.question}" + ("" if not f.values else "  [numeric]" if len(f.values) == 1
                                                  else f"  [numeric: {len(f.values)} numbers]"))
    lines.append(f"check the numeric ones with `kvkata quiz {k.id}`; all answers: `kvkata quiz {k.id} --answers`")
    return "\n".join(lines)


# -- quiz and history -----------------------------------------------------------------------
def parse_number(text: str) -> float | None:
    """The one number of an answer, or None when it is a typo to ask about again: no number,
    several, or a malformed one ("122,53"). Units and words around it are fine ("0.5 GiB"), and so
    are thousands separators, commas or underscores in groups of three ("12,345")."""
    numbers = parse_numbers(text, 1)
    return numbers[0] if numbers else None


def parse_numbers(text: str, count: int) -> list[float] | None:
    """The ``count`` numbers of an answer in order, or None when it is a typo to ask about again: another
    count of numbers, or a malformed one. Units and words around them are fine ("0.5 GiB and 2 GiB")."""
    found = [m.group(0).rstrip(",_") for m in NUMBER.finditer(text or "")]
    if len(found) != count:
        return None
    numbers = []
    for number in found:
        head = re.match(r"[-+]?([\d,_]*)", number).group(1)
        if not re.fullmatch(r"\d*|\d{1,3}(,\d{3})+|\d{1,3}(_\d{3})+", head):
            return None
        try:
            numbers.append(float(number.replace(",", "").replace("_", "")))
        except ValueError:
            return None
    return numbers


def right(f: manifest.FollowUp, answer) -> bool:
    """Whether ``answer`` (the numbers given, in order; one number alone is accepted) is every number asked."""
    answer = [answer] if isinstance(answer, (int, float)) else answer
    if answer is None or len(answer) != len(f.values):
        return False
    if f.tolerance:
        return all(abs(a - v) <= f.tolerance * abs(v) for a, v in zip(answer, f.values))
    return all(math.isclose(a, v, rel_tol=1e-9, abs_tol=1e-12) for a, v in zip(answer, f.values))


def _answer(ask, say, prompt: str, count: int = 1) -> tuple[str | None, list[float] | None]:
    """(the line, its ``count`` numbers): a line that does not hold that many readable numbers is asked
    again, up to ``TRIES`` times in all; (None, None) when the input ends."""
    what = "one number" if count == 1 else f"{count} numbers"
    line = ask(prompt)
    for _ in range(TRIES - 1):
        if line is None or parse_numbers(line, count) is not None:
            break
        say(TYPO.format(line=line.strip(), what=what))
        line = ask("> ")
    return line, (None if line is None else parse_numbers(line, count))


def quiz(k: manifest.Kata, ask, say) -> int:
    """Ask the numeric follow-ups of ``k``: ``ask(prompt)`` returns a line or None (no more input),
    ``say(text)`` prints. An answer that is not one readable number is asked again, not marked
    wrong; a wrong number is wrong. Returns 0 when every answer is right."""
    numeric = [f for f in k.followups if f.value is not None]
    if not numeric:
        say(f"kata {k.id} has no numeric follow-up questions.\n{followups(k)}")
        return 0
    score = 0
    for n, f in enumerate(numeric, start=1):
        asked = "" if len(f.values) == 1 else f" ({len(f.values)} numbers, in the order asked)"
        line, answer = _answer(ask, say, f"question {n} of {len(numeric)}: {f.question}{asked}\n> ", len(f.values))
        score += right(f, answer)
        if line is None:
            verdict = "no answer"
        elif answer is None:
            verdict = f"no number in {line.strip()!r}" if len(f.values) == 1 else \
                f"not {len(f.values)} numbers in {line.strip()!r}"
        else:
            verdict = "right" if right(f, answer) else f"not quite (you said {line.strip()!r})"
        say(f"{verdict}. {f.answer}\n")
    say(f"{score} of {len(numeric)} right.")
    return 0 if score == len(numeric) else 1


def answers(k: manifest.Kata) -> str:
    return "\n\n".join(f"{n}. {f.question}\n   {f.answer}" for n, f in enumerate(k.followups, start=1)) or \
        f"kata {k.id} has no follow-up questions."


def history_table() -> str:
    entries = history()
    if not entries:
        return "no interview sessions yet: start one with `kvkata interview --level 1`"
    lines = [f"{'started':<19}  {'kata':<4}  {'limit':>5}  {'time':>6}  {'checks':>6}  {'hints':>5}  "
             f"{'overtime':>8}  status"]
    for e in entries:
        elapsed = int(e.get("elapsed_s") or 0)
        checks = "-" if e.get("total") is None else f"{e.get('passed')}/{e.get('total')}"
        over = int(e.get("overtime_s") or 0)
        lines.append(f"{str(e.get('started', '?')).replace('T', ' '):<19}  {e.get('kata', '?'):<4}  "
                     f"{str(e.get('minutes', '?')) + 'm':>5}  {elapsed // 60:>3}:{elapsed % 60:02d}  {checks:>6}  "
                     f"{e.get('hints_used', 0):>5}  {(f'+{over // 60}:{over % 60:02d}' if e.get('overtime') else '-'):>8}  "
                     f"{e.get('status', 'submitted')}")
    return "\n".join(lines)
