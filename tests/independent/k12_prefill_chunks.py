"""Kata 12, written from its README: the target prefilled in a forward of its own, a list-of-chunks cache, a python acceptance loop.

The target first reads the whole prompt in one forward (no proposals): its last row is the first
new token, which becomes the pending token. Every later target forward is a verification round.
The cache keeps, per layer, a list of (K, V) chunks as they arrived; ``crop`` walks the list and
cuts the chunk that straddles the boundary.
"""
from __future__ import annotations

import torch


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class RollbackKVCache:
    """Per layer: a list of (k, v) chunks, each (B, Hkv, t, D), in arrival order."""

    def __init__(self):
        self._chunks: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def _length(self, layer: int) -> int:
        return sum(c[0].shape[2] for c in self._chunks.get(layer, []))

    def update(self, layer, k, v):
        if not _is_int(layer) or layer < 0:
            raise ValueError(f"layer: expected an int >= 0, got {layer!r}")
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                got = f"a {t.dim()}-D tensor of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name}: expected a 4-D tensor (B, Hkv, T, D), got {got}")
        if tuple(v.shape) != tuple(k.shape):
            raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
        held = self._chunks.get(layer, [])
        if held:
            ref = held[0][0]
            want = (ref.shape[0], ref.shape[1], ref.shape[3])
            got = (k.shape[0], k.shape[1], k.shape[3])
            if want != got:
                raise ValueError(f"k: layer {layer} holds (batch, heads, head width) = {want}, "
                                 f"got {got} (shape {tuple(k.shape)})")
        # Own copies: the caller's tensors (often strided views of a projection) stay theirs.
        held.append((k.detach().clone(), v.detach().clone()))
        self._chunks[layer] = held
        keys = torch.cat([c[0] for c in held], dim=2)
        values = torch.cat([c[1] for c in held], dim=2)
        return keys, values

    def seq_len(self, layer=0) -> int:
        if not _is_int(layer) or layer < 0:
            raise ValueError(f"layer: expected an int >= 0, got {layer!r}")
        return self._length(layer)

    def crop(self, n) -> None:
        total = self.seq_len()
        if not _is_int(n) or not 0 <= n <= total:
            raise ValueError(f"n: expected an int from 0 to seq_len() = {total}, got {n!r}")
        for layer, held in self._chunks.items():
            kept, seen = [], 0
            for ck, cv in held:
                t = ck.shape[2]
                if seen + t <= n:
                    kept.append((ck, cv))
                    seen += t
                    continue
                room = n - seen
                if room > 0:
                    kept.append((ck[:, :, :room].clone(), cv[:, :, :room].clone()))
                break
            self._chunks[layer] = kept


def _check_args(target, draft, prompt, max_new_tokens, k) -> None:
    if not _is_int(k) or k < 1:
        raise ValueError(f"k: expected an int of at least 1 (proposals per round), got {k!r}")
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an int of at least 0, got {max_new_tokens!r}")
    vocab = target.config.vocab_size
    if not isinstance(prompt, list) or len(prompt) == 0:
        raise ValueError(f"prompt: expected a non-empty list of token ids, got {prompt!r}")
    for i, tok in enumerate(prompt):
        if not _is_int(tok) or not 0 <= tok < vocab:
            raise ValueError(f"prompt: token {i} is {tok!r}; expected an int id in 0 .. {vocab - 1}")
    if draft.config.vocab_size != vocab:
        raise ValueError(f"draft: its vocabulary has {draft.config.vocab_size} tokens, the target's has {vocab}")


def _forward(model, tokens, start, cache, stats, counter):
    if cache.seq_len() != start:
        raise ValueError(f"start: the cache holds {cache.seq_len()} tokens, got start={start}")
    device = model.device
    ids = torch.tensor([list(tokens)], dtype=torch.long, device=device)
    positions = torch.arange(start, start + len(tokens), dtype=torch.long, device=device)[None, :]
    stats[counter] += 1
    logits = model(ids, position_ids=positions, cache=cache)
    return logits[0]


def _propose(draft, seq, cache, n, stats):
    proposals: list[int] = []
    if n <= 0:
        return proposals
    have = cache.seq_len()
    feed = list(seq[have:])  # everything accepted that the draft has not read yet
    for _ in range(n):
        logits = _forward(draft, feed, have, cache, stats, "draft_forwards")
        have += len(feed)
        tok = int(logits[-1].argmax().item())
        proposals.append(tok)
        feed = [tok]
    return proposals


@torch.inference_mode()
def speculative_generate(target, draft, prompt, max_new_tokens, k=4, *, eos_token_id=None):
    _check_args(target, draft, prompt, max_new_tokens, k)
    stats = {"target_forwards": 0, "draft_forwards": 0, "proposed": 0, "accepted": 0}
    out: list[int] = []
    if max_new_tokens == 0:
        return out, stats
    tcache, dcache = RollbackKVCache(), RollbackKVCache()

    # The target's prefill, alone: the prompt in, the first new token out (it is now pending).
    logits = _forward(target, prompt, 0, tcache, stats, "target_forwards")
    first = int(logits[-1].argmax().item())
    out.append(first)
    seq = list(prompt) + [first]
    if eos_token_id is not None and first == eos_token_id:
        return out, stats

    while len(out) < max_new_tokens:
        room = max_new_tokens - len(out)
        n = min(k, room - 1)  # n proposals can give n + 1 tokens
        proposals = _propose(draft, seq, dcache, n, stats)
        base = tcache.seq_len()  # = len(seq) - 1: the pending token is seq[-1]
        rows = _forward(target, [seq[-1]] + proposals, base, tcache, stats, "target_forwards")
        stats["proposed"] += len(proposals)
        accepted = 0
        new: list[int] = []
        for j, p in enumerate(proposals):
            choice = int(rows[j].argmax().item())
            if choice != p:
                new.append(choice)
                break
            new.append(p)
            accepted += 1
        else:
            new.append(int(rows[len(proposals)].argmax().item()))
        stats["accepted"] += accepted
        kept = len(seq) + accepted  # tokens whose keys both caches may keep (all but the new pending one)
        tcache.crop(kept)
        dcache.crop(min(dcache.seq_len(), kept))
        stop = False
        for tok in new:
            out.append(tok)
            seq.append(tok)
            if eos_token_id is not None and tok == eos_token_id:
                stop = True
                break
        if stop:
            break
    return out, stats
