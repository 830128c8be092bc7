"""Kata 13, written from its README: per-request dataclasses, the waiting queue a plain list, a running free-block counter (a decode takes a block exactly when its cache length is a multiple of block_size), one left-padded batch per step whose keys are read straight from the pages through padded block tables.

The step's forward is a (B, T) batch with every row's last token in column T - 1; each row's keys
are its block table's pages laid end to end (tables padded with block 0 to the widest, those keys
masked), so S = widest table * block_size; the model keeps only the last column's logits.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grader.paged import PagedKVCache


@dataclass
class Step:
    prefill: list = field(default_factory=list)
    decode: list = field(default_factory=list)
    preempted: list = field(default_factory=list)


@dataclass(slots=True)
class _Request:
    req_id: object
    prompt_len: int
    max_new_tokens: int
    generated: int = 0
    blocks: int = 0
    running: bool = False

    @property
    def cached(self) -> int:
        """Tokens its cache holds while running: everything but the newest token."""
        return self.prompt_len + self.generated - 1


def _int_at_least(value, low: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer >= {low}; got {type(value).__name__} {value!r}")
    if value < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {value}")
    return value


class Scheduler:
    def __init__(self, num_blocks, block_size, max_num_seqs, max_num_batched_tokens):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size),
                            ("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
            _int_at_least(value, 1, name)
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens must be >= max_num_seqs ({max_num_seqs}); "
                             f"got {max_num_batched_tokens}")
        self._nb, self._bs = num_blocks, block_size
        self._max_seqs, self._budget = max_num_seqs, max_num_batched_tokens
        self._free = num_blocks
        self._reqs: dict = {}
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []  # oldest admitted first

    def add_request(self, req_id, prompt_len, max_new_tokens) -> None:
        if req_id in self._reqs:
            raise ValueError(f"req_id {req_id!r} is already known to the scheduler (duplicate)")
        _int_at_least(prompt_len, 1, "prompt_len")
        _int_at_least(max_new_tokens, 1, "max_new_tokens")
        worst = prompt_len + max_new_tokens - 1
        if worst > self._budget:
            raise ValueError(f"prompt_len + max_new_tokens - 1 = {worst} tokens would not fit one recompute "
                             f"prefill under max_num_batched_tokens={self._budget}")
        blocks, rem = divmod(worst, self._bs)
        if blocks + (rem > 0) > self._nb:
            raise ValueError(f"prompt_len + max_new_tokens - 1 = {worst} tokens need {blocks + (rem > 0)} blocks "
                             f"of {self._bs}; num_blocks={self._nb}")
        r = _Request(req_id, prompt_len, max_new_tokens)
        self._reqs[req_id] = r
        self._waiting.append(r)

    def finish(self, req_id) -> None:
        try:
            r = self._reqs.pop(req_id)
        except (KeyError, TypeError):
            raise ValueError(f"req_id {req_id!r}: no such waiting or running request") from None
        if r.running:
            self._running.remove(r)
            self._free += r.blocks
            r.blocks, r.running = 0, False
        else:
            self._waiting.remove(r)

    def _preempt(self, step: Step):
        r = self._running.pop()  # the most recently admitted
        self._free += r.blocks
        r.blocks, r.running = 0, False
        self._waiting.insert(0, r)
        step.preempted.append(r.req_id)
        return r.req_id

    def _schedule_decodes(self, step: Step) -> None:
        i = 0
        while i < len(self._running):
            r = self._running[i]
            extra = 1 if r.cached % self._bs == 0 else 0  # the token fed now opens a new block
            while extra > self._free and r.running:
                self._preempt(step)
            if not r.running:
                break  # it was the newest: nobody after it is running
            self._free -= extra
            r.blocks += extra
            step.decode.append(r.req_id)
            i += 1

    def _admit(self, step: Step) -> None:
        left = self._budget - len(step.decode)
        while self._waiting and len(self._running) < self._max_seqs:
            r = self._waiting[0]
            n = r.prompt_len + r.generated
            need = (n + self._bs - 1) // self._bs
            if n > left or need > self._free:
                return
            self._waiting.pop(0)
            left -= n
            self._free -= need
            r.blocks, r.running = need, True
            self._running.append(r)
            step.prefill.append(r.req_id)

    def schedule(self) -> Step:
        step = Step()
        self._schedule_decodes(step)
        if not step.preempted:
            self._admit(step)
        for req_id in (*step.decode, *step.prefill):
            self._reqs[req_id].generated += 1
        return step


# -- the engine ----------------------------------------------------------------------------------
class _StepCache:
    """Left-padded rows; keys read from the pages through each row's block table."""

    def __init__(self, cache: PagedKVCache, seq_ids: list, lengths: list[int], T: int):
        self.cache, self.T = cache, T
        slots, rows, cols = [], [], []
        for b, (seq, n) in enumerate(zip(seq_ids, lengths)):
            slots.append(cache.reserve(seq, n))
            rows += [b] * n
            cols += range(T - n, T)
        device = cache.k_pages[0].device
        self.slots = torch.cat(slots).to(device)
        self.rows = torch.tensor(rows, dtype=torch.long, device=device)
        self.cols = torch.tensor(cols, dtype=torch.long, device=device)
        tables = [cache.block_table(seq) for seq in seq_ids]
        width = max(len(t) for t in tables)
        self.tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=device)
        self.S = width * cache.k_pages[0].shape[2]

    def update(self, layer, k, v):
        # k, v (B, H, T, D): the real tokens, as (H, N, D) in slot order
        kr = k[self.rows, :, self.cols].transpose(0, 1)
        vr = v[self.rows, :, self.cols].transpose(0, 1)
        self.cache.write(layer, self.slots, kr, vr)
        B, n = self.tables.shape
        out = []
        for pages in (self.cache.k_pages[layer], self.cache.v_pages[layer]):
            g = pages[self.tables]  # (B, n, H, P, D)
            out.append(g.permute(0, 2, 1, 3, 4).reshape(B, g.shape[2], self.S, g.shape[4]))
        return out[0], out[1]


