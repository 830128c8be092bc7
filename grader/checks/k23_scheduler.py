"""Kata 23's scheduler checks: drawn programs (``k23_programs``) judged step by step against a
plain-Python model of the policy and, apart, by the policy's invariants on its own decisions; bad
input; a Step that belongs to the caller. ``CHECKS`` is the kata's list; ``k23`` adds serve's checks."""
from __future__ import annotations

from grader.checks.k23_programs import PINNED, Replay, large_program, programs
from grader.checks.support.common import expect_value_error
from grader.engine import Checks

CHECKS = Checks("23")
LARGE = large_program(0)


def _replay(judge):
    def body(c, ex):
        Replay(c, ex, judge).run()
    return body


@CHECKS.add("ChunkedScheduler decisions equal the policy's, step by step, through random programs",
            uses="ChunkedScheduler.schedule")
def matches_the_policy(ctx):
    ctx.forall(programs(), _replay("reference"), max_examples=50)
    ctx.forall(programs(blocks=(2, 4), max_ops=30), _replay("reference"), max_examples=25)
    ctx.forall(programs(blocks=(2, 8), max_ops=30, cancels=True), _replay("reference"), max_examples=20)
    ctx.case(LARGE, _replay("reference"))


@CHECKS.add("the invariants hold on the scheduler's own decisions (budget, decodes, chunk starts, cap, blocks, FCFS)",
            uses="ChunkedScheduler.schedule")
def keeps_the_invariants(ctx):
    ctx.forall(programs(blocks=(2, 6), max_ops=30), _replay("invariants"), max_examples=40)
    ctx.forall(programs(blocks=(16, 40), max_ops=30, cancels=True), _replay("invariants"), max_examples=25)
    ctx.case(LARGE, _replay("invariants"))


@CHECKS.add("worked cases: chunks beside a decode, the cap, prefix hits, a preemption that resets the count",
            uses="ChunkedScheduler.schedule")
def worked_cases(ctx):
    for name, program in PINNED.items():
        ctx.case({"case": name, **program}, _replay("reference"))


def _scheduler_cases(S):
    cases = [
        ("ChunkedScheduler(4, 2, 3, 2): budget below max_num_seqs", S, (4, 2, 3, 2), ("max_num_batched_tokens",)),
        ("ChunkedScheduler(0, 2, 1, 8)", S, (0, 2, 1, 8), ("num_blocks",)),
        ("ChunkedScheduler(2.5, 2, 1, 8)", S, (2.5, 2, 1, 8), ("num_blocks",)),
        ("ChunkedScheduler(4, 0, 1, 8)", S, (4, 0, 1, 8), ("block_size",)),
        ("ChunkedScheduler(4, 1.5, 1, 8)", S, (4, 1.5, 1, 8), ("block_size",)),
        ("ChunkedScheduler(4, 2, 0, 8)", S, (4, 2, 0, 8), ("max_num_seqs",)),
        ("ChunkedScheduler(4, 2, 1.5, 8)", S, (4, 2, 1.5, 8), ("max_num_seqs",)),
        ("ChunkedScheduler(4, 2, 1, 8.5)", S, (4, 2, 1, 8.5), ("max_num_batched_tokens",)),
        ("ChunkedScheduler(4, 2, 1, 8, -1): a negative threshold", S, (4, 2, 1, 8, -1),
         ("long_prefill_token_threshold",)),
        ("ChunkedScheduler(4, 2, 1, 8, 1.5)", S, (4, 2, 1, 8, 1.5), ("long_prefill_token_threshold",)),
    ]
    sched = S(4, 2, 2, 3)
    sched.add_request("a", 3, 2)
    cases += [
        ("add_request('a', 2, 2) when 'a' is there", sched.add_request, ("a", 2, 2), ("req_id",)),
        ("add_request('b', 0, 2)", sched.add_request, ("b", 0, 2), ("prompt_len",)),
        ("add_request('b', 2.5, 2)", sched.add_request, ("b", 2.5, 2), ("prompt_len",)),
        ("add_request('b', 2, 0)", sched.add_request, ("b", 2, 0), ("max_new_tokens",)),
        ("add_request('b', 2, 1.5)", sched.add_request, ("b", 2, 1.5), ("max_new_tokens",)),
        ("add_request('b', 3, 2, 3): a hit of the whole prompt", sched.add_request, ("b", 3, 2, 3), ("num_cached",)),
        ("add_request('b', 3, 2, -1)", sched.add_request, ("b", 3, 2, -1), ("num_cached",)),
        ("add_request('b', 3, 2, 1.5)", sched.add_request, ("b", 3, 2, 1.5), ("num_cached",)),
        ("add_request('b', 6, 4): 9 tokens need 5 blocks of 2, 4 exist", sched.add_request, ("b", 6, 4),
         ("prompt_len", "max_new_tokens")),
        ("finish('z') of a request never added", sched.finish, ("z",), ("req_id",)),
    ]
    return cases, sched


