"""Programs for kata 13's scheduler checks: drawn sequences of arrivals, ``schedule()`` calls and
finishes, a plain-Python model of the policy, and the replay that runs a program on a scheduler.

A program is abstract where it depends on the schedule: ``("finish", k)`` finishes the k-th
running request (mod their number), resolved against the state the replay tracks. After every
step the replay finishes, as the caller must, each request that produced its ``max_new_tokens``-th
token. The replay judges each step either against the model's decision (``judge="reference"``) or
by the policy's invariants alone, computed from the scheduler's own decisions (``"invariants"``).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from hypothesis import strategies as st

from grader.engine import Failure


@dataclass
class Request:
    prompt_len: int
    max_new_tokens: int
    generated: int = 0


@dataclass
class State:
    """What the caller knows: every live request, who runs (admission order), who waits (front first)."""

    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    requests: dict = field(default_factory=dict)
    running: list = field(default_factory=list)
    waiting: list = field(default_factory=list)

    def held(self, r) -> int:
        """Blocks a running request holds: its cache has prompt + generated - 1 tokens."""
        req = self.requests[r]
        return math.ceil((req.prompt_len + req.generated - 1) / self.block_size)

    def after_decode(self, r) -> int:
        req = self.requests[r]
        return math.ceil((req.prompt_len + req.generated) / self.block_size)

    def prefill_tokens(self, r) -> int:
        req = self.requests[r]
        return req.prompt_len + req.generated

    def used(self) -> int:
        return sum(self.held(r) for r in self.running)

    def decide(self) -> tuple[list, list, list]:
        """The policy's step: (prefill, decode, preempted), without changing anything."""
        running, need_of = list(self.running), {}
        decode, preempted = [], []
        for r in list(running):
            if r not in running:  # preempted already, as the newest
                break
            while sum(need_of.get(x, self.held(x)) for x in running if x != r) + self.after_decode(r) > self.num_blocks:
                preempted.append(running.pop())
                if preempted[-1] == r:
                    break
            if r in running:
                need_of[r] = self.after_decode(r)
                decode.append(r)
        prefill = []
        if not preempted:
            budget, blocks = self.max_num_batched_tokens - len(decode), sum(need_of.values())
            for r in self.waiting:
                tokens = self.prefill_tokens(r)
                need = math.ceil(tokens / self.block_size)
                if len(running) + len(prefill) >= self.max_num_seqs or tokens > budget or blocks + need > self.num_blocks:
                    break
                prefill.append(r)
                budget, blocks = budget - tokens, blocks + need
        return prefill, decode, preempted

    def apply(self, prefill, decode, preempted) -> None:
        for r in preempted:
            self.running.remove(r)
            self.waiting.insert(0, r)  # each to the front: the last preempted ends up first
        for r in decode:
            self.requests[r].generated += 1
        for r in prefill:
            self.waiting.remove(r)
            self.running.append(r)
            self.requests[r].generated += 1

    def finish(self, r) -> None:
        del self.requests[r]
        (self.running if r in self.running else self.waiting).remove(r)


# -- programs -----------------------------------------------------------------------------------
@st.composite
def programs(draw, max_ops=24, blocks=(2, 10), cancels=False):
    """Limits and ops: ("add", prompt_len, max_new_tokens), ("step",), ("finish", k), ("drain",) last;
    with ``cancels``, ("cancel", k) too: the caller finishes the k-th waiting request."""
    bs = draw(st.integers(1, 4))
    num_blocks = draw(st.integers(*blocks))
    seqs = draw(st.integers(1, 4))
    budget = draw(st.integers(seqs, seqs + 14))
    longest = min(budget, num_blocks * bs)
    ops = []
    for _ in range(draw(st.integers(1, max_ops))):
        kind = draw(st.sampled_from(["add", "add", "step", "step", "step", "finish"] + (["cancel"] if cancels else [])))
        if kind == "add":
            near = st.integers(max(1, longest - 2), longest)  # long requests make the limits bind
            total = draw(st.integers(1, longest) | near)  # prompt_len + max_new_tokens - 1
            prompt = draw(st.integers(1, total))
            ops.append(("add", prompt, total - prompt + 1))
        elif kind in ("finish", "cancel"):
            ops.append((kind, draw(st.integers(0, 3))))
        else:
            ops.append(("step",))
    ops.append(("drain",))
    return {"num_blocks": num_blocks, "block_size": bs, "max_num_seqs": seqs, "max_num_batched_tokens": budget,
            "ops": ops}


