"""Kata 11, WRONG: frees its sequences only when the search ends normally; an error from the model leaves them (and their blocks) in the cache."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from grader.paged import PagedKVCache


class _PagedBatch:
    def __init__(self, cache, seq_ids, n_tokens):
        self.cache = cache
        self.seq_ids = list(seq_ids)
        self.slots = [cache.reserve(s, n_tokens) for s in self.seq_ids]

    def update(self, layer, k, v):
        Ks, Vs = [], []
        for b, (s, slots) in enumerate(zip(self.seq_ids, self.slots)):
            self.cache.write(layer, slots, k[b], v[b])
        for s in self.seq_ids:
            K, V = self.cache.gather(s, layer)
            Ks.append(K)
            Vs.append(V)
        return torch.stack(Ks), torch.stack(Vs)


@dataclass
class _Beam:
    seq: object
    tokens: list
    total: float


def _score(total, n, length_penalty):
    return total / (n ** length_penalty)


def _walk(live, logp, k, eos_token_id, length_penalty, finished):
    n, V = logp.shape
    sums = torch.tensor([b.total for b in live], dtype=torch.float64, device=logp.device)[:, None] + logp.double()
    flat = sums.reshape(-1)
    order = torch.sort(flat, descending=True, stable=True).indices[: 2 * k].tolist()
    values = flat.tolist()
    nxt = []
    for idx in order:
        parent, tok = divmod(idx, V)
        tokens = live[parent].tokens + [tok]
        total = values[idx]
        if eos_token_id is not None and tok == eos_token_id:
            finished.append((tokens, _score(total, len(tokens), length_penalty)))
        else:
            nxt.append((parent, tokens, total))
            if len(nxt) == k:
                break
    return nxt


def _done(live, finished, k, step, N, length_penalty):
    if len(finished) < k or not live:
        return len(finished) >= k and not live
    kth = sorted((s for _, s in finished), reverse=True)[k - 1]
    L = N if length_penalty > 0 else step
    best = max(b.total for b in live)
    return best / (L ** length_penalty) <= kth


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _check(model, prompt, num_beams, max_new_tokens, cache):
    if not _is_int(num_beams) or num_beams < 1:
        raise ValueError(f"num_beams: expected an int >= 1, got {num_beams!r}")
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
    cfg = model.config
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(f"prompt: expected a non-empty list of token ids, got {prompt!r}")
    for t in prompt:
        if not _is_int(t) or not 0 <= t < cfg.vocab_size:
            raise ValueError(f"prompt: expected token ids in 0 … {cfg.vocab_size - 1}, got {t!r}")
    if not isinstance(cache, PagedKVCache):
        raise ValueError(f"cache: expected a PagedKVCache, got {type(cache).__name__}")
    pages = cache.k_pages
    n_blocks = pages[0].shape[0]
    if cache.allocator.num_free != n_blocks:
        raise ValueError(f"cache: expected every block free, {n_blocks - cache.allocator.num_free} in use")
    if pages[0].dtype != model.dtype:
        raise ValueError(f"cache: expected the model's dtype {model.dtype}, got {pages[0].dtype}")
    want = (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
    got = (len(pages), pages[0].shape[1], pages[0].shape[3])
    if want != got:
        raise ValueError(f"cache: expected (layers, KV heads, head width) {want} like the model, got {got}")


@torch.inference_mode()
def beam_search(model, prompt, num_beams, max_new_tokens, *, cache, eos_token_id=None, length_penalty=1.0):
    _check(model, prompt, num_beams, max_new_tokens, cache)
    k, N, P = num_beams, max_new_tokens, len(prompt)
    dev = model.device
    wide = torch.float64 if model.dtype == torch.float64 else torch.float32
    owned = []  # sequence ids in the cache
    next_id = [0]

    def new_id():
        next_id[0] += 1
        return next_id[0]

    try:
        root = new_id()
        cache.add_sequence(root)
        owned.append(root)
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=dev)
        pos = torch.arange(P, device=dev)[None]
        logits = model(ids, position_ids=pos, cache=_PagedBatch(cache, [root], P))
        logp = torch.log_softmax(logits[:, -1].to(wide), dim=-1)
        live = [_Beam(root, [], 0.0)]
        finished = []
        ran_all = False
        for step in range(1, N + 1):
            picks = _walk(live, logp, k, eos_token_id, length_penalty, finished)
            born = []
            for parent, tokens, total in picks:
                sid = new_id()
                cache.fork(live[parent].seq, sid)
                owned.append(sid)
                born.append(_Beam(sid, tokens, total))
            for old in live:
                cache.free(old.seq)
                owned.remove(old.seq)
            live = born
            if not live or _done(live, finished, k, step, N, length_penalty):
                break
            if step == N:
                ran_all = True
                break
            ids = torch.tensor([[b.tokens[-1]] for b in live], dtype=torch.long, device=dev)
            pos = torch.full((len(live), 1), P + step - 1, dtype=torch.long, device=dev)
            logits = model(ids, position_ids=pos, cache=_PagedBatch(cache, [b.seq for b in live], 1))
            logp = torch.log_softmax(logits[:, -1].to(wide), dim=-1)
        pool = [(list(t), s) for t, s in finished]
        if ran_all:
            pool += [(list(b.tokens), _score(b.total, len(b.tokens), length_penalty)) for b in live]
        pool.sort(key=lambda h: -h[1])  # stable: finished (in order) before live on ties
        for sid in owned:  # wrong: only on the way out of a search that ran to its end
            cache.free(sid)
        return pool[:k]
    finally:
        pass
