"""Kata 13 written from its README alone, with the layout vLLM uses: every step's tokens packed into
ONE row, a block-diagonal causal mask keeping each request to its own keys, no padding at all."""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch

from grader.paged import PagedKVCache


@dataclass
class Step:
    prefill: list = field(default_factory=list)
    decode: list = field(default_factory=list)
    preempted: list = field(default_factory=list)


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return value


class Scheduler:
    def __init__(self, num_blocks, block_size, max_num_seqs, max_num_batched_tokens):
        self.num_blocks = _positive("num_blocks", num_blocks)
        self.block_size = _positive("block_size", block_size)
        self.max_num_seqs = _positive("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = _positive("max_num_batched_tokens", max_num_batched_tokens)
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens: expected at least max_num_seqs = {max_num_seqs}, "
                             f"got {max_num_batched_tokens}")
        self.free = num_blocks
        self.info: dict = {}  # req_id -> [prompt_len, generated, blocks held]
        self.waiting: deque = deque()
        self.running: list = []  # admission order

    def _blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def add_request(self, req_id, prompt_len, max_new_tokens) -> None:
        if req_id in self.info:
            raise ValueError(f"req_id: request {req_id!r} was added already")
        _positive("prompt_len", prompt_len)
        _positive("max_new_tokens", max_new_tokens)
        longest = prompt_len + max_new_tokens - 1
        if longest > self.max_num_batched_tokens or self._blocks(longest) > self.num_blocks:
            raise ValueError(f"prompt_len, max_new_tokens: {prompt_len} + {max_new_tokens} - 1 = {longest} tokens "
                             f"must fit max_num_batched_tokens = {self.max_num_batched_tokens} and "
                             f"{self.num_blocks} blocks of {self.block_size}")
        self.info[req_id] = [prompt_len, 0, 0]
        self.waiting.append(req_id)

    def finish(self, req_id) -> None:
        if req_id not in self.info:
            raise ValueError(f"req_id: no request {req_id!r}")
        self.free += self.info.pop(req_id)[2]
        (self.running if req_id in self.running else self.waiting).remove(req_id)

    def _evict(self, step: Step):
        victim = self.running.pop()
        self.free += self.info[victim][2]
        self.info[victim][2] = 0
        self.waiting.appendleft(victim)
        step.preempted.append(victim)
        return victim

    def schedule(self) -> Step:
        step = Step()
        i = 0
        while i < len(self.running):
            r = self.running[i]
            p, g, held = self.info[r]
            need = self._blocks(p + g) - held
            while need > self.free:
                if self._evict(step) == r:
                    break
            if r in self.running:
                self.free -= need
                self.info[r][2] += need
                step.decode.append(r)
                i += 1
        if not step.preempted:
            budget = self.max_num_batched_tokens - len(step.decode)
            while self.waiting:
                r = self.waiting[0]
                tokens = self.info[r][0] + self.info[r][1]
                need = self._blocks(tokens)
                if len(self.running) >= self.max_num_seqs or tokens > budget or need > self.free:
                    break
                self.waiting.popleft()
                self.running.append(r)
                self.free -= need
                self.info[r][2] = need
                budget -= tokens
                step.prefill.append(r)
        for r in step.decode + step.prefill:
            self.info[r][1] += 1
        return step


class _Packed:
    """The cache as the model sees it during one packed forward: the row's segments, one per request."""

    def __init__(self, cache: PagedKVCache, segments: list):
        self.cache, self.segments = cache, segments  # (seq_id, start in the row, length, slots)

    def update(self, layer, k, v):
        keys, values = [], []
        for seq, at, n, slots in self.segments:
            self.cache.write(layer, slots, k[0, :, at:at + n], v[0, :, at:at + n])
            K, V = self.cache.gather(seq, layer)
            keys.append(K)
            values.append(V)
        return torch.cat(keys, dim=1)[None], torch.cat(values, dim=1)[None]


