"""Kata 11, written from its README: per-beam Python loops ranking (sum, beam, token) tuples, log_softmax in float64 for every model, all rows written in one write per layer (slots concatenated), the prompt's sequence kept until the end, string sequence ids."""
from __future__ import annotations

from dataclasses import dataclass

import torch


class _PagedBatch:
    def __init__(self, cache, seq_ids, n_tokens):
        self.cache, self.seq_ids, self.n = cache, list(seq_ids), n_tokens
        per_seq = [cache.reserve(s, n_tokens) for s in self.seq_ids]
        self.slots = torch.cat([s.to("cpu") for s in per_seq]) if per_seq else torch.empty(0, dtype=torch.long)

    def update(self, layer, k, v):
        B, H, T, D = k.shape
        # (B, H, T, D) -> (H, B*T, D): row b's tokens sit at slots [b*T, (b+1)*T)
        kk = k.permute(1, 0, 2, 3).reshape(H, B * T, D)
        vv = v.permute(1, 0, 2, 3).reshape(H, B * T, D)
        self.cache.write(layer, self.slots.to(self.cache.k_pages[layer].device), kk, vv)
        pairs = [self.cache.gather(s, layer) for s in self.seq_ids]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


@dataclass
class _Beam:
    seq: object
    tokens: list
    total: float


def _walk(live, logp, k, eos_token_id, length_penalty, finished):
    rows = logp.double().cpu().tolist()
    cands = []
    for b, beam in enumerate(live):
        for tok, lp in enumerate(rows[b]):
            cands.append((beam.total + lp, b, tok))
    cands.sort(key=lambda c: (-c[0], c[1], c[2]))
    out = []
    for total, b, tok in cands[: 2 * k]:
        toks = live[b].tokens + [tok]
        if eos_token_id is not None and tok == eos_token_id:
            finished.append((toks, total / len(toks) ** length_penalty))
            continue
        out.append((b, toks, total))
        if len(out) >= k:
            break
    return out


def _done(live, finished, k, step, N, length_penalty):
    if len(finished) < k:
        return False
    scores = sorted([s for _, s in finished], reverse=True)
    if not live:
        return True
    L = N if length_penalty > 0 else step
    return max(b.total for b in live) / L ** length_penalty <= scores[k - 1]


def _validate(model, prompt, num_beams, max_new_tokens, cache):
    for name, val in (("num_beams", num_beams), ("max_new_tokens", max_new_tokens)):
        if type(val) is not int or val < 1:
            raise ValueError(f"{name} must be an int of at least 1, got {val!r}")
    V = model.config.vocab_size
    if type(prompt) is not list or len(prompt) == 0:
        raise ValueError(f"prompt must be a non-empty list of ints, got {type(prompt).__name__} {prompt!r}")
    bad = [t for t in prompt if type(t) is not int or t < 0 or t >= V]
    if bad:
        raise ValueError(f"prompt holds {bad[0]!r}, not a token id in [0, {V})")
    try:
        pages = cache.k_pages
        free, total = cache.allocator.num_free, pages[0].shape[0]
    except (AttributeError, TypeError, IndexError):
        raise ValueError(f"cache must be a PagedKVCache, got {type(cache).__name__}") from None
    if free != total:
        raise ValueError(f"cache has {total - free} blocks in use; it must start empty")
    if pages[0].dtype != model.dtype:
        raise ValueError(f"cache is {pages[0].dtype}, the model {model.dtype}")
    c = model.config
    if len(pages) != c.num_hidden_layers:
        raise ValueError(f"cache has {len(pages)} layers, the model {c.num_hidden_layers}")
    if pages[0].shape[1] != c.num_key_value_heads:
        raise ValueError(f"cache has {pages[0].shape[1]} KV heads, the model {c.num_key_value_heads}")
    if pages[0].shape[3] != c.head_dim:
        raise ValueError(f"cache has head width {pages[0].shape[3]}, the model {c.head_dim}")


@torch.inference_mode()
def beam_search(model, prompt, num_beams, max_new_tokens, *, cache, eos_token_id=None, length_penalty=1.0):
    _validate(model, prompt, num_beams, max_new_tokens, cache)
    k, N, P = num_beams, max_new_tokens, len(prompt)
    device = model.device
    alive_ids = set()
    counter = 0

    def fresh():
        nonlocal counter
        counter += 1
        return f"beam-{counter}"

    try:
        root = "prompt"
        cache.add_sequence(root)
        alive_ids.add(root)
        x = torch.tensor(prompt, dtype=torch.long, device=device).unsqueeze(0)
        logits = model(x, position_ids=torch.arange(P, device=device).unsqueeze(0),
                       cache=_PagedBatch(cache, [root], P))
        logp = torch.log_softmax(logits[:, -1:].squeeze(1).double(), dim=-1)
        live = [_Beam(root, [], 0.0)]
        finished = []
        steps = 0
        while True:
            steps += 1
            chosen = _walk(live, logp, k, eos_token_id, length_penalty, finished)
            new_live = []
            for parent, toks, total in chosen:
                sid = fresh()
                cache.fork(live[parent].seq, sid)
                alive_ids.add(sid)
                new_live.append(_Beam(sid, toks, total))
            for beam in live:
                if beam.seq != root:
                    cache.free(beam.seq)
                    alive_ids.discard(beam.seq)
            live = new_live
            if not live or _done(live, finished, k, steps, N, length_penalty) or steps == N:
                break
            x = torch.tensor([[b.tokens[-1]] for b in live], dtype=torch.long, device=device)
            positions = torch.full_like(x, P + steps - 1)
            logits = model(x, position_ids=positions, cache=_PagedBatch(cache, [b.seq for b in live], 1))
            logp = torch.log_softmax(logits[:, -1].double(), dim=-1)
        hyps = [(list(t), float(s)) for t, s in finished]
        if steps == N and live and not _done(live, finished, k, steps, N, length_penalty):
            hyps += [(list(b.tokens), b.total / len(b.tokens) ** length_penalty) for b in live]
        ranked = sorted(range(len(hyps)), key=lambda i: (-hyps[i][1], i))
        return [hyps[i] for i in ranked[:k]]
    finally:
        for sid in list(alive_ids):
            cache.free(sid)