def _check_requests(model, requests, limits: tuple) -> None:
    Scheduler(*limits)  # ValueError naming the limit
    num_blocks, block_size, _, budget = limits
    if not isinstance(requests, list):
        raise ValueError(f"requests must be a list of 4-tuples, got {type(requests).__name__}")
    V = int(model.config.vocab_size)
    seen = set()
    for pos, item in enumerate(requests):
        if not isinstance(item, (tuple, list)) or len(item) != 4:
            raise ValueError(f"requests[{pos}] must be a 4-tuple (req_id, prompt, max_new_tokens, arrival_step), "
                             f"got {item!r}")
        req_id, prompt, max_new, arrival = item
        if req_id in seen:
            raise ValueError(f"requests: duplicate req_id {req_id!r}")
        seen.add(req_id)
        if not isinstance(prompt, (list, tuple)):
            raise ValueError(f"requests[{pos}]: prompt must be a list of token ids, got {type(prompt).__name__}")
        if not prompt:
            raise ValueError(f"requests[{pos}]: prompt_len must be >= 1 (the prompt of {req_id!r} is empty)")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 or t >= V for t in prompt):
            raise ValueError(f"requests[{pos}]: prompt of {req_id!r} must hold int ids 0 … {V - 1}, got {list(prompt)}")
        _int_at_least(max_new, 0, f"requests[{pos}]: max_new_tokens")
        _int_at_least(arrival, 0, f"requests[{pos}]: arrival_step")
        if max_new:
            worst = len(prompt) + max_new - 1
            if worst > budget or -(-worst // block_size) > num_blocks:
                raise ValueError(f"requests[{pos}]: {req_id!r} could never finish: {worst} tokens against "
                                 f"max_num_batched_tokens={budget}, num_blocks={num_blocks} of {block_size}")


def _forward(model, cache, rows: list[tuple]) -> list[int]:
    device = model.device
    B = len(rows)
    lengths = [len(tokens) for _, tokens, _ in rows]
    T = max(lengths)
    step_cache = _StepCache(cache, [seq for seq, _, _ in rows], lengths, T)
    ids = torch.zeros(B, T, dtype=torch.long)
    pos = torch.zeros(B, T, dtype=torch.long)
    qpos = torch.full((B, T), -1, dtype=torch.long)  # -1: a pad query, shown nothing
    for b, (_, tokens, start) in enumerate(rows):
        n = len(tokens)
        ids[b, T - n:] = torch.as_tensor(tokens, dtype=torch.long)
        pos[b, T - n:] = torch.arange(start, start + n)
        qpos[b, T - n:] = pos[b, T - n:]
    keys = torch.arange(step_cache.S)
    mask = keys[None, None, :] <= qpos[:, :, None]  # (B, T, S): its own keys up to itself
    logits = model(ids.to(device), position_ids=pos.to(device), cache=step_cache,
                   attention_mask=mask.to(device), logits_to_keep=1)
    return logits[:, -1].argmax(dim=-1).tolist()


def serve(model, requests, *, num_blocks, block_size, max_num_seqs, max_num_batched_tokens, eos_token_id=None):
    limits = (num_blocks, block_size, max_num_seqs, max_num_batched_tokens)
    _check_requests(model, requests, limits)
    c = model.config
    cache = PagedKVCache(num_blocks, block_size, c.num_hidden_layers, c.num_key_value_heads, c.head_dim,
                         dtype=model.dtype, device=model.device)
    sched = Scheduler(*limits)
    tokens = {rid: [] for rid, _, _, _ in requests}
    prompts = {rid: list(p) for rid, p, _, _ in requests}
    budgets = {rid: m for rid, _, m, _ in requests}
    queue = sorted(((a, i, rid) for i, (rid, _, m, a) in enumerate(requests) if m > 0))  # arrival, list order
    active = 0
    now, q = 0, 0
    while q < len(queue) or active:
        if not active and queue[q][0] > now:
            now = queue[q][0]  # idle: jump to the next arrival
        while q < len(queue) and queue[q][0] <= now:
            rid = queue[q][2]
            sched.add_request(rid, len(prompts[rid]), budgets[rid])
            active += 1
            q += 1
        step = sched.schedule()
        for rid in step.preempted:
            cache.free(rid)
        rows = []
        for rid in step.prefill:
            cache.add_sequence(rid)
            rows.append((rid, prompts[rid] + tokens[rid], 0))
        for rid in step.decode:
            rows.append((rid, tokens[rid][-1:], len(prompts[rid]) + len(tokens[rid]) - 1))
        if rows:
            for (rid, _, _), tok in zip(rows, _forward(model, cache, rows)):
                tokens[rid].append(int(tok))
                if len(tokens[rid]) == budgets[rid] or tok == eos_token_id:
                    sched.finish(rid)
                    cache.free(rid)
                    active -= 1
        now += 1
    return tokens
