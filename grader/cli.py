"""The ``kvkata`` command: the board, and the learner's, the candidate's and the instructor's tools.

    kvkata                        the board: every kata by level, your latest results, the next step
    kvkata check [NN]             grade one kata (or all) like ``pytest katas/NN``; updates the board
                                  (in an interview session: the session's file, and the time left)
    kvkata watch [NN]             re-grade a kata each time you save its file (grader.learner.watch)
    kvkata hint NN [--all]        the next hint of a kata's ladder
    kvkata reset NN | --all       put the untouched stub back (your file is backed up first)
    kvkata solution NN [--force]  the diff from stub to reference, once the kata passes
    kvkata interview / submit / quiz / history     timed interview practice (grader.learner.sessions)
    kvkata assign / grade         handouts and isolated grading of a cohort (grader.classroom)
    kvkata autograder             a Gradescope autograder zip for a level (grader.classroom.autograder)
    kvkata model / generate       a real model (SmolLM2) and your kata 08 loop on it (grader.models)

Errors in how it is called print one line and exit with 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from grader import manifest, render, state
from grader.learner import tools as learner
from grader.learner import sessions, watch
from grader.public_record import records
from grader.errors import UsageError

DELEGATED = {"bench": "grader.bench.suite", "notebooks": "grader.learner.notebooks",  # subcommands with their own parser
             "generate": "grader.learner.playground", "model": "grader.models"}


# -- the board ------------------------------------------------------------------------------
def _progress(saved: dict | None) -> str:
    if not saved or not isinstance(saved.get("total"), int) or not isinstance(saved.get("passed"), int):
        return "not started"
    done = saved["total"] and saved["passed"] == saved["total"]
    return f"{saved['passed']}/{saved['total']} checks" + (" ✓" if done else "")


def _notebook(saved: dict | None) -> str:
    """The latest check cell of the kata's notebook, named as such; empty when there is none."""
    progress = _progress(saved)
    return "" if progress == "not started" else f"   (notebook: {progress.replace(' checks', '')})"


def board() -> str:
    """Every kata with the latest grading of its file; a notebook's check cell is shown apart."""
    results, katas = learner.saved_results(), list(manifest.load().values())
    notebooks = learner.saved_results(state.NOTEBOOK_RESULTS)
    names = manifest.levels()
    lines = ["KV-cache katas (checks of your files, katas/NN; notebooks apart)" if notebooks else "KV-cache katas"]
    width = max(len(k.title) for k in katas)  # every row's columns line up, the longest title's too
    for level in sorted({k.level for k in katas}):
        lines.append(f"\nlevel {level} · {names.get(level, '')}".rstrip(" ·"))
        for k in (k for k in katas if k.level == level):
            lines.append(f"  {k.id}  {k.title:<{width}} {k.minutes:>3} min   {_progress(results.get(k.id))}"
                         + _notebook(notebooks.get(k.id)))
    pending = [k for k in katas if not _progress(results.get(k.id)).endswith("✓")]
    if pending:
        k = pending[0]
        head = f"next: kata {k.id} — {k.title}: read {k.readme}, edit {k.stub}"
        if records.gradable(k):
            lines += ["", head + ", then run", f"  pytest katas/{k.id}"]
        else:
            lines += ["", head, "  (this copy cannot grade it: hand in katas/ to your instructor, see README.md)"]
    else:
        lines += ["", "every kata passes. Practise under time: kvkata interview --level 2"]
    session = sessions.current()
    if session:
        lines += ["", f"interview session open on kata {session['kata']} ({session['file']}), "
                  f"{sessions.time_left(session)}: kvkata check, then kvkata submit"]
    return "\n".join(lines)


# -- commands -------------------------------------------------------------------------------
def cmd_board(args) -> int:
    print(board())
    return 0