@CHECKS.add("bad input raises ValueError naming the argument; a refused call changes nothing; a long prompt "
            "fits the blocks, not the budget", uses="ChunkedScheduler.__init__")
def scheduler_rejects_bad_input(ctx):
    def body(c, ex):
        cases, sched = _scheduler_cases(c.t.ChunkedScheduler)
        for what, fn, args, names in cases:
            expect_value_error(c, fn, *args, what=what, names=names, example=ex)
        sched.add_request("long", 7, 1, 2)  # 7 tokens, a budget of 3: accepted, read in chunks
        steps = []
        for i in range(4):
            if i == 2:
                sched.finish("a")  # it has its 2 tokens
            step = sched.schedule()
            steps.append((list(step.decode), [tuple(x) for x in step.prefill], list(step.preempted)))
        want = [([], [("a", 0, 3)], []), (["a"], [], []), ([], [("long", 2, 3)], []), ([], [("long", 5, 2)], [])]
        if steps != want:
            c.fail(f"after the refused calls, ChunkedScheduler(4, 2, 2, 3) holding 'a' (3 + 2 tokens) and 'long' (7 + 1, "
                   f"2 cached; its 4 blocks wait until 'a' finishes) scheduled {steps}; expected {want}", ex,
                   ("refused call changed", str(steps)))
        c.raises(ValueError, sched.finish, "a", what="finish('a') a second time", example=ex)

    ctx.case({"case": "bad arguments"}, body)


class _Caller:
    """The scheduler as a caller who keeps every Step and appends to its lists before the next call."""

    def __init__(self, sched):
        self.sched, self.kept = sched, []

    def add_request(self, *args):
        return self.sched.add_request(*args)

    def finish(self, req_id):
        return self.sched.finish(req_id)

    def schedule(self):
        for step in self.kept:
            for name in ("decode", "prefill", "preempted"):
                value = getattr(step, name)
                if isinstance(value, list):
                    value.append(("scribbled", -1, 1))  # the caller's list now
        self.kept.append(self.sched.schedule())
        return self.kept[-1]


@CHECKS.add("a Step is the caller's: kept and appended to by the caller, the next decisions do not change",
            uses="ChunkedScheduler.schedule")
def steps_are_the_callers(ctx):
    def body(c, ex):
        plain = Replay(c, ex, judge=None).run().history
        replay = Replay(c, ex, judge=None)
        replay.sched = _Caller(replay.sched)
        try:
            replay.run()
        except Exception as exc:  # noqa: BLE001 — a scheduler that reads the caller's list back may crash on it
            c.fail(f"with every Step kept and its lists appended to by the caller, the scheduler raised {exc!r}; "
                   f"left alone it decides {list(plain)}", ex, ("aliasing raised", type(exc).__name__))
        if replay.history != plain:
            c.fail(f"with every Step kept and its lists appended to by the caller, the scheduler decided "
                   f"{list(replay.history)}; left alone it decides {list(plain)}", ex, ("aliasing",))

    for name in ("the cap shares the budget", "a preemption resets the count", "a long prompt in chunks beside a decode"):
        ctx.case({"case": name, **PINNED[name]}, body)
