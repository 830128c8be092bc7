"""Kata 23 written from its README alone: one object per request that knows its own counts, rows
right-padded (each row's last token in its own column), every row's keys read with ``gather``."""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch

from grader.paged import PagedKVCache


@dataclass
class Step:
    decode: list = field(default_factory=list)
    prefill: list = field(default_factory=list)
    preempted: list = field(default_factory=list)


def _check(name, value, low):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}: expected an integer of at least {low}")


@dataclass
class _Seq:
    rid: object
    prompt: int
    cached: int
    made: int = 0
    blocks: int = 0

    def total(self):
        return self.prompt + self.made

    def todo(self):
        return self.total() - self.cached


class ChunkedScheduler:
    def __init__(self, num_blocks, block_size, max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold=0):
        for name, value, low in (("num_blocks", num_blocks, 1), ("block_size", block_size, 1),
                                 ("max_num_seqs", max_num_seqs, 1), ("max_num_batched_tokens", max_num_batched_tokens, 1),
                                 ("long_prefill_token_threshold", long_prefill_token_threshold, 0)):
            _check(name, value, low)
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens} < max_num_seqs={max_num_seqs}")
        self.limits = (num_blocks, block_size, max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold)
        self.seqs: dict = {}
        self.wait: deque = deque()
        self.run: list = []

    def add_request(self, req_id, prompt_len, max_new_tokens, num_cached=0):
        if req_id in self.seqs:
            raise ValueError(f"req_id={req_id!r} already present")
        _check("prompt_len", prompt_len, 1)
        _check("max_new_tokens", max_new_tokens, 1)
        _check("num_cached", num_cached, 0)
        if num_cached > prompt_len - 1:
            raise ValueError(f"num_cached={num_cached} must be below prompt_len={prompt_len}")
        nb, bs = self.limits[:2]
        if -(-(prompt_len + max_new_tokens - 1) // bs) > nb:
            raise ValueError(f"prompt_len + max_new_tokens do not fit num_blocks={nb}")
        self.seqs[req_id] = _Seq(req_id, prompt_len, num_cached)
        self.wait.append(req_id)

    def finish(self, req_id):
        seq = self.seqs.pop(req_id, None)
        if seq is None:
            raise ValueError(f"req_id={req_id!r} is not live")
        if req_id in self.run:
            self.run.remove(req_id)
        else:
            self.wait.remove(req_id)

    def _used(self):
        return sum(self.seqs[r].blocks for r in self.run)

    def _decodes(self, step):
        nb, bs = self.limits[:2]
        for r in list(self.run):
            seq = self.seqs[r]
            if r not in self.run or seq.todo() != 1:
                continue
            want = math.ceil(seq.total() / bs)
            while r in self.run and self._used() - seq.blocks + want > nb:
                victim = self.seqs[self.run.pop()]
                victim.blocks, victim.cached = 0, 0
                self.wait.appendleft(victim.rid)
                step.preempted.append(victim.rid)
            if r in self.run:
                seq.blocks = max(seq.blocks, want)
                step.decode.append(r)

    def _size(self, seq, left):
        cap = self.limits[4]
        return min(seq.todo(), left, cap if cap > 0 else seq.todo())

    def schedule(self):
        nb, bs, max_seqs, budget, _ = self.limits
        step = Step()
        self._decodes(step)
        left = budget - len(step.decode)
        for r in self.run:
            seq = self.seqs[r]
            if r in step.decode or left == 0:
                continue
            n = self._size(seq, left)
            step.prefill.append((r, seq.cached, n))
            left -= n
        while self.wait and left and len(self.run) < max_seqs:
            seq = self.seqs[self.wait[0]]
            need = math.ceil(seq.total() / bs)
            if self._used() + need > nb:
                break
            self.run.append(self.wait.popleft())
            seq.blocks = need
            n = self._size(seq, left)
            step.prefill.append((seq.rid, seq.cached, n))
            left -= n
        for r in step.decode:
            self.seqs[r].cached += 1
            self.seqs[r].made += 1
        for r, _, n in step.prefill:
            seq = self.seqs[r]
            seq.cached += n
            seq.made += seq.cached == seq.total()
        return step


class _Rows:
    """Right-padded rows: row b's tokens in columns 0 … len - 1; keys gathered per row, zero-padded."""

    def __init__(self, cache, ids, lens):
        self.cache, self.ids, self.lens = cache, ids, lens
        self.slots = [cache.reserve(r, n) for r, n in zip(ids, lens)]

    def update(self, layer, k, v):
        Ks, Vs = [], []
        for b, (r, n) in enumerate(zip(self.ids, self.lens)):
            self.cache.write(layer, self.slots[b], k[b, :, :n], v[b, :, :n])
            K, V = self.cache.gather(r, layer)  # (Hkv, S_b, D)
            Ks.append(K)
            Vs.append(V)
        S = max(K.shape[1] for K in Ks)
        pad = lambda X: torch.nn.functional.pad(X, (0, 0, 0, S - X.shape[1]))  # noqa: E731
        return torch.stack([pad(K) for K in Ks]), torch.stack([pad(V) for V in Vs])  # (B, Hkv, S, D)


def _step(model, cache, rows):
    T = max(len(t) for _, t, _ in rows)
    dev = model.device
    ids = torch.zeros(len(rows), T, dtype=torch.long, device=dev)
    pos = torch.zeros(len(rows), T, dtype=torch.long, device=dev)
    for b, (_, toks, start) in enumerate(rows):
        ids[b, :len(toks)] = torch.tensor(toks, device=dev)
        pos[b, :len(toks)] = torch.arange(start, start + len(toks), device=dev)
    view = _Rows(cache, [r for r, _, _ in rows], [len(t) for _, t, _ in rows])
    S = max(start + len(t) for _, t, start in rows)
    mask = torch.arange(S, device=dev)[None, None, :] <= pos[:, :, None]  # (B, T, S)
    logits = model(ids, position_ids=pos, cache=view, attention_mask=mask)  # (B, T, V)
    last = torch.tensor([len(t) - 1 for _, t, _ in rows], device=dev)
    return logits[torch.arange(len(rows), device=dev), last].argmax(-1).tolist()


@torch.no_grad()
def serve_chunked(model, requests, *, num_blocks, block_size, max_num_seqs, max_num_batched_tokens,
                  long_prefill_token_threshold=0, eos_token_id=None):
    limits = (num_blocks, block_size, max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold)
    probe = ChunkedScheduler(*limits)
    for item in requests:
        if not isinstance(item, (tuple, list)) or len(item) != 4:
            raise ValueError(f"requests: {item!r} is not (req_id, prompt, max_new_tokens, arrival_step)")
        r, prompt, m, at = item
        V = model.config.vocab_size
        if len(prompt) == 0 or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < V for t in prompt):
            raise ValueError(f"requests: prompt of {r!r} must hold ids 0 … {V - 1}")
        _check("max_new_tokens", m, 0)
        _check("arrival_step", at, 0)
        probe.add_request(r, len(prompt), max(1, m))
    sched = ChunkedScheduler(*limits)
    c = model.config
    cache = PagedKVCache(num_blocks, block_size, c.num_hidden_layers, c.num_key_value_heads, c.head_dim,
                         dtype=model.dtype, device=model.device)
    toks = {r: list(p) for r, p, _, _ in requests}
    plen = {r: len(p) for r, p, _, _ in requests}
    quota = {r: m for r, _, m, _ in requests}
    queue = deque(sorted((x for x in requests if x[2]), key=lambda x: x[3]))
    busy, t = 0, 0
    while queue or busy:
        if busy == 0:
            t = max(t, queue[0][3])
        while queue and queue[0][3] <= t:
            r, p, m, _ = queue.popleft()
            sched.add_request(r, len(p), m)
            busy += 1
        step = sched.schedule()
        for r in step.preempted:
            cache.free(r)
        rows = [(r, toks[r][-1:], len(toks[r]) - 1) for r in step.decode]
        for r, start, n in step.prefill:
            if start == 0:
                cache.add_sequence(r)
            rows.append((r, toks[r][start:start + n], start))
        for (r, piece, start), nxt in zip(rows, _step(model, cache, rows)):
            if start + len(piece) < len(toks[r]):
                continue
            toks[r].append(nxt)
            if len(toks[r]) - plen[r] == quota[r] or nxt == eos_token_id:
                sched.finish(r)
                cache.free(r)
                busy -= 1
        t += 1
    return {r: toks[r][plen[r]:] for r, *_ in requests}
