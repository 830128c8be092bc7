"""Kata 23 written from its README alone: the books in plain dicts, and every step's tokens packed
into ONE row (1, N) with a block-diagonal mask, as vLLM lays a step out: no padding."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from grader.paged import PagedKVCache


@dataclass
class Step:
    decode: list = field(default_factory=list)
    prefill: list = field(default_factory=list)
    preempted: list = field(default_factory=list)


def _need_int(name, value, least):
    if type(value) is not int or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return value


class ChunkedScheduler:
    def __init__(self, num_blocks, block_size, max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold=0):
        self.nb = _need_int("num_blocks", num_blocks, 1)
        self.bs = _need_int("block_size", block_size, 1)
        self.seqs = _need_int("max_num_seqs", max_num_seqs, 1)
        self.budget = _need_int("max_num_batched_tokens", max_num_batched_tokens, 1)
        self.cap = _need_int("long_prefill_token_threshold", long_prefill_token_threshold, 0)
        if self.budget < self.seqs:
            raise ValueError("max_num_batched_tokens must be at least max_num_seqs")
        self.prompt, self.done, self.made, self.held = {}, {}, {}, {}
        self.queue, self.active = [], []

    def add_request(self, req_id, prompt_len, max_new_tokens, num_cached=0):
        if req_id in self.prompt:
            raise ValueError(f"req_id {req_id!r} is taken")
        _need_int("prompt_len", prompt_len, 1)
        _need_int("max_new_tokens", max_new_tokens, 1)
        _need_int("num_cached", num_cached, 0)
        if num_cached >= prompt_len:
            raise ValueError("num_cached must leave at least one prompt token to compute")
        if math.ceil((prompt_len + max_new_tokens - 1) / self.bs) > self.nb:
            raise ValueError("prompt_len + max_new_tokens need more blocks than num_blocks")
        self.prompt[req_id], self.done[req_id], self.made[req_id], self.held[req_id] = prompt_len, num_cached, 0, 0
        self.queue.append(req_id)

    def finish(self, req_id):
        if req_id not in self.prompt:
            raise ValueError(f"req_id {req_id!r} unknown")
        (self.active if req_id in self.active else self.queue).remove(req_id)
        for book in (self.prompt, self.done, self.made, self.held):
            del book[req_id]

    def _free(self):
        return self.nb - sum(self.held[r] for r in self.active)

    def _known(self, r):
        return self.prompt[r] + self.made[r]

    def schedule(self):
        step = Step()
        for r in list(self.active):
            if r not in self.active or self._known(r) - self.done[r] != 1:
                continue
            want = math.ceil(self._known(r) / self.bs)
            while r in self.active and want - self.held[r] > self._free():
                victim = self.active.pop()
                self.held[victim], self.done[victim] = 0, 0
                self.queue.insert(0, victim)
                step.preempted.append(victim)
            if r in self.active:
                self.held[r] = max(self.held[r], want)
                step.decode.append(r)
        left = self.budget - len(step.decode)
        limit = self.cap or float("inf")
        for r in [r for r in self.active if r not in step.decode]:
            n = int(min(self._known(r) - self.done[r], limit, left))
            if n > 0:
                step.prefill.append((r, self.done[r], n))
                left -= n
        while self.queue and left > 0 and len(self.active) < self.seqs:
            r = self.queue[0]
            if math.ceil(self._known(r) / self.bs) > self._free():
                break
            self.queue.pop(0)
            self.active.append(r)
            self.held[r] = math.ceil(self._known(r) / self.bs)
            n = int(min(self._known(r) - self.done[r], limit, left))
            step.prefill.append((r, self.done[r], n))
            left -= n
        for r in step.decode:
            self.done[r] += 1
            self.made[r] += 1
        for r, _, n in step.prefill:
            self.done[r] += n
            if self.done[r] == self._known(r):
                self.made[r] += 1
        return step


class _Packed:
    """One row of N tokens from several requests: each request's keys read back in turn, side by side."""

    def __init__(self, cache, pieces):
        self.cache = cache
        self.slots = torch.cat([cache.reserve(r, len(toks)) for r, toks, _ in pieces])
        self.tables = [cache.block_table(r) for r, _, _ in pieces]

    def update(self, layer, k, v):
        self.cache.write(layer, self.slots, k[0], v[0])  # (Hkv, N, D)
        ks, vs = [], []
        for table in self.tables:
            idx = torch.tensor(table, device=k.device)
            K = self.cache.k_pages[layer][idx]  # (n, Hkv, P, D)
            V = self.cache.v_pages[layer][idx]
            ks.append(K.permute(1, 0, 2, 3).flatten(1, 2))  # (Hkv, n * P, D)
            vs.append(V.permute(1, 0, 2, 3).flatten(1, 2))
        return torch.cat(ks, 1)[None], torch.cat(vs, 1)[None]  # (1, Hkv, S, D)


