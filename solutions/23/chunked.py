"""Kata 23 — chunked prefill (reference solution).

Shapes: B rows of one step (decodes and prefill chunks), T the longest row of the step, S the keys
each row is shown (its blocks, padded to the widest table), Hkv KV heads, D head width, V vocabulary.
The cache is ``grader.paged.PagedKVCache`` (kata 06's API); the model is ``grader.nn.Llama`` or
anything with its interface (``config``, ``device``, ``dtype``, ``model(input_ids, position_ids=,
cache=, attention_mask=, logits_to_keep=) -> logits``).
"""
from __future__ import annotations

from collections import deque
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
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}: expected an int >= {least}, got {value!r}")


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class ChunkedScheduler:
    """Kata 13's scheduler with a token budget shared out in chunks: decodes first, then prefills,
    oldest first, each prompt cut where the budget (or the per-request cap) ends. Bookkeeping only."""

    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 long_prefill_token_threshold: int = 0):
        """Positive ints (the threshold >= 0, 0 = no cap); max_num_batched_tokens >= max_num_seqs."""
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size), ("max_num_seqs", max_num_seqs),
                            ("max_num_batched_tokens", max_num_batched_tokens)):
            _int_at_least(name, value, 1)
        _int_at_least("long_prefill_token_threshold", long_prefill_token_threshold, 0)
        if max_num_batched_tokens < max_num_seqs:  # every running request must get its decode token
            raise ValueError(f"max_num_batched_tokens: expected at least max_num_seqs = {max_num_seqs}, "
                             f"got {max_num_batched_tokens}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_num_seqs, self.budget = max_num_seqs, max_num_batched_tokens
        self.cap = long_prefill_token_threshold
        self.free_blocks = num_blocks
        self.requests: dict = {}
        self.waiting: deque = deque()  # ids, front first
        self.running: list = []  # ids in admission order: the newest is last

    def add_request(self, req_id, prompt_len: int, max_new_tokens: int, num_cached: int = 0) -> None:
        """Queue a request at the back; ``num_cached`` prompt tokens are already in the cache (a prefix hit,
        0 … prompt_len - 1). ValueError for a duplicate id, a bad value, or a request whose longest cache,
        prompt_len + max_new_tokens - 1 tokens, needs more than num_blocks blocks."""
        if req_id in self.requests:
            raise ValueError(f"req_id: request {req_id!r} is already in the scheduler")
        _int_at_least("prompt_len", prompt_len, 1)
        _int_at_least("max_new_tokens", max_new_tokens, 1)
        _int_at_least("num_cached", num_cached, 0)
        if num_cached > prompt_len - 1:  # the last prompt token must be computed: its logits give the first token
            raise ValueError(f"num_cached: expected at most prompt_len - 1 = {prompt_len - 1}, got {num_cached}")
        longest = prompt_len + max_new_tokens - 1
        if _blocks_for(longest, self.block_size) > self.num_blocks:
            raise ValueError(f"prompt_len + max_new_tokens: {longest} tokens need "
                             f"{_blocks_for(longest, self.block_size)} blocks; num_blocks = {self.num_blocks}")
        self.requests[req_id] = _Request(prompt_len, max_new_tokens, num_cached)
        self.waiting.append(req_id)

    def finish(self, req_id) -> None:
        """Free the request's blocks (a waiting one just leaves the queue). Unknown id: ValueError."""
        if req_id not in self.requests:
            raise ValueError(f"req_id: no request {req_id!r} in the scheduler (never added, or finished already)")
        request = self.requests.pop(req_id)
        if req_id in self.running:
            self.running.remove(req_id)
            self.free_blocks += request.blocks
        else:
            self.waiting.remove(req_id)

    def _target(self, request: _Request) -> int:
        """Tokens the request must have computed before it samples next: its prompt and what it made."""
        return request.prompt_len + request.generated

    def _preempt(self, step: Step):
        """Preempt the newest running request: free its blocks, reset its computed count to 0, put it at the
        front of the waiting queue, note it in ``step.preempted``. Returns its id."""
        victim = self.running.pop()  # the newest admitted
        request = self.requests[victim]
        self.free_blocks += request.blocks
        request.blocks, request.computed = 0, 0  # its cache is gone: recomputed from token 0
        self.waiting.appendleft(victim)
        step.preempted.append(victim)
        return victim

    def _schedule_decodes(self, step: Step) -> None:
        """One token for each running request whose prefill is done, oldest first; preempt the newest
        while the blocks run short (it may be the asker: then stop)."""
        i = 0
        while i < len(self.running):
            req_id = self.running[i]
            request = self.requests[req_id]
            if request.computed + 1 == self._target(request):  # only its last token is not in the cache
                need = _blocks_for(request.computed + 1, self.block_size) - request.blocks
                while need > self.free_blocks:
                    if self._preempt(step) == req_id:
                        return
                self.free_blocks -= need
                request.blocks += need
                step.decode.append(req_id)
            i += 1

    def _chunk(self, request: _Request, budget: int) -> int:
        """How many of the request's remaining tokens this step computes: cut at the cap and the budget."""
        n = self._target(request) - request.computed
        if self.cap:
            n = min(n, self.cap)
        return min(n, budget)

    def _schedule_prefills(self, step: Step) -> None:
        """Chunks for the prompts in flight, oldest first, then admissions first come, first served, each
        while the budget lasts; a waiting request needs a sequence slot and the blocks of its whole prompt,
        and the first that does not fit stops the queue."""
        budget = self.budget - len(step.decode)  # a decode row takes one token
        decoding = set(step.decode)
        for req_id in self.running:
            request = self.requests[req_id]
            n = self._chunk(request, budget)
            if req_id in decoding or n == 0:
                continue
            step.prefill.append((req_id, request.computed, n))
            budget -= n
        for req_id in list(self.waiting):  # after a preemption its victim, first, cannot fit
            request = self.requests[req_id]
            blocks = _blocks_for(self._target(request), self.block_size)
            if len(self.running) == self.max_num_seqs or budget == 0 or blocks > self.free_blocks:
                break
            self.waiting.remove(req_id)
            self.running.append(req_id)
            self.free_blocks -= blocks
            request.blocks = blocks
            n = self._chunk(request, budget)
            step.prefill.append((req_id, request.computed, n))
            budget -= n

    def schedule(self) -> Step:
        """One step: decodes, then prefill chunks; the books move as if the step ran (a chunk that reaches
        its prompt's end, and every decode, makes one token)."""
        step = Step()
        self._schedule_decodes(step)
        self._schedule_prefills(step)
        for req_id in step.decode:
            request = self.requests[req_id]
            request.computed += 1
            request.generated += 1
        for req_id, _, n in step.prefill:
            request = self.requests[req_id]
            request.computed += n
            if request.computed == self._target(request):  # the prompt's end: its logits give a token
                request.generated += 1
        return step


# -- the engine ----------------------------------------------------------------------------------
class _StepCache:
    """One step's rows over the paged cache, as the model's ``update`` sees them: row b holds
    ``lengths[b]`` new tokens, left-padded to T; its keys come back through its block table, padded to
    the widest table (S = width * block_size), the slots past its own tokens masked."""

    def __init__(self, cache: PagedKVCache, seq_ids: list, lengths: list[int], T: int):
        self.cache = cache
        device = cache.k_pages[0].device
        self.slots = torch.cat([cache.reserve(seq, n) for seq, n in zip(seq_ids, lengths)])  # (N,)
        self.rows = torch.tensor([b for b, n in enumerate(lengths) for _ in range(n)], device=device)
        self.cols = torch.tensor([T - n + j for n in lengths for j in range(n)], device=device)
        tables = [cache.block_table(seq) for seq in seq_ids]
        width = max(len(table) for table in tables)
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
        return (K.transpose(1, 2).reshape(B, H, self.S, D), V.transpose(1, 2).reshape(B, H, self.S, D))


def _check_requests(model, requests, limits: tuple) -> None:
    """Every request well formed and able to finish, before anything runs (kata 13's rules)."""
    probe = ChunkedScheduler(*limits)
    V = model.config.vocab_size
    for i, item in enumerate(requests):
        if not isinstance(item, (tuple, list)) or len(item) != 4:
            raise ValueError(f"requests: item {i} should be (req_id, prompt, max_new_tokens, arrival_step), got {item!r}")
        req_id, prompt, max_new_tokens, arrival = item
        if len(prompt) == 0 or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < V for t in prompt):
            raise ValueError(f"requests: the prompt of {req_id!r} should be a non-empty list of ids in 0 … {V - 1}")
        _int_at_least("max_new_tokens", max_new_tokens, 0)
        _int_at_least("arrival_step", arrival, 0)
        probe.add_request(req_id, len(prompt), max(max_new_tokens, 1))


