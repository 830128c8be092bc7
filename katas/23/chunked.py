"""Kata 23 — chunked prefill.

Fill in every function that raises NotImplementedError; the README walks through the tasks.

Shapes: B rows of one step (decodes and prefill chunks), T the longest row of the step, S the keys
each row is shown (its blocks, padded to the widest table), Hkv KV heads, D head width, V vocabulary.
The cache is ``grader.paged.PagedKVCache`` (kata 06's API); the model is ``grader.nn.Llama`` or
anything with its interface (``config``, ``device``, ``dtype``, ``model(input_ids, position_ids=,
cache=, attention_mask=, logits_to_keep=) -> logits``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grader.paged import PagedKVCache


@dataclass
class Step:
    """What one ``schedule()`` call decided."""

    decode: list = field(default_factory=list)  # request ids, one token each, oldest admitted first
    prefill: list = field(default_factory=list)  # (req_id, start, n): compute tokens start … start + n - 1
    preempted: list = field(default_factory=list)  # request ids, in the order they were preempted


@dataclass
class _Request:
    prompt_len: int
    max_new_tokens: int
    computed: int  # tokens in its cache (a prefix hit starts above 0)
    generated: int = 0  # tokens sampled so far
    blocks: int = 0  # blocks held while running


def _int_at_least(name: str, value, least: int) -> None:
    """Refuse anything but an int (a bool is not one) of at least ``least``."""
    if type(value) is bool or not isinstance(value, int) or not value >= least:
        raise ValueError(f"{name}: expected an int >= {least}, got {value!r}")


def _blocks_for(tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` slots that hold ``tokens`` tokens (the last one may be partly empty)."""
    return (tokens + block_size - 1) // block_size


class ChunkedScheduler:
    """Kata 13's scheduler with a token budget shared out in chunks: decodes first, then prefills,
    oldest first, each prompt cut where the budget (or the per-request cap) ends. Bookkeeping only."""

    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 long_prefill_token_threshold: int = 0):
        """Positive ints (the threshold >= 0, 0 = no cap); max_num_batched_tokens >= max_num_seqs."""
        raise NotImplementedError("kata 23: ChunkedScheduler.__init__ — see README, task 1")

    def add_request(self, req_id, prompt_len: int, max_new_tokens: int, num_cached: int = 0) -> None:
        """Queue a request at the back; ``num_cached`` prompt tokens are already in the cache (a prefix hit,
        0 … prompt_len - 1). ValueError for a duplicate id, a bad value, or a request whose longest cache,
        prompt_len + max_new_tokens - 1 tokens, needs more than num_blocks blocks."""
        raise NotImplementedError("kata 23: ChunkedScheduler.add_request — see README, task 1")

    def finish(self, req_id) -> None:
        """Free the request's blocks (a waiting one just leaves the queue). Unknown id: ValueError."""
        raise NotImplementedError("kata 23: ChunkedScheduler.finish — see README, task 1")

    def _target(self, request: _Request) -> int:
        """Tokens the request must have computed before it samples next: its prompt and what it made."""
        raise NotImplementedError("kata 23: ChunkedScheduler._target — see README, task 1")

    def _preempt(self, step: Step):
        """Preempt the newest running request: free its blocks, reset its computed count to 0, put it at the
        front of the waiting queue, note it in ``step.preempted``. Returns its id."""
        raise NotImplementedError("kata 23: ChunkedScheduler._preempt — see README, task 1")

    def _schedule_decodes(self, step: Step) -> None:
        """One token for each running request whose prefill is done, oldest first; preempt the newest
        while the blocks run short (it may be the asker: then stop)."""
        raise NotImplementedError("kata 23: ChunkedScheduler._schedule_decodes — see README, task 1")

    def _chunk(self, request: _Request, budget: int) -> int:
        """How many of the request's remaining tokens this step computes: cut at the cap and the budget."""
        raise NotImplementedError("kata 23: ChunkedScheduler._chunk — see README, task 1")

    def _schedule_prefills(self, step: Step) -> None:
        """Chunks for the prompts in flight, oldest first, then admissions first come, first served, each
        while the budget lasts; a waiting request needs a sequence slot and the blocks of its whole prompt,
        and the first that does not fit stops the queue."""
        raise NotImplementedError("kata 23: ChunkedScheduler._schedule_prefills — see README, task 1")

    def schedule(self) -> Step:
        """One step: decodes, then prefill chunks; the books move as if the step ran (a chunk that reaches
        its prompt's end, and every decode, makes one token)."""
        raise NotImplementedError("kata 23: ChunkedScheduler.schedule — see README, task 1")


# -- the engine ----------------------------------------------------------------------------------
class _StepCache:
    """One step's rows over the paged cache, as the model's ``update`` sees them: row b holds
    ``lengths[b]`` new tokens, left-padded to T; its keys come back through its block table, padded to
    the widest table (S = width * block_size), the slots past its own tokens masked."""

    def __init__(self, cache: PagedKVCache, seq_ids: list, lengths: list[int], T: int):
        raise NotImplementedError("kata 23: _StepCache — see README, task 2")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write each row's real columns of ``k``, ``v`` (B, Hkv, T, D); return (B, Hkv, S, D)."""
        raise NotImplementedError("kata 23: _StepCache.update — see README, task 2")


def _check_requests(model, requests, limits: tuple) -> None:
    """Every request well formed and able to finish, before anything runs (kata 13's rules)."""
    raise NotImplementedError("kata 23: _check_requests — see README, task 2")


def _forward(model, cache, rows: list[tuple]) -> list[int]:
    """One batched forward of the rows (seq_id, tokens, start position), left-padded to T; row b's query
    at position p sees its keys 0 … p (the cached prefix and its own chunk up to itself). Returns each
    row's greedy next token, read at its last column."""
    raise NotImplementedError("kata 23: _forward — see README, task 2")


@torch.inference_mode()
def serve_chunked(model, requests: list[tuple], *, num_blocks: int, block_size: int, max_num_seqs: int,
                  max_num_batched_tokens: int, long_prefill_token_threshold: int = 0,
                  eos_token_id: int | None = None) -> dict:
    """Greedy generation with chunked prefill; returns {req_id: new tokens}.

    ``requests``: (req_id, prompt, max_new_tokens, arrival_step). Each ``schedule()`` is ONE forward over
    a paged cache: decode rows (the last token at its position) and prefill chunks (tokens start … start
    + n - 1 of prompt + tokens made so far, at those positions, seeing the cached prefix). Only a chunk
    that reaches the end samples. A request stops after max_new_tokens tokens or its EOS (included).
    """
    raise NotImplementedError("kata 23: serve_chunked — see README, task 2")
