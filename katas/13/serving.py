"""Kata 13 — continuous batching with preemption.

Fill in every function that raises NotImplementedError; the README walks through the tasks.
Shapes: B rows of one step (prefills + decodes), T the longest row of the step (a prefill's
length, or 1), N the real tokens of the step, S the keys each row is shown (its blocks, padded to
the widest table), Hkv KV heads, P block size, D head width, V vocabulary. The cache is
``grader.paged.PagedKVCache`` (kata 06's API); the model is ``grader.nn.Llama`` or anything with
its interface (``config``, ``device``, ``dtype``, ``model(input_ids, position_ids=, cache=,
attention_mask=, logits_to_keep=) -> logits``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grader.paged import PagedKVCache


@dataclass
class Step:
    """What one ``schedule()`` call decided, as request ids."""

    prefill: list = field(default_factory=list)  # admitted this step, in admission order
    decode: list = field(default_factory=list)  # one token each, oldest admitted first
    preempted: list = field(default_factory=list)  # in the order they were preempted


@dataclass
class _Request:
    prompt_len: int
    max_new_tokens: int
    generated: int = 0  # tokens produced so far (each scheduled step produces one)
    blocks: int = 0  # blocks held while running


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
        """The caller's word that ``req_id`` produced its last token, or is dropped: free its blocks (a waiting
        request holds none: it leaves the queue). Unknown id: ValueError."""
        raise NotImplementedError("kata 13: Scheduler.finish — see README, task 1")

    def _preempt(self, step: Step):
        """Preempt the most recently admitted running request: its blocks are free again, it waits at the
        front of the queue and is noted in ``step.preempted``. Returns its id."""
        raise NotImplementedError("kata 13: Scheduler._preempt — see README, task 1")

    def _schedule_decodes(self, step: Step) -> None:
        """A decode slot for each running request, oldest admitted first, with the blocks its next token
        needs; while blocks run short, preempt the newest (it may be the request itself: then stop)."""
        raise NotImplementedError("kata 13: Scheduler._schedule_decodes — see README, task 1")

    def _admit(self, step: Step) -> None:
        """First come, first served: admit waiting requests as whole prefills (a recompute's generated
        tokens included) while max_num_seqs, the token budget the decodes left and the free blocks allow;
        the first that does not fit stops the queue."""
        raise NotImplementedError("kata 13: Scheduler._admit — see README, task 1")

    def schedule(self) -> Step:
        """One step: a decode slot for each running request, oldest first, preempting the most recently
        admitted when blocks run out (to the front of the waiting queue); then, only if nobody was
        preempted, first-come-first-served admissions of whole prefills within blocks, max_num_seqs and
        the token budget (a decode counts 1 token)."""
        raise NotImplementedError("kata 13: Scheduler.schedule — see README, task 1")


# -- the engine ----------------------------------------------------------------------------------
class _StepCache:
    """The rows of one step over the paged cache, as the model's ``update`` sees them.

    Row b holds ``lengths[b]`` real tokens, left-padded to T. Its keys come back read through its
    block table, padded to the widest table: S = blocks * block_size, the unused slots masked.
    """

    def __init__(self, cache: PagedKVCache, seq_ids: list, lengths: list[int], T: int):
        """Reserve every row's new slots once for all layers (``slots`` (N,)); note the batch row and
        column of each real token (``rows``, ``cols`` (N,)), each row's block table padded to the
        widest (``tables`` (B, n)) and ``S`` = n * block_size."""
        raise NotImplementedError("kata 13: _StepCache — see README, task 2")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write each row's real columns of ``k``, ``v`` (B, Hkv, T, D); return (B, Hkv, S, D)."""
        raise NotImplementedError("kata 13: _StepCache.update — see README, task 2")


def _check_requests(model, requests, limits: tuple) -> None:
    """Every request well formed (a 4-tuple; a non-empty prompt of ids 0 … V - 1; max_new_tokens and
    arrival_step ints >= 0; no duplicate id) and able to finish, before anything runs: ValueError naming
    ``requests`` or the field, and the limits as the ``Scheduler`` refuses them."""
    raise NotImplementedError("kata 13: _check_requests — see README, task 2")


def _forward(model, cache, rows: list[tuple]) -> list[int]:
    """One batched forward of the step's rows (seq_id, tokens, start position), left-padded to T,
    each row's mask (B, T, S) showing only its own keys; returns each row's greedy next token."""
    raise NotImplementedError("kata 13: _forward — see README, task 2")


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