def _forward(model, cache, rows: list[tuple]) -> list[int]:
    """One batched forward of the rows (seq_id, tokens, start position), left-padded to T; row b's query
    at position p sees its keys 0 … p (the cached prefix and its own chunk up to itself). Returns each
    row's greedy next token, read at its last column."""
    T = max(len(tokens) for _, tokens, _ in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    positions = torch.zeros(len(rows), T, dtype=torch.long)
    for b, (_, tokens, start) in enumerate(rows):
        ids[b, T - len(tokens):] = torch.tensor(tokens)
        positions[b, T - len(tokens):] = torch.arange(start, start + len(tokens))  # a chunk starts at its offset
    step_cache = _StepCache(cache, [seq for seq, _, _ in rows], [len(t) for _, t, _ in rows], T)
    keys = torch.arange(step_cache.S)
    mask = keys[None, None, :] <= positions[:, :, None]  # (B, T, S): the cached prefix and the chunk so far
    real = torch.arange(T)[None, :] >= torch.tensor([T - len(t) for _, t, _ in rows])[:, None]  # (B, T)
    mask &= real[:, :, None]
    logits = model(ids.to(model.device), position_ids=positions.to(model.device), cache=step_cache,
                   attention_mask=mask.to(model.device), logits_to_keep=1)[:, -1]  # (B, V)
    return logits.argmax(-1).tolist()


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
    limits = (num_blocks, block_size, max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold)
    _check_requests(model, requests, limits)
    scheduler = ChunkedScheduler(*limits)
    config = model.config
    cache = PagedKVCache(num_blocks, block_size, config.num_hidden_layers, config.num_key_value_heads,
                         config.head_dim, dtype=model.dtype, device=model.device)
    out = {req_id: [] for req_id, *_ in requests}
    prompts = {req_id: list(prompt) for req_id, prompt, *_ in requests}
    wanted = {req_id: n for req_id, _, n, _ in requests}
    arrivals = deque(sorted((r for r in requests if r[2] > 0), key=lambda r: r[3]))
    live, step_no = 0, 0
    while arrivals or live:
        if not live:
            step_no = max(step_no, arrivals[0][3])
        while arrivals and arrivals[0][3] <= step_no:
            req_id, prompt, n, _ = arrivals.popleft()
            scheduler.add_request(req_id, len(prompt), n)
            live += 1
        step = scheduler.schedule()
        for req_id in step.preempted:
            cache.free(req_id)
        rows = []
        for req_id in step.decode:
            whole = prompts[req_id] + out[req_id]
            rows.append((req_id, whole[-1:], len(whole) - 1))
        for req_id, start, n in step.prefill:
            if start == 0:
                cache.add_sequence(req_id)  # a new cache, or a recompute after a preemption
            rows.append((req_id, (prompts[req_id] + out[req_id])[start:start + n], start))
        if not rows:
            raise RuntimeError(f"step {step_no}: the scheduler scheduled nothing with {live} request(s) unfinished")
        for (req_id, tokens, start), token in zip(rows, _forward(model, cache, rows)):
            if start + len(tokens) < len(prompts[req_id]) + len(out[req_id]):
                continue  # an intermediate chunk: its logits are not a next token
            out[req_id].append(token)
            if len(out[req_id]) == wanted[req_id] or token == eos_token_id:
                scheduler.finish(req_id)
                cache.free(req_id)
                live -= 1
        step_no += 1
    return out
