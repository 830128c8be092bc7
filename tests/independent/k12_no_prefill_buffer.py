"""Kata 12 written from its README alone, with two choices the README leaves open: the cache is a
preallocated buffer per layer that doubles when full and hands out views of it (a crop only moves
the length), and there is no separate prefill: the first round's target forward covers the whole
prompt and the draft's first proposals at once, as assisted generation in Transformers does."""
from __future__ import annotations

import torch


def _bad(name: str, expected: str, got) -> ValueError:
    return ValueError(f"{name}: expected {expected}, got {got!r}")


def _is_index(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class RollbackKVCache:
    def __init__(self):
        self._buffers: dict[int, list[torch.Tensor]] = {}  # layer -> [K buffer, V buffer], (B, Hkv, capacity, D)
        self._length = {}

    def update(self, layer, k, v):
        if not _is_index(layer) or layer < 0:
            raise _bad("layer", "an int >= 0", layer)
        for name, x in (("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor) or x.dim() != 4:
                raise _bad(name, "a 4-D tensor (batch, kv_heads, seq, head_dim)",
                           tuple(x.shape) if isinstance(x, torch.Tensor) else x)
        if v.shape != k.shape or v.dtype != k.dtype:
            raise _bad("v", f"a tensor like k {tuple(k.shape)} {k.dtype}", (tuple(v.shape), v.dtype))
        B, H, T, D = k.shape
        n = self._length.get(layer, 0)
        if layer in self._buffers:
            K = self._buffers[layer][0]
            if (K.shape[0], K.shape[1], K.shape[3]) != (B, H, D) or K.dtype != k.dtype:
                raise _bad("k", f"(batch, kv_heads, head_dim) = {(K.shape[0], K.shape[1], K.shape[3])} "
                                f"in {K.dtype}", (tuple(k.shape), k.dtype))
            if n + T > K.shape[2]:
                grown = max(2 * K.shape[2], n + T)
                for i, old in enumerate(self._buffers[layer]):
                    new = old.new_zeros(B, H, grown, D)
                    new[:, :, :n] = old[:, :, :n]
                    self._buffers[layer][i] = new
        else:
            self._buffers[layer] = [k.new_zeros(B, H, max(T, 16), D) for _ in range(2)]
        K, V = self._buffers[layer]
        K[:, :, n:n + T] = k
        V[:, :, n:n + T] = v
        self._length[layer] = n + T
        return K[:, :, :n + T], V[:, :, :n + T]

    def seq_len(self, layer=0):
        if not _is_index(layer) or layer < 0:
            raise _bad("layer", "an int >= 0", layer)
        return self._length.get(layer, 0)

    def crop(self, n):
        if not _is_index(n) or not 0 <= n <= self.seq_len():
            raise _bad("n", f"an int from 0 to seq_len() = {self.seq_len()}", n)
        for layer in self._length:
            self._length[layer] = min(self._length[layer], n)


def _check_args(target, draft, prompt, max_new_tokens, k):
    if not _is_index(k) or k < 1:
        raise _bad("k", "an int >= 1", k)
    if not _is_index(max_new_tokens) or max_new_tokens < 0:
        raise _bad("max_new_tokens", "an int >= 0", max_new_tokens)
    vocab = target.config.vocab_size
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise _bad("prompt", "a non-empty list of token ids", prompt)
    if any(not _is_index(t) or not 0 <= t < vocab for t in prompt):
        raise _bad("prompt", f"token ids in 0 … {vocab - 1}", prompt)
    if draft.config.vocab_size != vocab:
        raise _bad("draft", f"a model with the target's {vocab}-token vocabulary", draft.config.vocab_size)


def _forward(model, tokens, start, cache, stats, counter):
    stats[counter] += 1
    ids = torch.tensor([tokens], dtype=torch.long, device=model.device)
    positions = torch.arange(start, start + len(tokens), device=model.device).unsqueeze(0)
    return model(ids, position_ids=positions, cache=cache)[0]


def _propose(draft, seq, cache, n, stats):
    proposals = []
    while len(proposals) < n:
        done = cache.seq_len()
        row = _forward(draft, (seq + proposals)[done:], done, cache, stats, "draft_forwards")[-1]
        proposals.append(int(torch.argmax(row)))
    return proposals


@torch.inference_mode()
def speculative_generate(target, draft, prompt, max_new_tokens, k=4, *, eos_token_id=None):
    _check_args(target, draft, prompt, max_new_tokens, k)
    stats = dict.fromkeys(("target_forwards", "draft_forwards", "proposed", "accepted"), 0)
    accepted, new = list(prompt), []
    caches = {"target": RollbackKVCache(), "draft": RollbackKVCache()}
    while len(new) < max_new_tokens and (not new or new[-1] != eos_token_id):
        n = min(k, max_new_tokens - len(new) - 1)
        proposals = _propose(draft, accepted, caches["draft"], n, stats)
        done = caches["target"].seq_len()  # every accepted token before it is in the cache
        rows = _forward(target, (accepted + proposals)[done:], done, caches["target"], stats, "target_forwards")
        picks = rows[-(n + 1):].argmax(dim=-1).tolist()  # picks[j]: the target's token after proposals[:j]
        agree = next((j for j in range(n) if proposals[j] != picks[j]), n)
        stats["proposed"] += n
        stats["accepted"] += agree
        for token in proposals[:agree] + [picks[agree]]:
            accepted.append(token)
            new.append(token)
            if token == eos_token_id or len(new) == max_new_tokens:
                break
        for cache in caches.values():
            cache.crop(min(cache.seq_len(), len(accepted) - 1))
    return new, stats
