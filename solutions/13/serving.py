"""Kata 13 — continuous batching with preemption (reference solution).

Shapes: B rows of one step (prefills + decodes), T the longest row of the step (a prefill's
length, or 1), N the real tokens of the step, S the keys each row is shown (its blocks, padded to
the widest table), Hkv KV heads, P block size, D head width, V vocabulary. The cache is
``grader.paged.PagedKVCache`` (kata 06's API); the model is ``grader.nn.Llama`` or anything with
its interface (``config``, ``device``, ``dtype``, ``model(input_ids, position_ids=, cache=,
attention_mask=, logits_to_keep=) -> logits``).
"""
from __future__ import annotations

from collections import deque
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


def _positive_int(name: str, value, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}: expected an int >= {least}, got {value!r}")


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class Scheduler:
    """Decides, step by step, which requests prefill, which decode and which are preempted.

    Bookkeeping only (no tensors): it counts blocks of ``block_size`` tokens the way a paged
    cache hands them out, and assumes every scheduled step runs: a prefill produces one token,
    a decode one more.
    """

    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int):
        """Positive ints; ValueError naming max_num_batched_tokens when it is below max_num_seqs."""
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size), ("max_num_seqs", max_num_seqs),
                            ("max_num_batched_tokens", max_num_batched_tokens)):
            _positive_int(name, value)
        if max_num_batched_tokens < max_num_seqs:  # every running request must get its decode token
            raise ValueError(f"max_num_batched_tokens: expected at least max_num_seqs = {max_num_seqs}, "
                             f"got {max_num_batched_tokens}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.free_blocks = num_blocks
        self.requests: dict = {}  # every request not finished
        self.waiting: deque = deque()  # ids, front first
        self.running: list = []  # ids in admission order (a re-admission goes last): the newest is last

    def add_request(self, req_id, prompt_len: int, max_new_tokens: int) -> None:
        """Queue a request at the back. ValueError for a duplicate id, a bad length, or a request whose
        prompt_len + max_new_tokens - 1 tokens exceed the token budget or need more than num_blocks blocks."""
        if req_id in self.requests:
            raise ValueError(f"req_id: request {req_id!r} is already in the scheduler")
        _positive_int("prompt_len", prompt_len)
        _positive_int("max_new_tokens", max_new_tokens)
        longest = prompt_len + max_new_tokens - 1  # the last token is never fed back
        if longest > self.max_num_batched_tokens or _blocks_for(longest, self.block_size) > self.num_blocks:
            raise ValueError(f"prompt_len + max_new_tokens: a request of {prompt_len} + {max_new_tokens} tokens may "
                             f"need {longest} tokens in one recompute prefill and "
                             f"{_blocks_for(longest, self.block_size)} blocks; the limits are "
                             f"max_num_batched_tokens = {self.max_num_batched_tokens}, num_blocks = {self.num_blocks}")
        self.requests[req_id] = _Request(prompt_len, max_new_tokens)
        self.waiting.append(req_id)

    def finish(self, req_id) -> None:
        """The caller's word that ``req_id`` produced its last token, or is dropped: free its blocks (a waiting
        request holds none: it leaves the queue). Unknown id: ValueError."""
        if req_id not in self.requests:
            raise ValueError(f"req_id: no request {req_id!r} in the scheduler (never added, or finished already)")
        request = self.requests.pop(req_id)
        if req_id in self.running:
            self.running.remove(req_id)
            self.free_blocks += request.blocks
        else:
            self.waiting.remove(req_id)

    def _preempt(self, step: Step):
        """Preempt the most recently admitted running request: its blocks are free again, it waits at the
        front of the queue and is noted in ``step.preempted``. Returns its id."""
        victim = self.running.pop()  # running is in admission order: the newest is last
        request = self.requests[victim]
        self.free_blocks += request.blocks
        request.blocks = 0
        self.waiting.appendleft(victim)  # recomputed first, before anyone who never ran
        step.preempted.append(victim)
        return victim

    def _schedule_decodes(self, step: Step) -> None:
        """A decode slot for each running request, oldest admitted first, with the blocks its next token
        needs; while blocks run short, preempt the newest (it may be the request itself: then stop)."""
        i = 0
        while i < len(self.running):
            req_id = self.running[i]
            request = self.requests[req_id]
            # Its last token goes into the cache: prompt + generated tokens in all.
            need = _blocks_for(request.prompt_len + request.generated, self.block_size) - request.blocks
            while need > self.free_blocks:
                if self._preempt(step) == req_id:  # it was the newest itself
                    return
            self.free_blocks -= need
            request.blocks += need
            request.generated += 1
            step.decode.append(req_id)
            i += 1

    def _admit(self, step: Step) -> None:
        """First come, first served: admit waiting requests as whole prefills (a recompute's generated
        tokens included) while max_num_seqs, the token budget the decodes left and the free blocks allow;
        the first that does not fit stops the queue."""
        budget = self.max_num_batched_tokens - len(step.decode)  # a decode token counts 1
        for req_id in list(self.waiting):
            request = self.requests[req_id]
            tokens = request.prompt_len + request.generated  # a recompute prefills what it generated too
            blocks = _blocks_for(tokens, self.block_size)
            if len(self.running) == self.max_num_seqs or tokens > budget or blocks > self.free_blocks:
                break  # strict first come, first served: nobody jumps the queue
            self.waiting.remove(req_id)
            budget -= tokens
            self.free_blocks -= blocks
            request.blocks, request.generated = blocks, request.generated + 1
            self.running.append(req_id)
            step.prefill.append(req_id)

    def schedule(self) -> Step:
        """One step: a decode slot for each running request, oldest first, preempting the most recently
        admitted when blocks run out (to the front of the waiting queue); then, only if nobody was
        preempted, first-come-first-served admissions of whole prefills within blocks, max_num_seqs and
        the token budget (a decode counts 1 token)."""
        step = Step()
        self._schedule_decodes(step)
        if not step.preempted:  # a step that preempts admits no one
            self._admit(step)
        return step


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
        self.cache = cache
        device = cache.k_pages[0].device
        # One reservation per step, one write per layer: every row's new slots together (N,).
        self.slots = torch.cat([cache.reserve(seq, n) for seq, n in zip(seq_ids, lengths)])
        rows = [b for b, n in enumerate(lengths) for _ in range(n)]
        cols = [T - n + j for n in lengths for j in range(n)]  # the real columns of each row
        self.rows, self.cols = torch.tensor(rows, device=device), torch.tensor(cols, device=device)
        tables = [cache.block_table(seq) for seq in seq_ids]
        width = max(len(table) for table in tables)
        # A short table is padded with its own first block: read, then masked, never written.
        self.tables = torch.tensor([t + t[:1] * (width - len(t)) for t in tables], device=device)  # (B, n)
        self.S = width * cache.block_size

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write each row's real columns of ``k``, ``v`` (B, Hkv, T, D); return (B, Hkv, S, D)."""
        B, H, _, D = k.shape
        new_k = k[self.rows, :, self.cols].transpose(0, 1)  # (N, Hkv, D) -> (Hkv, N, D)
        new_v = v[self.rows, :, self.cols].transpose(0, 1)
        self.cache.write(layer, self.slots, new_k, new_v)
        K = self.cache.k_pages[layer][self.tables]  # (B, n, Hkv, P, D)
        V = self.cache.v_pages[layer][self.tables]
        return (K.transpose(1, 2).reshape(B, H, self.S, D),  # (B, Hkv, n * P, D)
                V.transpose(1, 2).reshape(B, H, self.S, D))


def _check_requests(model, requests, limits: tuple) -> None:
    """Every request well formed (a 4-tuple; a non-empty prompt of ids 0 … V - 1; max_new_tokens and
    arrival_step ints >= 0; no duplicate id) and able to finish, before anything runs: ValueError naming
    ``requests`` or the field, and the limits as the ``Scheduler`` refuses them."""
    probe = Scheduler(*limits)  # the scheduler's own checks: duplicate ids, requests that could never finish
    for i, item in enumerate(requests):
        if not isinstance(item, (tuple, list)) or len(item) != 4:
            raise ValueError(f"requests: item {i} should be (req_id, prompt, max_new_tokens, arrival_step), got {item!r}")
        req_id, prompt, max_new_tokens, arrival = item
        V = model.config.vocab_size
        if len(prompt) == 0 or not all(isinstance(t, int) and 0 <= t < V for t in prompt):
            raise ValueError(f"requests: the prompt of {req_id!r} should be a non-empty list of ids in 0 … {V - 1}")
        _positive_int("max_new_tokens", max_new_tokens, least=0)
        _positive_int("arrival_step", arrival, least=0)
        probe.add_request(req_id, len(prompt), max(max_new_tokens, 1))


def _forward(model, cache, rows: list[tuple]) -> list[int]:
    """One batched forward of the step's rows (seq_id, tokens, start position), left-padded to T,
    each row's mask (B, T, S) showing only its own keys; returns each row's greedy next token."""
    device = model.device
    T = max(len(tokens) for _, tokens, _ in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    positions = torch.zeros(len(rows), T, dtype=torch.long)
    for b, (_, tokens, start) in enumerate(rows):  # left padding: every row's last token is in column T-1
        ids[b, T - len(tokens):] = torch.tensor(tokens)
        positions[b, T - len(tokens):] = torch.arange(start, start + len(tokens))
    step_cache = _StepCache(cache, [seq for seq, _, _ in rows], [len(t) for _, t, _ in rows], T)
    # Row b's query at column T-n+j is its token start+j: it sees keys 0 … start+j, never a pad key.
    keys = torch.arange(step_cache.S)
    mask = keys[None, None, :] <= positions[:, :, None]  # (B, T, S)
    real = torch.arange(T)[None, :] >= torch.tensor([T - len(t) for _, t, _ in rows])[:, None]  # (B, T)
    mask &= real[:, :, None]  # a pad query sees nothing (the model lets it see everything; its output is unused)
    logits = model(ids.to(device), position_ids=positions.to(device), cache=step_cache,
                   attention_mask=mask.to(device), logits_to_keep=1)[:, -1]  # (B, V)
    return logits.argmax(-1).tolist()


@torch.inference_mode()
def serve(model, requests: list[tuple], *, num_blocks: int, block_size: int, max_num_seqs: int,
          max_num_batched_tokens: int, eos_token_id: int | None = None) -> dict:
    """Greedy generation for every request with continuous batching; returns {req_id: new tokens}.

    ``requests``: (req_id, prompt, max_new_tokens, arrival_step). Each ``schedule()`` call is one step
    and ONE batched forward of ``model`` over a paged cache: prefill rows (prompt + tokens generated
    before a preemption, positions from 0) and decode rows (the last token, at its own position) side
    by side, each row's mask showing only its own keys. A request stops after max_new_tokens tokens or
    its EOS (included); max_new_tokens = 0 gives []. Call ``finish`` after the step that made the last token.
    """
    limits = (num_blocks, block_size, max_num_seqs, max_num_batched_tokens)
    _check_requests(model, requests, limits)
    scheduler = Scheduler(*limits)
    config = model.config
    cache = PagedKVCache(num_blocks, block_size, config.num_hidden_layers, config.num_key_value_heads,
                         config.head_dim, dtype=model.dtype, device=model.device)
    out = {req_id: [] for req_id, *_ in requests}
    prompts = {req_id: list(prompt) for req_id, prompt, *_ in requests}
    wanted = {req_id: n for req_id, _, n, _ in requests}
    arrivals = deque(sorted((r for r in requests if r[2] > 0), key=lambda r: r[3]))  # stable: list order kept
    cached = {}  # req_id -> tokens in its cache: the position of its next token
    live, step_no = 0, 0
    while arrivals or live:
        if not live:
            step_no = max(step_no, arrivals[0][3])  # nothing to run: jump to the next arrival
        while arrivals and arrivals[0][3] <= step_no:
            req_id, prompt, n, _ = arrivals.popleft()
            scheduler.add_request(req_id, len(prompt), n)
            live += 1
        step = scheduler.schedule()
        for req_id in step.preempted:
            cache.free(req_id)  # its keys are recomputed when it is admitted again
        rows = []
        for req_id in step.prefill:  # the prompt plus what it generated before a preemption
            cache.add_sequence(req_id)
            rows.append((req_id, prompts[req_id] + out[req_id], 0))
            cached[req_id] = len(prompts[req_id]) + len(out[req_id])
        for req_id in step.decode:  # its last token, at the position after everything cached
            rows.append((req_id, out[req_id][-1:], cached[req_id]))
            cached[req_id] += 1
        if not rows:  # the policy always runs someone while a request is live; looping on would hang
            raise RuntimeError(f"step {step_no}: the scheduler scheduled nothing with {live} request(s) unfinished")
        for (req_id, _, _), token in zip(rows, _forward(model, cache, rows)):
            out[req_id].append(token)
            if len(out[req_id]) == wanted[req_id] or token == eos_token_id:
                scheduler.finish(req_id)
                cache.free(req_id)
                live -= 1
        step_no += 1
    return out