def _run_step(model, cache, pieces):
    """pieces: (req_id, tokens, start). Returns each piece's greedy next token."""
    ids = torch.tensor([t for _, toks, _ in pieces for t in toks], device=model.device)[None]
    pos = torch.tensor([s + j for _, toks, s in pieces for j in range(len(toks))], device=model.device)[None]
    packed = _Packed(cache, pieces)
    N = ids.shape[1]
    S = sum(len(t) for t in packed.tables) * cache.block_size
    mask = torch.zeros(1, N, S, dtype=torch.bool, device=model.device)
    row, col = 0, 0
    for (_, toks, start), table in zip(pieces, packed.tables):
        for j in range(len(toks)):
            mask[0, row + j, col:col + start + j + 1] = True  # own keys 0 … its position
        row += len(toks)
        col += len(table) * cache.block_size
    logits = model(ids, position_ids=pos, cache=packed, attention_mask=mask)[0]  # (N, V)
    ends = torch.tensor([len(t) for _, t, _ in pieces]).cumsum(0) - 1
    return logits[ends.to(logits.device)].argmax(-1).tolist()


def _validate(model, requests, limits):
    probe = ChunkedScheduler(*limits)
    for item in requests:
        if not isinstance(item, (list, tuple)) or len(item) != 4:
            raise ValueError(f"requests: bad item {item!r}")
        r, prompt, m, arrival = item
        if not prompt or any(type(t) is not int or not 0 <= t < model.config.vocab_size for t in prompt):
            raise ValueError(f"requests: bad prompt for {r!r}")
        _need_int("max_new_tokens", m, 0)
        _need_int("arrival_step", arrival, 0)
        probe.add_request(r, len(prompt), max(m, 1))


@torch.no_grad()
def serve_chunked(model, requests, *, num_blocks, block_size, max_num_seqs, max_num_batched_tokens,
                  long_prefill_token_threshold=0, eos_token_id=None):
    limits = (num_blocks, block_size, max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold)
    _validate(model, requests, limits)
    sched = ChunkedScheduler(*limits)
    cfg = model.config
    cache = PagedKVCache(num_blocks, block_size, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                         dtype=model.dtype, device=model.device)
    result = {r: [] for r, *_ in requests}
    text = {r: list(p) for r, p, *_ in requests}
    pending = sorted([x for x in requests if x[2] > 0], key=lambda x: x[3])
    goal = {r: m for r, _, m, _ in requests}
    alive, now = set(), 0
    while pending or alive:
        if not alive:
            now = max(now, pending[0][3])
        while pending and pending[0][3] <= now:
            r, p, m, _ = pending.pop(0)
            sched.add_request(r, len(p), m)
            alive.add(r)
        step = sched.schedule()
        for r in step.preempted:
            cache.free(r)
        pieces = [(r, text[r][-1:], len(text[r]) - 1) for r in step.decode]
        for r, start, n in step.prefill:
            if start == 0:
                cache.add_sequence(r)
            pieces.append((r, text[r][start:start + n], start))
        for (r, toks, start), tok in zip(pieces, _run_step(model, cache, pieces)):
            if start + len(toks) == len(text[r]):
                result[r].append(tok)
                text[r].append(tok)
                if len(result[r]) == goal[r] or tok == eos_token_id:
                    sched.finish(r)
                    cache.free(r)
                    alive.discard(r)
        now += 1
    return result
