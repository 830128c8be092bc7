"""Kata 13, written from its README: per-request books in plain dicts, the waiting queue a deque, free blocks recounted from what the running hold (ceil formula), one right-padded batch per step whose keys are gathered per row.

Each step's rows are padded on the right (row b's real tokens in columns 0 … n_b - 1), so each row's
next token is read from its own last real column of the full logits. The step cache writes only
real columns and returns, per row, ``gather`` of its sequence padded with zeros to the longest.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from grader.paged import PagedKVCache


@dataclass
class Step:
    prefill: list = field(default_factory=list)
    decode: list = field(default_factory=list)
    preempted: list = field(default_factory=list)


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return value


class Scheduler:
    def __init__(self, num_blocks, block_size, max_num_seqs, max_num_batched_tokens):
        self.num_blocks = _positive_int(num_blocks, "num_blocks")
        self.block_size = _positive_int(block_size, "block_size")
        self.max_num_seqs = _positive_int(max_num_seqs, "max_num_seqs")
        self.max_num_batched_tokens = _positive_int(max_num_batched_tokens, "max_num_batched_tokens")
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens: expected at least max_num_seqs = {max_num_seqs} "
                             f"(every running request decodes one token a step), got {max_num_batched_tokens}")
        self.books: dict = {}  # req_id -> {"prompt_len", "max_new_tokens", "generated", "blocks", "state"}
        self.waiting: deque = deque()
        self.running: list = []  # admission order: the last is the most recently admitted

    def _free_blocks(self) -> int:
        return self.num_blocks - sum(self.books[r]["blocks"] for r in self.running)

    def add_request(self, req_id, prompt_len, max_new_tokens) -> None:
        if req_id in self.books:
            raise ValueError(f"req_id: {req_id!r} is already queued or running")
        if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or prompt_len < 1:
            raise ValueError(f"prompt_len: expected an int >= 1, got {prompt_len!r}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
        longest = prompt_len + max_new_tokens - 1  # the longest recompute prefill
        if longest > self.max_num_batched_tokens:
            raise ValueError(f"max_new_tokens: request {req_id!r} may need a prefill of prompt_len + max_new_tokens - 1 "
                             f"= {longest} tokens, more than max_num_batched_tokens = {self.max_num_batched_tokens}")
        if _blocks_for(longest, self.block_size) > self.num_blocks:
            raise ValueError(f"max_new_tokens: request {req_id!r} may hold {longest} tokens = "
                             f"{_blocks_for(longest, self.block_size)} blocks, more than num_blocks = {self.num_blocks}")
        self.books[req_id] = {"prompt_len": prompt_len, "max_new_tokens": max_new_tokens, "generated": 0,
                              "blocks": 0, "state": "waiting"}
        self.waiting.append(req_id)

    def finish(self, req_id) -> None:
        try:
            book = self.books[req_id]
        except (KeyError, TypeError):
            raise ValueError(f"req_id: {req_id!r} is not a waiting or running request") from None
        if book["state"] == "running":
            self.running.remove(req_id)
        else:
            self.waiting.remove(req_id)
        del self.books[req_id]

    def _preempt(self, step: Step):
        victim = self.running.pop()
        book = self.books[victim]
        book["blocks"], book["state"] = 0, "waiting"
        self.waiting.appendleft(victim)
        step.preempted.append(victim)
        return victim

    def _schedule_decodes(self, step: Step) -> None:
        for req_id in list(self.running):
            if req_id not in self.running:  # preempted for an older request's decode
                continue
            book = self.books[req_id]
            need = _blocks_for(book["prompt_len"] + book["generated"], self.block_size) - book["blocks"]
            lost = False
            while need > self._free_blocks():
                if self._preempt(step) == req_id:
                    lost = True
                    break
            if lost:
                continue
            book["blocks"] += need
            step.decode.append(req_id)

    def _admit(self, step: Step) -> None:
        budget = self.max_num_batched_tokens - len(step.decode)
        while self.waiting and len(self.running) < self.max_num_seqs:
            head = self.waiting[0]
            book = self.books[head]
            tokens = book["prompt_len"] + book["generated"]
            blocks = _blocks_for(tokens, self.block_size)
            if tokens > budget or blocks > self._free_blocks():
                break
            self.waiting.popleft()
            budget -= tokens
            book["blocks"], book["state"] = blocks, "running"
            self.running.append(head)
            step.prefill.append(head)

    def schedule(self) -> Step:
        step = Step()
        self._schedule_decodes(step)
        if not step.preempted:
            self._admit(step)
        for req_id in step.decode + step.prefill:
            self.books[req_id]["generated"] += 1
        return step


# -- the engine ----------------------------------------------------------------------------------
class _StepCache:
    """Right-padded rows: row b's real tokens sit in columns 0 … lengths[b] - 1."""

    def __init__(self, cache: PagedKVCache, seq_ids: list, lengths: list[int], T: int):
        self.cache, self.seq_ids, self.lengths, self.T = cache, list(seq_ids), list(lengths), T
        self.slots = [cache.reserve(s, n) for s, n in zip(self.seq_ids, self.lengths)]
        self.totals = [cache.seq_len(s) for s in self.seq_ids]
        self.S = max(self.totals)

    def update(self, layer, k, v):
        B, H, _, D = k.shape
        K = k.new_zeros(B, H, self.S, D)
        V = v.new_zeros(B, H, self.S, D)
        for b, (seq, n, slots) in enumerate(zip(self.seq_ids, self.lengths, self.slots)):
            self.cache.write(layer, slots, k[b, :, :n], v[b, :, :n])
            kb, vb = self.cache.gather(seq, layer)  # (H, total_b, D)
            K[b, :, :kb.shape[1]] = kb
            V[b, :, :vb.shape[1]] = vb
        return K, V


