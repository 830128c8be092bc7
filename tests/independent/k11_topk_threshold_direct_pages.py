"""Kata 11, written from its README: torch.topk for the 2k-th best sum, then every candidate at or above it ordered by (sum desc, flat index) so exact ties follow beam then token; pages read through block tables (k_pages[layer][table]) instead of gather; sums kept as a float64 tensor."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grader.paged import PagedKVCache


class _PagedBatch:
    """The live sequences as one batch; reads the pages by block table."""

    def __init__(self, cache, seq_ids, n_tokens):
        self.cache = cache
        self.seq_ids = list(seq_ids)
        self.slots = {}
        for s in self.seq_ids:
            self.slots[s] = cache.reserve(s, n_tokens)

    def _read(self, pages, seq, layer):
        table = torch.tensor(self.cache.block_table(seq), dtype=torch.long, device=pages.device)
        n = self.cache.seq_len(seq)
        blocks = pages[table]  # (nb, H, bs, D)
        nb, H, bs, D = blocks.shape
        return blocks.permute(1, 0, 2, 3).reshape(H, nb * bs, D)[:, :n]

    def update(self, layer, k, v):
        for row, s in enumerate(self.seq_ids):
            self.cache.write(layer, self.slots[s], k[row], v[row])
        kp, vp = self.cache.k_pages[layer], self.cache.v_pages[layer]
        K = torch.stack([self._read(kp, s, layer) for s in self.seq_ids])
        V = torch.stack([self._read(vp, s, layer) for s in self.seq_ids])
        return K, V


@dataclass
class _Beam:
    seq: object
    tokens: list
    total: float


def _walk(live, logp, k, eos_token_id, length_penalty, finished):
    n, V = logp.shape
    base = torch.tensor([b.total for b in live], dtype=torch.float64, device=logp.device)
    flat = (base[:, None] + logp.to(torch.float64)).reshape(-1)
    m = min(2 * k, flat.numel())
    threshold = torch.topk(flat, m).values[-1]
    idx = torch.nonzero(flat >= threshold).reshape(-1).tolist()
    vals = flat.tolist()
    idx.sort(key=lambda i: (-vals[i], i))  # flat index i = beam * V + token
    nxt = []
    for i in idx[:m]:
        b, tok = i // V, i % V
        tokens = [*live[b].tokens, tok]
        if tok == eos_token_id:
            finished.append((tokens, vals[i] / math.pow(len(tokens), length_penalty)))
        else:
            nxt.append((b, tokens, vals[i]))
            if len(nxt) == k:
                break
    return nxt


def _done(live, finished, k, step, N, length_penalty):
    if len(finished) < k:
        return False
    if not live:
        return True
    kth = sorted((s for _, s in finished), reverse=True)[k - 1]
    bound = max(b.total for b in live) / math.pow(N if length_penalty > 0 else step, length_penalty)
    return not bound > kth


def _need_int(name, v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}={v!r}: expected an integer of at least 1")


def _validate(model, prompt, num_beams, max_new_tokens, cache):
    _need_int("num_beams", num_beams)
    _need_int("max_new_tokens", max_new_tokens)
    V = model.config.vocab_size
    if not isinstance(prompt, list) or len(prompt) == 0:
        raise ValueError(f"prompt={prompt!r}: expected a non-empty list of token ids")
    for t in prompt:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0 or t >= V:
            raise ValueError(f"prompt: token {t!r} is not an id in 0 … {V - 1}")
    if not isinstance(cache, PagedKVCache):
        raise ValueError(f"cache={type(cache).__name__}: expected a PagedKVCache")
    kp = cache.k_pages[0]
    if cache.allocator.num_free < kp.shape[0]:
        raise ValueError(f"cache: {kp.shape[0] - cache.allocator.num_free} blocks in use, expected none")
    if kp.dtype != model.dtype:
        raise ValueError(f"cache: dtype {kp.dtype}, expected the model's {model.dtype}")
    cfg = model.config
    for what, got, want in (("layers", len(cache.k_pages), cfg.num_hidden_layers),
                            ("KV heads", kp.shape[1], cfg.num_key_value_heads),
                            ("head width", kp.shape[3], cfg.head_dim)):
        if got != want:
            raise ValueError(f"cache: {got} {what}, expected the model's {want}")


@torch.inference_mode()
def beam_search(model, prompt, num_beams, max_new_tokens, *, cache, eos_token_id=None, length_penalty=1.0):
    _validate(model, prompt, num_beams, max_new_tokens, cache)
    k, N, P = num_beams, max_new_tokens, len(prompt)
    dev = model.device
    work = torch.float64 if model.dtype == torch.float64 else torch.float32
    held = {}  # seq id -> True while in the cache
    ids = iter(range(10 ** 9))
    try:
        root = (next(ids), "prompt")
        cache.add_sequence(root)
        held[root] = True
        logits = model(torch.tensor(prompt, device=dev).view(1, P),
                       position_ids=torch.arange(P, device=dev).view(1, P),
                       cache=_PagedBatch(cache, [root], P))
        logp = logits[:, -1].to(work).log_softmax(-1)
        live, finished, t = [_Beam(root, [], 0.0)], [], 0
        while t < N:
            t += 1
            picks = _walk(live, logp, k, eos_token_id, length_penalty, finished)
            children = []
            for parent, tokens, total in picks:
                sid = (next(ids), "beam")
                cache.fork(live[parent].seq, sid)
                held[sid] = True
                children.append(_Beam(sid, tokens, total))
            for b in live:
                cache.free(b.seq)
                del held[b.seq]
            live = children
            if not live or _done(live, finished, k, t, N, length_penalty):
                live = []  # they cannot win (or there are none)
                break
            if t == N:
                break
            toks = torch.tensor([b.tokens[-1] for b in live], device=dev).view(-1, 1)
            pos = torch.full((len(live), 1), P + t - 1, device=dev)
            logits = model(toks, position_ids=pos, cache=_PagedBatch(cache, [b.seq for b in live], 1))
            logp = logits[:, -1].to(work).log_softmax(-1)
        hyps = [(tokens[:], score, 0, i) for i, (tokens, score) in enumerate(finished)]
        hyps += [(b.tokens[:], b.total / math.pow(len(b.tokens), length_penalty), 1, i) for i, b in enumerate(live)]
        hyps.sort(key=lambda h: (-h[1], h[2], h[3]))
        return [(h[0], h[1]) for h in hyps[:k]]
    finally:
        for sid in list(held):
            cache.free(sid)