def large_program(seed: int = 0, adds: int = 40) -> dict:
    """One program past the drawn sizes: blocks of 16, prompts of a few hundred tokens (positions past 256),
    twenty requests at a time and more, preemptions, requests cancelled while they wait; drawn once from
    ``seed`` (0: 17 preemptions, 23 requests in one step), not shrunk."""
    rng = random.Random(seed)
    limits = {"num_blocks": 30, "block_size": 16, "max_num_seqs": 24, "max_num_batched_tokens": 400}
    ops = []
    for i in range(adds):
        if i % 8 == 0:  # prompt_len + max_new_tokens - 1 tokens: a long prompt, a few new tokens
            total = rng.randint(260, 400)
            prompt = rng.randint(total - 8, total)
        else:  # a short prompt, many new tokens: the decodes outgrow their blocks
            total = rng.randint(16, 48)
            prompt = rng.randint(1, 8)
        ops.append(("add", prompt, total - prompt + 1))
        ops += [("step",)] * rng.randint(0, 1)
        if rng.random() < 0.15:
            ops.append((rng.choice(["finish", "cancel"]), rng.randint(0, 31)))
    return {**limits, "ops": ops + [("drain",)]}


def _ids(xs) -> str:
    return "[" + ", ".join(str(x) for x in xs) + "]"


def _say_step(step) -> str:
    prefill, decode, preempted = step
    return f"prefill {_ids(prefill)} · decode {_ids(decode)} · preempted {_ids(preempted)}"