def _step_forward(model, cache, rows) -> dict:
    """rows: (req_id, tokens to feed, position of the first). One forward; returns each row's next token."""
    ids, positions, segments, keys_before = [], [], [], []
    for r, tokens, start in rows:
        segments.append((r, len(ids), len(tokens), cache.reserve(r, len(tokens))))
        keys_before.append(start)
        ids += tokens
        positions += range(start, start + len(tokens))
    N = len(ids)
    S = sum(start + len(tokens) for _, tokens, start in rows)
    mask = torch.zeros(N, S, dtype=torch.bool)
    column = 0
    for (_, at, n, _), start in zip(segments, keys_before):
        for j in range(n):
            mask[at + j, column:column + start + j + 1] = True
        column += start + n
    device = model.device
    logits = model(torch.tensor([ids]).to(device), position_ids=torch.tensor([positions]).to(device),
                   cache=_Packed(cache, segments), attention_mask=mask[None].to(device))
    last = [at + n - 1 for _, at, n, _ in segments]
    picked = logits[0, last].argmax(-1).tolist()
    return {r: int(t) for (r, _, _), t in zip(rows, picked)}


def _count(what: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"requests: {what} must be an int >= 0, got {value!r}")
    return value


def _validate(requests, limits: dict, vocab: int) -> list:
    probe = Scheduler(limits["num_blocks"], limits["block_size"], limits["max_num_seqs"],
                      limits["max_num_batched_tokens"])
    seen = set()
    for item in requests:
        if not isinstance(item, (list, tuple)) or len(item) != 4:
            raise ValueError(f"requests: each item is (req_id, prompt, max_new_tokens, arrival_step), got {item!r}")
        r, prompt, n, arrival = item
        if r in seen:
            raise ValueError(f"requests: request id {r!r} appears twice")
        seen.add(r)
        bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab]
        if not prompt or bad:
            raise ValueError(f"requests: the prompt of {r!r} must be a non-empty list of ids below {vocab}, "
                             f"got {list(prompt)!r}")
        _count(f"max_new_tokens of request {r!r}", n)
        _count(f"arrival_step of request {r!r}", arrival)
        if n > 0:
            probe.add_request(r, len(prompt), n)
    return sorted((x for x in requests if x[2] > 0), key=lambda x: x[3])  # stable: list order within a step


@torch.no_grad()
def serve(model, requests, *, num_blocks, block_size, max_num_seqs, max_num_batched_tokens, eos_token_id=None):
    limits = {"num_blocks": num_blocks, "block_size": block_size, "max_num_seqs": max_num_seqs,
              "max_num_batched_tokens": max_num_batched_tokens}
    pending = deque(_validate(requests, limits, model.config.vocab_size))
    out = {r: [] for r, *_ in requests}
    prompts = {r: list(prompt) for r, prompt, *_ in requests}
    wanted = {r: n for r, _, n, _ in requests}
    sched = Scheduler(*limits.values())
    cfg = model.config
    cache = PagedKVCache(num_blocks, block_size, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                         dtype=model.dtype, device=model.device)
    live, step_no = set(), 0
    while pending or live:
        if not live:
            step_no = max(step_no, pending[0][3])
        while pending and pending[0][3] <= step_no:
            r, _, n, _ = pending.popleft()
            sched.add_request(r, len(prompts[r]), n)
            live.add(r)
        step = sched.schedule()
        for r in step.preempted:
            cache.free(r)
        rows = [(r, [out[r][-1]], len(prompts[r]) + len(out[r]) - 1) for r in step.decode]
        for r in step.prefill:
            cache.add_sequence(r)
            rows.append((r, prompts[r] + out[r], 0))
        if rows:
            for r, token in _step_forward(model, cache, rows).items():
                out[r].append(token)
                if len(out[r]) == wanted[r] or token == eos_token_id:
                    sched.finish(r)
                    cache.free(r)
                    live.discard(r)
        step_no += 1
    return out
