"""Kata 13 — continuous batching with preemption.

Fill in every function that raises NotImplementedError; the README walks through the tasks.
Shapes: B rows of one step (prefills + decodes), T the longest row of the step, S_b the tokens
row b holds after the step, Hkv KV heads, D head width, V vocabulary. Build the engine's cache
from ``grader.paged.PagedKVCache`` (kata 06's API).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch  # noqa: F401  (the engine needs it)

from grader.paged import PagedKVCache  # noqa: F401  (the engine's cache)


@dataclass
class Step:
    """What one ``schedule()`` call decided, as request ids."""

    prefill: list = field(default_factory=list)  # admitted this step, in admission order
    decode: list = field(default_factory=list)  # one token each, oldest admitted first
    preempted: list = field(default_factory=list)  # in the order they were preempted


class Scheduler:
    """Decides, step by step, which requests prefill, which decode and which are preempted.

    Bookkeeping only (no tensors): it counts blocks of ``block_size`` tokens the way a paged
    cache hands them out, and assumes every scheduled step runs: a prefill produces one token,
    a decode one more.
    """

    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int):
        """Positive ints; ValueError naming max_num_batched_tokens when it is below max_num_seqs."""
        raise NotImplementedError("kata 13: Scheduler.__init__ — see README, task 1")

    def add_request(self, req_id, prompt_len: int, max_new_tokens: int) -> None:
        """Queue a request at the back. ValueError for a duplicate id, a bad length, or a request whose
        prompt_len + max_new_tokens - 1 tokens exceed the token budget or need more than num_blocks blocks."""
        raise NotImplementedError("kata 13: Scheduler.add_request — see README, task 1")

    def finish(self, req_id) -> None:
        """The caller's word that ``req_id`` produced its last token: free its blocks. Unknown id: ValueError."""
        raise NotImplementedError("kata 13: Scheduler.finish — see README, task 1")

    def schedule(self) -> Step:
        """One step: a decode slot for each running request, oldest first, preempting the most recently
        admitted when blocks run out (to the front of the waiting queue); then, only if nobody was
        preempted, first-come-first-served admissions of whole prefills within blocks, max_num_seqs and
        the token budget (a decode counts 1 token)."""
        raise NotImplementedError("kata 13: Scheduler.schedule — see README, task 1")


def serve(model, requests: list[tuple], *, num_blocks: int, block_size: int, max_num_seqs: int,
          max_num_batched_tokens: int, eos_token_id: int | None = None) -> dict:
    """Greedy generation for every request with continuous batching; returns {req_id: new tokens}.

    ``requests``: (req_id, prompt, max_new_tokens, arrival_step). Each ``schedule()`` call is one step
    and ONE batched forward of ``model`` over a paged cache: prefill rows (prompt + tokens generated
    before a preemption, positions from 0) and decode rows (the last token, at its own position) side
    by side, each row's mask showing only its own keys. A request stops after max_new_tokens tokens or
    its EOS (included); max_new_tokens = 0 gives []. Call ``finish`` after the step that made the last token.
    """
    raise NotImplementedError("kata 13: serve — see README, task 2")
