"""State and aliasing programs for kata 13, built on ``support.protocol``: what ``schedule()`` and ``serve``
return is the caller's (SPEC: a later call does not change it, and changing it changes nothing inside),
and two schedulers keep apart.

The scheduler programs replay pinned programs unjudged and return the decisions, so that
``ctx.differential`` compares them with the reference's; ``serve``'s are judged by the caller, tie-aware.
"""
from __future__ import annotations

from types import SimpleNamespace

from grader.checks.k13_programs import CANCEL_PREEMPTED, RECOMPUTE_LONGER, Replay
from grader.checks.support import protocol

HELD_AT = 3  # the schedule() call whose Step the caller holds or overwrites: at or just after a preemption in both
PROGRAMS = {"recompute": RECOMPUTE_LONGER, "cancel": CANCEL_PREEMPTED}


def _until(replay: Replay, ops: list, steps: int) -> list:
    """Run ``ops`` on ``replay`` until it has made ``steps`` schedule() calls; the ops left."""
    for i, op in enumerate(ops):
        if replay.steps >= steps:
            return ops[i:]
        getattr(replay, "do_" + op[0])(*op[1:])
    return []


def _live(step) -> list:
    """The Step's own lists, not copies: what the caller holds or overwrites."""
    return [getattr(step, name, None) for name in ("prefill", "decode", "preempted")]


def _held(program: dict, change: bool):
    """The Step of call HELD_AT, held (or overwritten, ``change``) while the program goes on."""
    def run(api, ex):
        replay, rest = Replay(SimpleNamespace(t=api), program, judge=None), []

        def first(api, ex):
            rest[:] = _until(replay, list(program["ops"]), HELD_AT + 1)
            return _live(replay.last)

        def then(api, ex):
            _until(replay, rest, 10 ** 6)
            return [list(h) for h in replay.history[HELD_AT + 1:]]

        after = f"the schedule() calls after call {HELD_AT}"
        if change:
            return protocol.changed_by_caller(first, then, after=after)(api, ex)
        return protocol.kept(first, then, held=f"the Step of schedule() call {HELD_AT}", after=after)(api, ex)
    return run


def _chunks(ops: list) -> list[list]:
    """The ops cut after each step (the drain alone last)."""
    chunks, current = [], []
    for op in ops:
        current.append(op)
        if op[0] in ("step", "drain"):
            chunks.append(current)
            current = []
    return chunks + ([current] if current else [])


def _interleaved():
    """The two programs on two schedulers, one chunk of each in turn; each chunk's decisions compared."""
    programs = list(PROGRAMS.values())

    def make(api, ex, i):
        return Replay(SimpleNamespace(t=api), programs[i], judge=None), _chunks(list(programs[i]["ops"]))

    def step(api, ex, instance, i, n):
        replay, chunks = instance
        if n >= len(chunks):
            return None
        before = len(replay.history)
        _until(replay, chunks[n], 10 ** 6)
        return [list(h) for h in replay.history[before:]]

    return protocol.interleaved(make, step, steps=max(len(_chunks(p["ops"])) for p in programs))


def scheduler_programs() -> list[tuple[str, object]]:
    """(what, run) for ``ctx.differential``: each pinned program with a Step held, then overwritten, and
    the two interleaved."""
    runs = [(f"the Step of schedule() call {HELD_AT} held while the {name} program goes on", _held(p, change=False))
            for name, p in PROGRAMS.items()]
    runs += [(f"the Step of schedule() call {HELD_AT} overwritten by the caller, then the {name} program goes on",
              _held(p, change=True)) for name, p in PROGRAMS.items()]
    return runs + [("two schedulers driven in turn: the recompute and the cancel programs", _interleaved())]


def serve_programs(serve_a, serve_b) -> list[tuple[str, list[tuple[str, object, str]]]]:
    """``serve_a()`` and ``serve_b()`` (the learner's serve on two sets of requests, a and b) run as a caller
    would: a's tokens overwritten by the caller, then a served again; a's tokens held while b is served;
    a twice. Each program: (what, [(label, result, "a" or "b": whose tokens it must hold)])."""
    a = lambda api, ex: serve_a()  # noqa: E731 — the programs take call(api, ex)
    b = lambda api, ex: serve_b()  # noqa: E731
    runs = [("serve a again after the caller overwrote the tokens a's first serve returned",
             protocol.changed_by_caller(a, a, after="the second serve of a"), "a"),
            ("a's tokens, held while b is served", protocol.kept(a, b, held="a's tokens", after="the serve of b"), "aab"),
            ("serve a twice", protocol.twice(a, what="the serve of a"), "aa")]
    return [(what, [(label, result, whose) for (label, result), whose in zip(run(None, {}).items(), order)])
            for what, run, order in runs]
