"""Programs for kata 23's scheduler checks: drawn sequences of arrivals (prefix hits among them),
``schedule()`` calls and finishes; a plain-Python model of the chunked policy; the replay that runs a
program on a scheduler and judges each step against the model or by the policy's invariants.

``("finish", k)`` finishes the k-th running request and ``("cancel", k)`` the k-th waiting one (mod
their number). After every step the replay finishes, as the caller must, each request that made its
``max_new_tokens``-th token.
"""
from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, field

from hypothesis import strategies as st

from grader.checks.k23_invariants import invariants
from grader.engine import Failure

LIMITS = ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold")


@dataclass
class Req:
    prompt_len: int
    max_new_tokens: int
    computed: int
    generated: int = 0
    blocks: int = 0

    @property
    def known(self) -> int:  # L: the prompt and every token made
        return self.prompt_len + self.generated


@dataclass
class Policy:
    """The books as the caller sees them, and the policy's next step."""

    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int = 0
    reqs: dict = field(default_factory=dict)
    running: list = field(default_factory=list)  # admission order
    waiting: list = field(default_factory=list)  # front first

    def free(self) -> int:
        return self.num_blocks - sum(self.reqs[r].blocks for r in self.running)

    def chunk(self, q: Req, budget: int) -> int:
        cap = self.long_prefill_token_threshold or q.known
        return min(q.known - q.computed, cap, budget)

    def decide(self) -> tuple[list, list, list]:
        """(decode, prefill, preempted) of the next step; the books are left as they are."""
        s = copy.deepcopy(self)
        decode, preempted = [], []
        for r in list(s.running):
            q = s.reqs[r]
            if r not in s.running or q.computed + 1 != q.known:
                continue
            want = math.ceil((q.computed + 1) / s.block_size)
            while r in s.running and want - q.blocks > s.free():
                victim = s.running.pop()
                s.reqs[victim].blocks = 0
                preempted.append(victim)
            if r in s.running:
                q.blocks = max(q.blocks, want)
                decode.append(r)
        budget = s.max_num_batched_tokens - len(decode)
        prefill = []
        for r in s.running:
            n = s.chunk(s.reqs[r], budget)
            if r not in decode and n > 0:
                prefill.append((r, s.reqs[r].computed, n))
                budget -= n
        for r in ([] if preempted else list(s.waiting)):
            q = s.reqs[r]
            whole = math.ceil(q.known / s.block_size)
            if len(s.running) >= s.max_num_seqs or budget <= 0 or whole > s.free():
                break
            s.running.append(r)
            q.blocks = whole
            prefill.append((r, q.computed, s.chunk(q, budget)))
            budget -= prefill[-1][2]
        return decode, prefill, preempted

    def apply(self, decode, prefill, preempted) -> None:
        """Move the books by a step's decisions (the scheduler's own, for the invariants)."""
        for r in preempted:
            self.running.remove(r)
            self.waiting.insert(0, r)
            self.reqs[r].blocks, self.reqs[r].computed = 0, 0
        for r in decode:
            q = self.reqs[r]
            q.blocks = max(q.blocks, math.ceil((q.computed + 1) / self.block_size))
            q.computed, q.generated = q.computed + 1, q.generated + 1
        for r, _, n in prefill:
            q = self.reqs[r]
            if r in self.waiting:
                self.waiting.remove(r)
                self.running.append(r)
                q.blocks = math.ceil(q.known / self.block_size)
            q.computed += n
            if q.computed == q.known:
                q.generated += 1

    def remove(self, r) -> None:
        del self.reqs[r]
        (self.running if r in self.running else self.waiting).remove(r)