def cmd_check(args) -> int:
    from grader import grade  # here, not at the top: grading imports torch, and `kvkata` starts without it

    session = sessions.current()
    if session and (args.kata is None or learner.kata(args.kata).id == session["kata"]):
        text, code = sessions.check(session, args.device, args.seed, args.timeout)  # the board is not touched
        print(text)
        return code
    katas = [learner.kata(args.kata)] if args.kata else list(manifest.load().values())
    code, lines = 0, []
    for k in katas:
        try:
            results = learner.grade_file(k, "stub", args.device, args.seed, args.timeout)
        except UsageError as exc:
            if args.kata:
                raise
            print(f"kata {k.id}: not graded — {exc}\n")
            lines.append(f"- kata {k.id} {k.title}: not graded ({exc})")
            continue
        print(f"kata {k.id} · {k.title} · {k.stub}")
        if grade.public_header(k):
            print(grade.public_header(k))
        print("\n".join(render.result_lines(results, verbose=bool(args.kata))))
        print(grade.summary(k, results) + "\n")
        learner.save_results(k, results, args.device)
        lines.append(learner.summary_line(k, results))
        code = code or int(not all(r.passed for r in results))
    if args.summary:
        learner.append_summary(args.summary, lines)
    if not args.kata:
        print(board())
    return code


def cmd_watch(args) -> int:
    if args.interval <= 0 or (args.timeout is not None and args.timeout <= 0):
        raise UsageError("--interval and --timeout must be positive")
    return watch.run(args.kata, args.poll, args.interval, args.seed, args.timeout or watch.CHECK_TIMEOUT)


def cmd_hint(args) -> int:
    session = sessions.current()
    if args.kata is None and session is None:
        raise UsageError("which kata? e.g. `kvkata hint 01`")
    if session and (args.kata is None or learner.kata(args.kata).id == session["kata"]):
        print(sessions.use_hint(session, args.all))
    else:
        print(learner.hint(learner.kata(args.kata), args.all))
    return 0


def cmd_reset(args) -> int:
    if args.all == (args.kata is not None):
        raise UsageError("reset one kata (`kvkata reset NN`) or every kata (`kvkata reset --all`)")
    katas = list(manifest.load().values()) if args.all else [learner.kata(args.kata)]
    code = 0
    for k in katas:
        try:
            print("\n".join(learner.reset(k)))
        except UsageError as exc:
            if not args.all:
                raise
            print(f"kata {k.id}: not reset — {exc}", file=sys.stderr)
            code = 1
    return code


def cmd_solution(args) -> int:
    k = learner.kata(args.kata)
    print(learner.solution_diff(k, args.force or learner.passed(k) or sessions.passed(k)), end="")
    return 0


def cmd_interview(args) -> int:
    print(sessions.start(sessions.pick(args.kata, args.level), args.minutes, args.abandon))
    return 0


def cmd_submit(args) -> int:
    text, code = sessions.submit(args.device, args.timeout)
    print(text)
    return code


def cmd_quiz(args) -> int:
    if args.kata is None:
        session, past = sessions.current(), sessions.history()
        if not session and not past:
            raise UsageError("which kata? e.g. `kvkata quiz 01`")
        args.kata = session["kata"] if session else past[-1]["kata"]
    k = learner.kata(args.kata)
    if args.answers:
        print(sessions.answers(k))
        return 0

    def ask(prompt: str):
        print(prompt, end="", flush=True)
        line = sys.stdin.readline()
        if line and not sys.stdin.isatty():
            print(line.rstrip("\n"))  # show what was read, as a terminal would
        return line if line else None

    return sessions.quiz(k, ask, print)


def cmd_history(args) -> int:
    print(json.dumps(sessions.history(), indent=2) if args.json else sessions.history_table())
    return 0


def cmd_assign(args) -> int:
    from grader.classroom import handouts  # here: the classroom's commands load what grading needs

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    print(handouts.assign(args.level, args.out, args.only, args.force, ci=not args.no_ci, say=say))
    return 0