class Replay:
    """Runs a program on the target's Scheduler, judging each ``schedule()`` call."""

    MAX_DRAIN = 200  # steps; the policy drains any drawn program in far fewer

    def __init__(self, ctx, ex, judge: str | None = "reference"):
        self.ctx, self.ex, self.judge = ctx, ex, judge
        limits = [ex[k] for k in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens")]
        self.sched = ctx.t.Scheduler(*limits)
        self.state = State(*limits)
        self.lines: list[str] = []
        self.history: list[tuple] = []  # every step's decisions, as the scheduler returned them
        self.steps = 0
        self.last = None  # the last Step, as schedule() returned it
        self._next_id = 0

    # -- the failure: the calls so far, the state before the failing step, expected and yours ---------
    def fail(self, what: str, got, observed) -> None:
        s = self.state
        table = "\n".join(
            f"      {r:>3}  {q.prompt_len:>6}  {q.max_new_tokens:>7}  {q.generated:>9}  "
            f"{'running' if r in s.running else 'waiting':>7}  {s.held(r) if r in s.running else 0:>6}"
            for r, q in s.requests.items())
        shown = self.lines[-30:]
        listing = "\n".join(f"      {line}" for line in shown)
        if len(self.lines) > len(shown):
            listing = f"      … {len(self.lines) - len(shown)} earlier call(s)\n" + listing
        limits = ", ".join(f"{k}={self.ex[k]}" for k in ("num_blocks", "block_size", "max_num_seqs",
                                                             "max_num_batched_tokens"))
        raise Failure(
            f"Scheduler({limits}); the calls so far:\n{listing}\n"
            f"  → schedule() call {self.steps} returned {_say_step(got)}\n  {what}\n"
            f"  state before that call (running: {_ids(s.running)} oldest first; waiting: {_ids(s.waiting)} "
            f"front first; {s.used()} of {s.num_blocks} blocks held):\n"
            f"      req  prompt  max_new  generated    state  blocks\n{table or '      (no requests)'}",
            observed=("step", self.steps) + observed + (() if self.judge is None else (fingerprint(self.ctx),)))

    def run(self) -> "Replay":
        for op in self.ex["ops"]:
            getattr(self, "do_" + op[0])(*op[1:])
        return self

    def do_add(self, prompt_len, max_new_tokens):
        r, self._next_id = self._next_id, self._next_id + 1
        self.sched.add_request(r, prompt_len, max_new_tokens)
        self.state.requests[r] = Request(prompt_len, max_new_tokens)
        self.state.waiting.append(r)
        self.lines.append(f"add_request({r}, prompt_len={prompt_len}, max_new_tokens={max_new_tokens})")

    def do_finish(self, k):
        if self.state.running:
            r = self.state.running[k % len(self.state.running)]
            self._finish(r, "")

    def do_cancel(self, k):
        if self.state.waiting:
            r = self.state.waiting[k % len(self.state.waiting)]
            self._finish(r, "   (a waiting request, cancelled)")

    def _finish(self, r, why):
        self.sched.finish(r)
        self.state.finish(r)
        self.lines.append(f"finish({r}){why}")

    def do_drain(self):
        for _ in range(self.MAX_DRAIN):
            if not self.state.requests:
                return
            self.do_step()
        left = sorted(self.state.requests)
        self.fail(f"after {self.MAX_DRAIN} more schedule() calls requests {_ids(left)} have still not finished: "
                  "some request starves", ([], [], []), ("starves", tuple(left)))

    def do_step(self):
        self.last = self.sched.schedule()  # the Step as returned, for the checks that hold it
        got = self._got(self.last)
        if self.judge == "reference":
            want = self.state.decide()
            if got != want:
                self.fail(f"expected {_say_step(want)}", got, tuple(tuple(x) for x in got))
        elif self.judge == "invariants":
            self.invariants(*got)
        self.history.append(tuple(tuple(x) for x in got))
        self.state.apply(*got)
        self.lines.append(f"schedule() -> {_say_step(got)}")
        self.steps += 1
        for r in list(self.state.running):
            req = self.state.requests[r]
            if req.generated == req.max_new_tokens:  # the caller finishes it after its last token
                self._finish(r, f"   (request {r} has its {req.max_new_tokens} token(s))")

    def _got(self, step) -> tuple[list, list, list]:
        lists = []
        for name in ("prefill", "decode", "preempted"):
            value = getattr(step, name, None)
            if not isinstance(value, (list, tuple)):
                self.fail(f"schedule() should return a Step whose {name} is a list of request ids; got "
                          f"{type(value).__name__}", ([], [], []), ("step type", name))
            lists.append(list(value))
        return tuple(lists)

    # -- the invariants, from the scheduler's own decisions -----------------------------------------
    def invariants(self, prefill, decode, preempted):
        s, got = self.state, (prefill, decode, preempted)
        everyone = prefill + decode + preempted
        if len(set(everyone)) != len(everyone) or any(r not in s.requests for r in everyone):
            self.fail("each live request may appear at most once in a step, and only live ones", got, ("ids",))
        if any(r not in s.waiting for r in prefill):
            self.fail("a prefill must be a waiting request", got, ("prefill not waiting",))
        if decode + preempted[::-1] != s.running:
            self.fail(f"every running request {_ids(s.running)} (oldest first) either decodes, oldest first, or is "
                      "preempted, the most recently admitted first: decode + reversed(preempted) must equal them",
                      got, ("decode order", tuple(decode), tuple(preempted)))
        if sum(s.after_decode(r) for r in decode) > s.num_blocks:
            self.fail(f"the decodes need {sum(s.after_decode(r) for r in decode)} blocks, more than the "
                      f"{s.num_blocks} that exist", got, ("too many blocks",))
        if preempted and sum(s.after_decode(r) for r in decode + [preempted[-1]]) <= s.num_blocks:
            self.fail(f"request {preempted[-1]} was preempted although it could have decoded too", got,
                      ("needless preemption", preempted[-1]))
        if preempted and prefill:
            self.fail("a step that preempts admits no one", got, ("admitted after preempting",))
        if prefill != s.waiting[:len(prefill)]:
            self.fail(f"admission is first come, first served: the waiting queue is {_ids(s.waiting)}", got,
                      ("not fcfs", tuple(prefill)))
        self._limits(decode, prefill, got)

    def _limits(self, decode, prefill, got):
        s = self.state
        seqs = len(decode) + len(prefill)
        tokens = len(decode) + sum(s.prefill_tokens(r) for r in prefill)
        blocks = sum(s.after_decode(r) for r in decode) + sum(math.ceil(s.prefill_tokens(r) / s.block_size)
                                                               for r in prefill)
        for name, value, limit in (("running requests", seqs, s.max_num_seqs),
                                   ("batched tokens (a decode counts 1)", tokens, s.max_num_batched_tokens),
                                   ("blocks", blocks, s.num_blocks)):
            if value > limit:
                self.fail(f"after this step {value} {name}, more than the limit {limit}", got, ("over", name))
        nxt = s.waiting[len(prefill)] if len(prefill) < len(s.waiting) else None
        if nxt is not None and not got[2]:  # nobody preempted: the next in the queue must not fit
            t = s.prefill_tokens(nxt)
            fits = (seqs < s.max_num_seqs and tokens + t <= s.max_num_batched_tokens
                    and blocks + math.ceil(t / s.block_size) <= s.num_blocks)
            if fits:
                self.fail(f"request {nxt}, next in the queue, fits (its {t} tokens, "
                          f"{math.ceil(t / s.block_size)} blocks, a sequence slot) but was not admitted", got,
                          ("not admitted", nxt))


# -- pinned programs, worked by hand (request ids 0, 1, 2, … in order of add) ---------------------
# Checked as worked cases, and replayed unjudged as probes: what a scheduler does on all of them
# goes with every failure, so a diagnosis can tell look-alike bugs apart.
SHORT_BEHIND_LONG = {  # 0 runs with 2 of 4 blocks; 1 needs 3 blocks and waits; 2 (1 block) must wait behind it
    "num_blocks": 4, "block_size": 2, "max_num_seqs": 4, "max_num_batched_tokens": 16,
    "ops": [("add", 3, 2), ("step",), ("add", 6, 1), ("add", 1, 1), ("step",), ("step",), ("drain",)]}
PREEMPT_NEWEST = {  # 0 and 1 hold 2 blocks each; at their second decode 0 needs a third: 1 (newest) is preempted
    "num_blocks": 4, "block_size": 2, "max_num_seqs": 4, "max_num_batched_tokens": 16,
    "ops": [("add", 3, 4), ("add", 3, 4), ("step",), ("add", 1, 1), ("step",), ("step",), ("step",), ("drain",)]}
VICTIM_FIRST = {  # 1 preempts itself (0 took the last block); 0 finishes; 1 (4 tokens again) is admitted before 2
    "num_blocks": 4, "block_size": 2, "max_num_seqs": 4, "max_num_batched_tokens": 16,
    "ops": [("add", 4, 2), ("add", 2, 3), ("step",), ("add", 1, 1), ("step",), ("step",), ("drain",)]}
BUDGET_COUNTS_DECODES = {  # 0 decodes (1 token); 1's 8-token prefill would fit a budget of 8 only without it
    "num_blocks": 12, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 8,
    "ops": [("add", 4, 3), ("step",), ("add", 8, 1), ("step",), ("step",), ("drain",)]}
RECOMPUTE_LONGER = {  # 1 is preempted after 2 tokens; its recompute prefill is 4 + 2 = 6 tokens, 3 blocks of 2
    "num_blocks": 5, "block_size": 2, "max_num_seqs": 2, "max_num_batched_tokens": 8,
    "ops": [("add", 2, 5), ("step",), ("add", 4, 5), ("step",), ("step",), ("step",), ("step",), ("add", 1, 1),
            ("drain",)]}
CANCEL_PREEMPTED = {  # as PREEMPT_NEWEST; then the caller finishes 1 while it waits: it frees nothing (0 holds 3 of
    # the 4 blocks), so 2 (2 blocks) waits until 0 is done; 1 is never scheduled again
    "num_blocks": 4, "block_size": 2, "max_num_seqs": 4, "max_num_batched_tokens": 16,
    "ops": [("add", 3, 4), ("add", 3, 4), ("step",), ("add", 3, 1), ("step",), ("step",), ("cancel", 0), ("step",),
            ("drain",)]}
FILL_THE_POOL = {  # 0 needs 5 + 2 - 1 = 6 tokens: all 3 blocks of 2 and the whole budget; 1 (1 block) waits behind
    "num_blocks": 3, "block_size": 2, "max_num_seqs": 1, "max_num_batched_tokens": 6,
    "ops": [("add", 5, 2), ("add", 1, 1), ("step",), ("step",), ("drain",)]}
SMALLEST = {  # every limit at 1: one request of one token at a time
    "num_blocks": 1, "block_size": 1, "max_num_seqs": 1, "max_num_batched_tokens": 1,
    "ops": [("add", 1, 1), ("add", 1, 1), ("step",), ("drain",)]}
PINNED = [SHORT_BEHIND_LONG, PREEMPT_NEWEST, VICTIM_FIRST, BUDGET_COUNTS_DECODES, RECOMPUTE_LONGER, CANCEL_PREEMPTED,
          FILL_THE_POOL, SMALLEST]


def fingerprint(ctx) -> tuple:
    """The target's decisions on every pinned program, unjudged: equal for two schedulers only when
    they behave alike there too, which keeps the diagnosis from naming a look-alike bug."""
    seen = []
    for ex in PINNED:
        replay = Replay(ctx, ex, judge=None)
        try:
            replay.run()
            seen.append(tuple(replay.history))
        except Failure:  # it starved a request
            seen.append(("stuck", tuple(replay.history)))
        except Exception as exc:  # noqa: BLE001 — any crash is part of how it behaves
            seen.append(("raised", type(exc).__name__, tuple(replay.history)))
    return tuple(seen)
