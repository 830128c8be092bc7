"""The chunked policy's invariants, judged from a scheduler's own decisions and the books before them:
a step that breaks none of them is accepted whatever the model of the policy would have chosen."""
from __future__ import annotations

import copy
import math


def _judge(replay, got, ok: bool, what: str, *observed) -> None:
    if not ok:
        replay.fail(what, got, observed)


def invariants(replay, decode, prefill, preempted) -> None:
    s, got = replay.state, (decode, prefill, preempted)
    chunked = [r for r, _, _ in prefill]
    everyone = decode + chunked + preempted
    _judge(replay, got, len(set(everyone)) == len(everyone) and all(r in s.reqs for r in everyone),
           "each live request may appear at most once in a step, and only live ones", "ids")
    _judge(replay, got, preempted == s.running[::-1][:len(preempted)],
           f"a preemption takes the most recently admitted running request first: running is {s.running}", "victims")
    owed = [r for r in s.running if r not in preempted and s.reqs[r].computed + 1 == s.reqs[r].known]
    _judge(replay, got, decode == owed, f"every running request with one token left decodes, oldest first, unless "
           f"preempted: expected decode {owed}", "decodes", tuple(decode))
    for r, start, n in prefill:
        q = s.reqs[r]
        _judge(replay, got, start == q.computed, f"request {r}'s chunk starts at {start}, but {q.computed} of its "
               "tokens are in the cache: a chunk starts where the last one ended", "start", r, start)
        _judge(replay, got, 1 <= n <= q.known - q.computed, f"request {r}'s chunk of {n} tokens: it has "
               f"{q.known - q.computed} left to compute", "length", r, n)
        cap = s.long_prefill_token_threshold
        _judge(replay, got, not cap or n <= cap, f"request {r}'s chunk of {n} tokens exceeds the cap {cap}", "cap", r)
    admitted = [r for r in chunked if r in s.waiting]
    _judge(replay, got, admitted == s.waiting[:len(admitted)], f"admission is first come, first served: the "
           f"waiting queue is {s.waiting}", "fcfs", tuple(admitted))
    _judge(replay, got, not (preempted and admitted), "a step that preempts admits no one", "admitted after preempting")
    _limits(replay, got, decode, prefill, preempted, admitted)


def _limits(replay, got, decode, prefill, preempted, admitted) -> None:
    s = replay.state
    tokens = len(decode) + sum(n for _, _, n in prefill)
    _judge(replay, got, tokens <= s.max_num_batched_tokens, f"the step computes {tokens} tokens, more than "
           f"max_num_batched_tokens = {s.max_num_batched_tokens}", "over budget", tokens)
    after = copy.deepcopy(s)
    after.apply(decode, prefill, preempted)
    _judge(replay, got, len(after.running) <= s.max_num_seqs, f"{len(after.running)} requests run, more than "
           f"max_num_seqs = {s.max_num_seqs}", "over seqs")
    used = s.num_blocks - after.free()
    _judge(replay, got, used <= s.num_blocks, f"after this step the running requests hold {used} blocks, more than "
           f"the {s.num_blocks} that exist", "over blocks", used)
    left = s.max_num_batched_tokens - tokens
    starved = [r for r in s.running if r not in preempted and r not in decode and r not in [x for x, _, _ in prefill]
               and s.reqs[r].computed < s.reqs[r].known]
    _judge(replay, got, not (left and starved), f"{left} token(s) of the budget are unused while request(s) "
           f"{starved} still prefill", "idle budget", tuple(starved))
    rest = [r for r in s.waiting if r not in admitted]
    if rest and not preempted and left:
        q = s.reqs[rest[0]]
        fits = len(after.running) < s.max_num_seqs and math.ceil(q.known / s.block_size) <= after.free()
        _judge(replay, got, not fits, f"request {rest[0]}, next in the queue, fits (a sequence slot, "
               f"{math.ceil(q.known / s.block_size)} blocks, budget left) but was not admitted", "not admitted", rest[0])