# -- programs -------------------------------------------------------------------------------------
@st.composite
def programs(draw, max_ops=24, blocks=(2, 12), cancels=False, cap=None):
    """Limits and ops: ("add", prompt_len, max_new_tokens, num_cached), ("step",), ("finish", k),
    ("cancel", k) with ``cancels``, and ("drain",) last. Budgets run from max_num_seqs (one token a
    decode, nothing left) to past the prompts; ``cap`` fixes the threshold, else it is drawn."""
    bs = draw(st.integers(1, 4))
    num_blocks = draw(st.integers(*blocks))
    seqs = draw(st.integers(1, 4))
    budget = draw(st.integers(seqs, seqs + 10))
    threshold = draw(st.sampled_from([0, 0, 1, 2, 3, 5])) if cap is None else cap
    longest = num_blocks * bs
    ops = []
    for _ in range(draw(st.integers(1, max_ops))):
        kind = draw(st.sampled_from(["add", "add", "step", "step", "step", "finish"] + (["cancel"] if cancels else [])))
        if kind == "add":
            total = draw(st.integers(1, longest) | st.integers(max(1, longest - 2), longest))
            prompt = draw(st.integers(1, total))
            hit = draw(st.sampled_from([0, 0, 0, prompt - 1, prompt // 2]))
            ops.append(("add", prompt, total - prompt + 1, hit))
        elif kind in ("finish", "cancel"):
            ops.append((kind, draw(st.integers(0, 3))))
        else:
            ops.append(("step",))
    return {"num_blocks": num_blocks, "block_size": bs, "max_num_seqs": seqs, "max_num_batched_tokens": budget,
            "long_prefill_token_threshold": threshold, "ops": ops + [("drain",)]}


def large_program(seed: int = 0, adds: int = 30) -> dict:
    """Past the drawn sizes: blocks of 16, prompts of a few hundred tokens cut into many chunks, a
    budget of 64 with a cap of 48, preemptions, prefix hits; drawn once from ``seed``, not shrunk."""
    rng = random.Random(seed)
    ops = []
    for i in range(adds):
        prompt = rng.randint(200, 300) if i % 6 == 0 else rng.randint(1, 12)
        new = rng.randint(1, 4) if i % 6 == 0 else rng.randint(8, 40)
        ops.append(("add", prompt, new, rng.choice([0, 0, prompt - 1, prompt // 3])))
        ops += [("step",)] * rng.randint(0, 3)
        if rng.random() < 0.1:
            ops.append((rng.choice(["finish", "cancel"]), rng.randint(0, 31)))
    return {"num_blocks": 30, "block_size": 16, "max_num_seqs": 12, "max_num_batched_tokens": 64,
            "long_prefill_token_threshold": 48, "ops": ops + [("drain",)]}


def _say(step) -> str:
    decode, prefill, preempted = step
    chunks = ", ".join(f"{r}: [{a}, {a + n})" for r, a, n in prefill)
    return f"decode {list(decode)} · prefill {{{chunks}}} · preempted {list(preempted)}"


class Replay:
    """Runs a program on the target's ChunkedScheduler, judging each ``schedule()`` call."""

    MAX_DRAIN = 400

    def __init__(self, ctx, ex, judge: str | None = "reference"):
        self.ctx, self.ex, self.judge = ctx, ex, judge
        limits = [ex[k] for k in LIMITS]
        self.sched = ctx.t.ChunkedScheduler(*limits)
        self.state = Policy(*limits)
        self.lines: list[str] = []
        self.history: list[tuple] = []
        self.steps, self.next_id = 0, 0

    def fail(self, what: str, got, observed) -> None:
        s = self.state
        table = "\n".join(f"      {r:>3}  {q.prompt_len:>6}  {q.max_new_tokens:>7}  {q.computed:>8}  {q.generated:>9}  "
                          f"{'running' if r in s.running else 'waiting':>7}  {q.blocks:>6}" for r, q in s.reqs.items())
        shown = self.lines[-30:]
        listing = "\n".join(f"      {line}" for line in shown)
        if len(self.lines) > len(shown):
            listing = f"      … {len(self.lines) - len(shown)} earlier call(s)\n" + listing
        limits = ", ".join(f"{k}={self.ex[k]}" for k in LIMITS)
        raise Failure(
            f"ChunkedScheduler({limits}); the calls so far:\n{listing}\n"
            f"  → schedule() call {self.steps} returned {_say(got)}\n  {what}\n"
            f"  books before that call (running {s.running} oldest first; waiting {s.waiting} front first):\n"
            f"      req  prompt  max_new  computed  generated    state  blocks\n{table or '      (no requests)'}",
            observed=("step", self.steps) + observed + (() if self.judge is None else (fingerprint(self.ctx),)))

    def run(self) -> "Replay":
        for op in self.ex["ops"]:
            getattr(self, "do_" + op[0])(*op[1:])
        return self

    def do_add(self, prompt_len, max_new_tokens, num_cached):
        r, self.next_id = self.next_id, self.next_id + 1
        self.sched.add_request(r, prompt_len, max_new_tokens, num_cached)
        self.state.reqs[r] = Req(prompt_len, max_new_tokens, num_cached)
        self.state.waiting.append(r)
        self.lines.append(f"add_request({r}, prompt_len={prompt_len}, max_new_tokens={max_new_tokens}, "
                          f"num_cached={num_cached})")

    def do_finish(self, k):
        if self.state.running:
            self._finish(self.state.running[k % len(self.state.running)], "")

    def do_cancel(self, k):
        if self.state.waiting:
            self._finish(self.state.waiting[k % len(self.state.waiting)], "   (a waiting request, dropped)")

    def _finish(self, r, why):
        self.sched.finish(r)
        self.state.remove(r)
        self.lines.append(f"finish({r}){why}")

    def do_drain(self):
        for _ in range(self.MAX_DRAIN):
            if not self.state.reqs:
                return
            self.do_step()
        self.fail(f"after {self.MAX_DRAIN} more schedule() calls requests {sorted(self.state.reqs)} have not "
                  "finished: some request starves", ([], [], []), ("starves",))

    def do_step(self):
        got = self._got(self.sched.schedule())
        if self.judge == "reference":
            want = self.state.decide()
            if got != want:
                self.fail(f"expected {_say(want)}", got, tuple(tuple(x) for x in got))
        elif self.judge == "invariants":
            invariants(self, *got)
        self.history.append(tuple(tuple(x) for x in got))
        self.state.apply(*got)
        self.lines.append(f"schedule() -> {_say(got)}")
        self.steps += 1
        for r in list(self.state.running):
            q = self.state.reqs[r]
            if q.generated == q.max_new_tokens:
                self._finish(r, f"   (request {r} has its {q.max_new_tokens} token(s))")

    def _got(self, step) -> tuple[list, list, list]:
        lists = []
        for name in ("decode", "prefill", "preempted"):
            value = getattr(step, name, None)
            if not isinstance(value, (list, tuple)):
                self.fail(f"schedule() should return a Step whose {name} is a list; got {type(value).__name__}",
                          ([], [], []), ("step type", name))
            lists.append([tuple(x) if isinstance(x, (list, tuple)) else x for x in value])
        return tuple(lists)


# -- pinned programs (request ids 0, 1, 2, … in order of add) ---------------------------------------
# Checked as worked cases, and replayed unjudged as probes: what a scheduler does on all of them goes
# with every failure, so a diagnosis can tell look-alike bugs apart.
def _pinned(limits: tuple, ops: list) -> dict:
    return {**dict(zip(LIMITS, limits)), "ops": ops + [("drain",)]}


PINNED = {
    # 0 decodes while 1's prompt of 10 is read in chunks of 5 (budget 6 less 0's decode); 1 samples at step 2
    "a long prompt in chunks beside a decode": _pinned((20, 2, 4, 6, 0), [
        ("add", 2, 6, 0), ("step",), ("add", 10, 2, 0), ("step",), ("step",), ("step",)]),
    # the cap of 3 keeps 1 from taking the budget of 8: 2 (arrived later) gets a chunk in the same step
    "the cap shares the budget": _pinned((30, 4, 4, 8, 3), [("add", 9, 2, 0), ("add", 7, 2, 0), ("step",), ("step",)]),
    # prefix hits: 0 has 4 of 5 tokens cached (one token to compute), 1 has 3 of 8
    "prefix hits start above 0": _pinned((20, 2, 4, 4, 0), [("add", 5, 3, 4), ("add", 8, 2, 3), ("step",), ("step",)]),
    # 4 blocks of 2: 0 and 1 hold 2 each; 0's third token needs a block: 1 (newest, mid-prompt) is preempted and
    # its computed count goes back to 0; its hit is gone too
    "a preemption resets the count": _pinned((4, 2, 2, 3, 0), [
        ("add", 3, 4, 0), ("step",), ("add", 4, 2, 1), ("step",), ("step",), ("step",)]),
    # every limit at its smallest: budget = max_num_seqs = 1, one token a step
    "budget 1": _pinned((3, 2, 1, 1, 0), [("add", 4, 2, 0), ("add", 1, 1, 0), ("step",)]),
    # budget 3, two requests decoding: the waiting prompt of 3 is read one token a step
    "decodes take the budget first": _pinned((20, 4, 3, 3, 0), [
        ("add", 1, 5, 0), ("add", 1, 5, 0), ("step",), ("add", 3, 1, 0), ("step",), ("step",)]),
}


def fingerprint(ctx) -> tuple:
    """The target's decisions on every pinned program, unjudged."""
    seen = []
    for ex in PINNED.values():
        replay = Replay(ctx, ex, judge=None)
        try:
            replay.run()
            seen.append(tuple(replay.history))
        except Failure:
            seen.append(("stuck", tuple(replay.history)))
        except Exception as exc:  # noqa: BLE001 — any crash is part of how it behaves
            seen.append(("raised", type(exc).__name__, tuple(replay.history)))
    return tuple(seen)