def cmd_grade(args) -> int:
    from grader.classroom.cohort import sandbox as cohort  # here: the classroom's commands load what grading needs
    from grader.classroom.cohort import grading

    if args.jobs < 1 or args.timeout <= 0 or (args.memory is not None and args.memory < 256) or \
            (args.check_timeout is not None and args.check_timeout <= 0):
        raise UsageError("-j must be at least 1, --timeout and --check-timeout positive and --memory at least 256 (MB)")
    settings = cohort.Settings(device=args.device, seed=args.seed, timeout=args.timeout, memory_mb=args.memory,
                               jobs=args.jobs, check_timeout=args.check_timeout)
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    print(grading.grade(args.submissions, settings, args.level, args.only, args.report, args.json, args.junit, progress))
    return 0


def cmd_autograder(args) -> int:
    from grader.classroom import autograder  # here: the classroom's commands load what grading needs

    if args.timeout <= 0 or args.memory < 256:
        raise UsageError("--timeout must be positive and --memory at least 256 (MB)")
    print(autograder.build(args.level, args.out, args.only, args.visibility, args.stdout_visibility,
                           args.timeout, args.memory))
    return 0


# -- the parser -----------------------------------------------------------------------------
def _grading_options(c, device: str = "auto") -> None:
    c.add_argument("--device", default=device, help=f"auto, cpu or cuda (default {device})")
    c.add_argument("--timeout", type=float, default=None, help="seconds one check may run (default 60)")


def _learner_commands(command) -> None:
    command("board", cmd_board, "the board: every kata, your latest results, the next step")
    c = command("check", cmd_check, "grade one kata (or every kata) and update the board; while an interview "
                "session is open, grade the session's file instead")
    c.add_argument("kata", nargs="?", help="kata id, e.g. 01; none: every kata (or the open session's)")
    c.add_argument("--seed", type=int, default=0, help="seed of the checks' random inputs (default 0)")
    c.add_argument("--summary", metavar="FILE.md", help="also append one Markdown line per kata to FILE.md "
                   "(a CI job summary, e.g. $GITHUB_STEP_SUMMARY)")
    _grading_options(c)
    c = command("watch", cmd_watch, "re-grade a kata each time you save its file; moves on when it passes")
    c.add_argument("kata", nargs="?", help="kata id to start with (default: the first that does not pass)")
    c.add_argument("--poll", action="store_true", help="poll the files instead of using file notifications")
    c.add_argument("--interval", type=float, default=0.2, help="seconds between polls (default 0.2)")
    c.add_argument("--seed", type=int, default=0, help="seed of the checks' random inputs (default 0)")
    c.add_argument("--timeout", type=float, default=None,
                   help="seconds one check may run (default 10; the first check that hangs stops that grading, "
                        "the watcher goes on)")
    c = command("hint", cmd_hint, "the next hint of a kata (counted in an open interview session)")
    c.add_argument("kata", nargs="?", help="kata id, e.g. 03 (default: the open session's kata)")
    c.add_argument("--all", action="store_true", help="every hint of the kata")
    c = command("reset", cmd_reset, "restore a kata's untouched stub; your file is backed up first")
    c.add_argument("kata", nargs="?", help="kata id, e.g. 03")
    c.add_argument("--all", action="store_true", help="every kata")
    c = command("solution", cmd_solution, "the diff from the stub to the reference, once the kata passes")
    c.add_argument("kata", help="kata id, e.g. 03")
    c.add_argument("--force", action="store_true", help="show it even though the kata does not pass yet")


def _interview_commands(command) -> None:
    c = command("interview", cmd_interview, "start a timed session on a fresh copy of a kata")
    which = c.add_mutually_exclusive_group()
    which.add_argument("--kata", help="the kata to practise, e.g. 06")
    which.add_argument("--level", type=int, help="a kata of this level, the one practised least so far "
                       "(default: any level)")
    c.add_argument("--minutes", type=int, help="time limit (default: the kata's minutes)")
    c.add_argument("--abandon", action="store_true", help="abandon the open session first")
    _grading_options(command("submit", cmd_submit, "grade the open interview session and close it"))
    c = command("quiz", cmd_quiz, "the numeric follow-up questions of a kata, answered on stdin")
    c.add_argument("kata", nargs="?", help="kata id, e.g. 04 (default: the open or the last session's kata)")
    c.add_argument("--answers", action="store_true", help="print every question with its answer")
    c = command("history", cmd_history, "past interview sessions")
    c.add_argument("--json", action="store_true", help="a JSON list of objects instead of a table")


