"""Kata 23 written from its README alone: the scheduler keeps parallel tables indexed by a handle and
walks a budget ledger; the engine left-pads rows and reads each row's keys through its block table,
padded with the null block 0 and masked."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grader.paged import PagedKVCache


@dataclass
class Step:
    decode: list = field(default_factory=list)
    prefill: list = field(default_factory=list)
    preempted: list = field(default_factory=list)


def _ceil(a, b):
    return (a + b - 1) // b


def _int(name, v, low=1):
    if v.__class__ is not int or v < low:
        raise ValueError(f"bad {name}: {v!r} (an int >= {low} is needed)")


class ChunkedScheduler:
    def __init__(self, num_blocks, block_size, max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold=0):
        _int("num_blocks", num_blocks)
        _int("block_size", block_size)
        _int("max_num_seqs", max_num_seqs)
        _int("max_num_batched_tokens", max_num_batched_tokens)
        _int("long_prefill_token_threshold", long_prefill_token_threshold, 0)
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError("bad max_num_batched_tokens: smaller than max_num_seqs")
        self.N, self.P, self.maxseq, self.B = num_blocks, block_size, max_num_seqs, max_num_batched_tokens
        self.cap = long_prefill_token_threshold
        self.handle = {}  # req_id -> index into the tables
        self.ids, self.plen, self.comp, self.gen, self.blk = [], [], [], [], []
        self.order = []  # handles: running in admission order
        self.line = []  # handles: waiting, front first

    def add_request(self, req_id, prompt_len, max_new_tokens, num_cached=0):
        if req_id in self.handle:
            raise ValueError(f"bad req_id: {req_id!r} exists")
        _int("prompt_len", prompt_len)
        _int("max_new_tokens", max_new_tokens)
        _int("num_cached", num_cached, 0)
        if num_cached >= prompt_len:
            raise ValueError(f"bad num_cached: {num_cached} (at most prompt_len - 1)")
        if _ceil(prompt_len + max_new_tokens - 1, self.P) > self.N:
            raise ValueError("bad prompt_len/max_new_tokens: more blocks than num_blocks")
        h = len(self.ids)
        self.handle[req_id] = h
        for table, value in ((self.ids, req_id), (self.plen, prompt_len), (self.comp, num_cached), (self.gen, 0),
                             (self.blk, 0)):
            table.append(value)
        self.line.append(h)

    def finish(self, req_id):
        if req_id not in self.handle:
            raise ValueError(f"bad req_id: {req_id!r} not live")
        h = self.handle.pop(req_id)
        if h in self.order:
            self.order.remove(h)
        else:
            self.line.remove(h)
        self.blk[h] = 0

    def _free(self):
        return self.N - sum(self.blk[h] for h in self.order)

    def _L(self, h):
        return self.plen[h] + self.gen[h]

    def _share(self, h, ledger):
        n = self._L(h) - self.comp[h]
        if self.cap:
            n = min(n, self.cap)
        return min(n, ledger)

    def schedule(self):
        st = Step()
        dec = []
        for h in self.order[:]:
            if h not in self.order or self._L(h) - self.comp[h] > 1:
                continue
            extra = _ceil(self.comp[h] + 1, self.P) - self.blk[h]
            while extra > self._free():
                v = self.order.pop()
                self.blk[v] = self.comp[v] = 0
                self.line.insert(0, v)
                st.preempted.append(self.ids[v])
                if v == h:
                    break
            if h in self.order:
                self.blk[h] += extra
                dec.append(h)
        ledger = self.B - len(dec)
        chunks = []
        for h in self.order:
            if h not in dec and self._share(h, ledger) > 0:
                chunks.append((h, self.comp[h], self._share(h, ledger)))
                ledger -= chunks[-1][2]
        while self.line and ledger > 0 and len(self.order) < self.maxseq:
            h = self.line[0]
            if _ceil(self._L(h), self.P) > self._free():
                break
            self.line.pop(0)
            self.order.append(h)
            self.blk[h] = _ceil(self._L(h), self.P)
            chunks.append((h, self.comp[h], self._share(h, ledger)))
            ledger -= chunks[-1][2]
        for h in dec:
            self.comp[h] += 1
            self.gen[h] += 1
        for h, _, n in chunks:
            self.comp[h] += n
            if self.comp[h] == self._L(h):
                self.gen[h] += 1
        st.decode = [self.ids[h] for h in dec]
        st.prefill = [(self.ids[h], a, n) for h, a, n in chunks]
        return st


class _View:
    def __init__(self, cache, seqs, lens, T):
        self.cache, self.T = cache, T
        self.slots = [cache.reserve(s, n) for s, n in zip(seqs, lens)]
        self.lens = lens
        tabs = [cache.block_table(s) for s in seqs]
        w = max(map(len, tabs))
        self.tab = torch.tensor([t + [0] * (w - len(t)) for t in tabs], device=cache.k_pages[0].device)

    def update(self, layer, k, v):
        for b, n in enumerate(self.lens):
            self.cache.write(layer, self.slots[b], k[b, :, self.T - n:], v[b, :, self.T - n:])
        B, H, _, D = k.shape
        K = self.cache.k_pages[layer][self.tab].permute(0, 2, 1, 3, 4).reshape(B, H, -1, D)  # (B, Hkv, S, D)
        V = self.cache.v_pages[layer][self.tab].permute(0, 2, 1, 3, 4).reshape(B, H, -1, D)
        return K, V


def _one_forward(model, cache, rows):
    T = max(len(x) for _, x, _ in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    pos = torch.zeros(len(rows), T, dtype=torch.long)
    live = torch.zeros(len(rows), T, dtype=torch.bool)
    for b, (_, x, start) in enumerate(rows):
        ids[b, T - len(x):] = torch.tensor(x)
        pos[b, T - len(x):] = torch.arange(start, start + len(x))
        live[b, T - len(x):] = True
    view = _View(cache, [r for r, _, _ in rows], [len(x) for _, x, _ in rows], T)
    S = view.tab.shape[1] * cache.block_size
    mask = (torch.arange(S)[None, None] <= pos[..., None]) & live[..., None]
    out = model(ids.to(model.device), position_ids=pos.to(model.device), cache=view,
                attention_mask=mask.to(model.device), logits_to_keep=1)
    return out[:, -1].argmax(-1).tolist()


def _check_all(model, requests, limits):
    trial = ChunkedScheduler(*limits)
    for i, item in enumerate(requests):
        if not isinstance(item, (tuple, list)) or len(item) != 4:
            raise ValueError(f"requests[{i}] must be a 4-tuple")
        r, prompt, m, at = item
        if not len(prompt) or any(t.__class__ is not int or t < 0 or t >= model.config.vocab_size for t in prompt):
            raise ValueError(f"requests[{i}]: bad prompt")
        _int("max_new_tokens", m, 0)
        _int("arrival_step", at, 0)
        trial.add_request(r, len(prompt), m or 1)


@torch.inference_mode()
def serve_chunked(model, requests, *, num_blocks, block_size, max_num_seqs, max_num_batched_tokens,
                  long_prefill_token_threshold=0, eos_token_id=None):
    limits = (num_blocks, block_size, max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold)
    _check_all(model, requests, limits)
    sch = ChunkedScheduler(*limits)
    cf = model.config
    cache = PagedKVCache(num_blocks, block_size, cf.num_hidden_layers, cf.num_key_value_heads, cf.head_dim,
                         dtype=model.dtype, device=model.device)
    prompt = {r: list(p) for r, p, _, _ in requests}
    new = {r: [] for r, *_ in requests}
    todo = {r: m for r, _, m, _ in requests}
    arrivals = sorted((x for x in requests if x[2] > 0), key=lambda x: x[3])
    step_no, open_ = 0, 0
    while arrivals or open_:
        if not open_:
            step_no = max(step_no, arrivals[0][3])
        while arrivals and arrivals[0][3] <= step_no:
            r, p, m, _ = arrivals.pop(0)
            sch.add_request(r, len(p), m)
            open_ += 1
        s = sch.schedule()
        for r in s.preempted:
            cache.free(r)
        rows = []
        for r in s.decode:
            rows.append((r, [(prompt[r] + new[r])[-1]], len(prompt[r]) + len(new[r]) - 1))
        for r, a, n in s.prefill:
            if a == 0:
                cache.add_sequence(r)
            rows.append((r, (prompt[r] + new[r])[a:a + n], a))
        picks = _one_forward(model, cache, rows)
        for (r, x, a), tok in zip(rows, picks):
            if a + len(x) != len(prompt[r]) + len(new[r]):
                continue
            new[r].append(tok)
            if len(new[r]) == todo[r] or tok == eos_token_id:
                sch.finish(r)
                cache.free(r)
                open_ -= 1
        step_no += 1
    return new