def _check_int(value, name: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"requests: {name} must be an int >= {low}, got {value!r}")


def _check_requests(model, requests, limits: tuple) -> None:
    num_blocks, block_size, max_num_seqs, max_num_batched_tokens = limits
    probe = Scheduler(num_blocks, block_size, max_num_seqs, max_num_batched_tokens)  # the limits, as it refuses them
    if not isinstance(requests, (list, tuple)):
        raise ValueError(f"requests: expected a list of (req_id, prompt, max_new_tokens, arrival_step), got "
                         f"{type(requests).__name__}")
    vocab = model.config.vocab_size
    ids = set()
    for i, item in enumerate(requests):
        if not isinstance(item, (tuple, list)) or len(item) != 4:
            raise ValueError(f"requests: item {i} should be (req_id, prompt, max_new_tokens, arrival_step), got {item!r}")
        req_id, prompt, max_new, arrival = item
        try:
            duplicate = req_id in ids
            ids.add(req_id)
        except TypeError:
            raise ValueError(f"requests: item {i} has an unhashable req_id {req_id!r}") from None
        if duplicate:
            raise ValueError(f"requests: req_id {req_id!r} appears twice")
        if not isinstance(prompt, (list, tuple)) or len(prompt) == 0:
            raise ValueError(f"requests: the prompt of {req_id!r} must be a non-empty list of token ids, got {prompt!r}")
        for t in prompt:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise ValueError(f"requests: the prompt of {req_id!r} holds {t!r}; token ids are ints 0 … {vocab - 1}")
        _check_int(max_new, f"max_new_tokens of {req_id!r}", 0)
        _check_int(arrival, f"arrival_step of {req_id!r}", 0)
        if max_new > 0:
            try:
                probe.add_request(("probe", i), len(prompt), max_new)
            except ValueError as exc:
                raise ValueError(f"requests: {req_id!r} could never finish ({exc})") from None


def _forward(model, cache, rows: list[tuple]) -> list[int]:
    """rows: (seq_id, tokens, start); one right-padded (B, T) forward; each row's next greedy token."""
    device = model.device
    lengths = [len(toks) for _, toks, _ in rows]
    B, T = len(rows), max(lengths)
    step_cache = _StepCache(cache, [s for s, _, _ in rows], lengths, T)
    S = step_cache.S
    ids = torch.zeros(B, T, dtype=torch.long)
    pos = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, S, dtype=torch.bool)
    for b, (_, toks, start) in enumerate(rows):
        n = len(toks)
        ids[b, :n] = torch.tensor(toks, dtype=torch.long)
        pos[b, :n] = torch.arange(start, start + n)
        mask[b, :n] = torch.arange(S)[None, :] <= torch.arange(start, start + n)[:, None]
    logits = model(ids.to(device), position_ids=pos.to(device), cache=step_cache, attention_mask=mask.to(device))
    last = torch.tensor([n - 1 for n in lengths], device=logits.device)
    picked = logits[torch.arange(B, device=logits.device), last]  # (B, V)
    return [int(x) for x in picked.argmax(dim=-1).tolist()]


def serve(model, requests, *, num_blocks, block_size, max_num_seqs, max_num_batched_tokens, eos_token_id=None):
    _check_requests(model, requests, (num_blocks, block_size, max_num_seqs, max_num_batched_tokens))
    cfg = model.config
    cache = PagedKVCache(num_blocks, block_size, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                         dtype=model.dtype, device=model.device)
    sched = Scheduler(num_blocks, block_size, max_num_seqs, max_num_batched_tokens)
    out = {item[0]: [] for item in requests}
    info = {item[0]: {"prompt": [int(t) for t in item[1]], "max_new": item[2]} for item in requests}
    arrivals: dict[int, list] = {}
    for item in requests:
        if item[2] > 0:
            arrivals.setdefault(item[3], []).append(item[0])
    live = set()
    step = 0
    while arrivals or live:
        if not live:
            step = max(step, min(arrivals))
        for req_id in arrivals.pop(step, []):
            sched.add_request(req_id, len(info[req_id]["prompt"]), info[req_id]["max_new"])
            live.add(req_id)
        decided = sched.schedule()
        for req_id in decided.preempted:
            cache.free(req_id)
        rows = []
        for req_id in decided.decode:
            seq = info[req_id]["prompt"] + out[req_id]
            rows.append((req_id, seq[-1:], len(seq) - 1))
        for req_id in decided.prefill:
            cache.add_sequence(req_id)
            rows.append((req_id, info[req_id]["prompt"] + out[req_id], 0))
        if rows:
            for (req_id, _, _), token in zip(rows, _forward(model, cache, rows)):
                out[req_id].append(token)
                if len(out[req_id]) >= info[req_id]["max_new"] or (eos_token_id is not None and token == eos_token_id):
                    sched.finish(req_id)
                    cache.free(req_id)
                    live.discard(req_id)
        step += 1
    return out