def _classroom_commands(command) -> None:
    c = command("assign", cmd_assign, "make a handout of a level's katas, without solutions")
    c.add_argument("--level", type=int, required=True, help="the handout's katas: this level and the ones below")
    c.add_argument("--only", action="store_true", help="only that level, not the ones below")
    c.add_argument("--out", help="folder to write (default handout-levelN)")
    c.add_argument("--force", action="store_true", help="replace the folder if it exists")
    c.add_argument("--no-ci", action="store_true", help="leave out the GitHub Classroom workflow (.github/workflows)")
    c = command("grade", cmd_grade, "grade submissions (folders holding katas/NN/<file>), each isolated")
    c.add_argument("submissions", nargs="+", metavar="SUBMISSION", help="a folder holding katas/NN/<file>")
    c.add_argument("--level", type=int, help="grade the katas of this level and below (default: those submitted)")
    c.add_argument("--only", action="store_true", help="with --level: that level only")
    c.add_argument("--report", metavar="FILE.csv", help="one row per submission × kata")
    c.add_argument("--json", metavar="FILE", help="every row with every check's result")
    c.add_argument("--junit", metavar="FILE", help="JUnit XML, a test case per kata × check")
    c.add_argument("-j", "--jobs", type=int, default=min(4, os.cpu_count() or 1), help="workers at a time")
    c.add_argument("--timeout", type=float, default=60.0, help="seconds a submission × kata may run once the grader has started (default 60)")
    c.add_argument("--check-timeout", type=float, default=None,
                   help="seconds one check may run (default: half of --timeout); a check that hangs fails alone, "
                        "the checks that call the function that hung are not run, the others are")
    c.add_argument("--memory", type=int, default=4096,
                   help="MB the submission's code may allocate beyond the grader's own (default 4096; "
                   "on CUDA the device memory too)")
    c.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    c.add_argument("--seed", type=int, default=0, help="seed of the checks' random inputs (default 0, as "
                   "`pytest katas/NN`)")
    c.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    c = command("autograder", cmd_autograder, "write a Gradescope autograder (a zip) for a level's katas")
    c.add_argument("--level", type=int, required=True, help="its katas: this level and the ones below")
    c.add_argument("--only", action="store_true", help="that level only (default: it and the levels below)")
    c.add_argument("--out", default="autograder.zip", help="the zip to write (default autograder.zip)")
    c.add_argument("--visibility", default="visible", help="when students see the test results: visible (default), "
                   "hidden, after_due_date or after_published")
    c.add_argument("--stdout-visibility", default="hidden", help="the same for the autograder's own output "
                   "(default hidden)")
    c.add_argument("--timeout", type=float, default=60.0, help="seconds a kata may run (default 60)")
    c.add_argument("--memory", type=int, default=4096, help="MB the submission's code may allocate (default 4096)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvkata", description="KV-cache katas: the board, hints, interview practice "
                                "and classroom grading.", epilog="Also: kvkata bench, kvkata notebooks, kvkata generate, kvkata model (see --help of each).")
    p.set_defaults(run=cmd_board)
    sub = p.add_subparsers(title="commands", metavar="COMMAND")

    def command(name, run, help_text):
        c = sub.add_parser(name, help=help_text, description=help_text)
        c.set_defaults(run=run)
        return c

    _learner_commands(command)
    _interview_commands(command)
    _classroom_commands(command)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in DELEGATED:
            return importlib.import_module(DELEGATED[argv[0]]).main(argv[1:])
        args = parser().parse_args(argv)
        return args.run(args)
    except UsageError as exc:
        print(f"kvkata: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvkata: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
