"""Kata 12, written from its README: the target prefilled with the prompt but its last token (which stays pending) in a forward of its own, a doubling preallocated buffer, vectorized acceptance.

Before the first round the target reads prompt[:-1] alone (when the prompt has more than one
token), so its cache holds every accepted token but the pending one, as between any two rounds;
then every round is the same: the target feeds the pending token plus the proposals. The draft is
prefilled together with its first proposal. Each cache layer is a buffer whose capacity doubles
when it runs out; ``crop`` only moves the length back.
"""
from __future__ import annotations

import operator

import torch


def _as_int(x, name: str, low: int, high: int | None = None, what: str = "") -> int:
    if isinstance(x, bool):
        raise ValueError(f"{name}: expected an int{what}, got the bool {x!r}")
    try:
        value = operator.index(x)
    except TypeError:
        raise ValueError(f"{name}: expected an int{what}, got {type(x).__name__} {x!r}") from None
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name}: expected an int{what}, got {value}")
    return value


class _Layer:
    __slots__ = ("keys", "values", "length")

    def __init__(self, k: torch.Tensor, capacity: int):
        B, H, _, D = k.shape
        self.keys = torch.empty(B, H, capacity, D, dtype=k.dtype, device=k.device)
        self.values = torch.empty(B, H, capacity, D, dtype=k.dtype, device=k.device)
        self.length = 0

    def grow(self, need: int) -> None:
        cap = self.keys.shape[2]
        if need <= cap:
            return
        while cap < need:
            cap *= 2
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_empty(old.shape[0], old.shape[1], cap, old.shape[3])
            new[:, :, :self.length] = old[:, :, :self.length]
            setattr(self, name, new)


class RollbackKVCache:
    """Per layer a (B, Hkv, capacity, D) buffer pair and a length; the capacity doubles as needed."""

    def __init__(self):
        self._layers: list[_Layer | None] = []

    def update(self, layer, k, v):
        layer = _as_int(layer, "layer", 0, what=" layer index >= 0")
        if not isinstance(k, torch.Tensor) or k.ndim != 4:
            raise ValueError(f"k: expected a (batch, kv_heads, tokens, head_dim) tensor, got "
                             f"{tuple(k.shape) if isinstance(k, torch.Tensor) else type(k).__name__}")
        if not isinstance(v, torch.Tensor) or v.ndim != 4:
            raise ValueError(f"v: expected a (batch, kv_heads, tokens, head_dim) tensor, got "
                             f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}")
        if v.shape != k.shape:
            raise ValueError(f"v: shape {tuple(v.shape)} differs from k's {tuple(k.shape)}")
        while len(self._layers) <= layer:
            self._layers.append(None)
        slot = self._layers[layer]
        B, H, T, D = k.shape
        if slot is not None and slot.length > 0:
            have = (slot.keys.shape[0], slot.keys.shape[1], slot.keys.shape[3])
            if have != (B, H, D):
                raise ValueError(f"k: layer {layer} caches batch, kv heads, head_dim = {have}; "
                                 f"this k has {(B, H, D)}")
            if k.dtype != slot.keys.dtype or k.device != slot.keys.device:
                raise ValueError(f"k: layer {layer} caches {slot.keys.dtype} on {slot.keys.device}, "
                                 f"got {k.dtype} on {k.device}")
        if slot is None or slot.length == 0:
            slot = _Layer(k, max(8, T))
            self._layers[layer] = slot
        end = slot.length + T
        slot.grow(end)
        slot.keys[:, :, slot.length:end] = k
        slot.values[:, :, slot.length:end] = v
        slot.length = end
        return slot.keys[:, :, :end], slot.values[:, :, :end]

    def seq_len(self, layer=0) -> int:
        layer = _as_int(layer, "layer", 0, what=" layer index >= 0")
        if layer >= len(self._layers) or self._layers[layer] is None:
            return 0
        return self._layers[layer].length

    def crop(self, n) -> None:
        limit = self.seq_len(0)
        n = _as_int(n, "n", 0, limit, what=f" in 0 … seq_len() = {limit}")
        for slot in self._layers:
            if slot is not None:
                slot.length = min(slot.length, n)


def _check_args(target, draft, prompt, max_new_tokens, k) -> None:
    _as_int(k, "k", 1, what=" >= 1")
    _as_int(max_new_tokens, "max_new_tokens", 0, what=" >= 0")
    V = int(target.config.vocab_size)
    if not isinstance(prompt, list):
        raise ValueError(f"prompt: expected a list of token ids, got {type(prompt).__name__}")
    if not prompt:
        raise ValueError("prompt: expected at least one token id, got an empty list")
    bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < V]
    if bad:
        raise ValueError(f"prompt: token ids must be ints in [0, {V}) (the target's vocabulary), got {bad[0]!r}")
    if int(draft.config.vocab_size) != V:
        raise ValueError(f"draft: vocab_size {draft.config.vocab_size} does not match the target's {V}")


def _forward(model, tokens, start, cache, stats, counter):
    T = len(tokens)
    ids = torch.as_tensor(tokens, dtype=torch.int64).reshape(1, T).to(model.device)
    pos = (torch.arange(T, dtype=torch.int64) + start).reshape(1, T).to(model.device)
    logits = model(ids, position_ids=pos, cache=cache)
    stats[counter] = stats[counter] + 1
    return logits.reshape(T, -1)


def _propose(draft, seq, cache, n, stats):
    out = []
    while len(out) < n:
        start = cache.seq_len()
        feed = list(seq[start:]) if not out else out[-1:]
        logits = _forward(draft, feed, start, cache, stats, "draft_forwards")
        out.append(int(torch.argmax(logits[-1])))
    return out


@torch.inference_mode()
def speculative_generate(target, draft, prompt, max_new_tokens, k=4, *, eos_token_id=None):
    _check_args(target, draft, prompt, max_new_tokens, k)
    stats = dict(target_forwards=0, draft_forwards=0, proposed=0, accepted=0)
    seq = list(prompt)
    P = len(seq)
    if max_new_tokens == 0:
        return [], stats
    target_cache, draft_cache = RollbackKVCache(), RollbackKVCache()
    if P > 1:
        _forward(target, seq[:-1], 0, target_cache, stats, "target_forwards")  # logits unused: all known
    while len(seq) - P < max_new_tokens:
        n = min(k, max_new_tokens - (len(seq) - P) - 1)
        props = _propose(draft, seq, draft_cache, n, stats)
        rows = _forward(target, seq[-1:] + props, len(seq) - 1, target_cache, stats, "target_forwards")
        choices = rows.argmax(dim=-1)  # (n + 1,), read in the model's own dtype
        if n:
            agree = choices[:n].cpu() == torch.tensor(props, dtype=choices.dtype)
            a = int(agree.to(torch.int64).cumprod(0).sum())
        else:
            a = 0
        stats["proposed"] += n
        stats["accepted"] += a
        fresh = props[:a] + [int(choices[a])]
        target_cache.crop(len(seq) + a)
        draft_cache.crop(min(draft_cache.seq_len(), len(seq) + a))
        if eos_token_id is not None and eos_token_id in fresh:
            seq += fresh[:fresh.index(eos_token_id) + 1]
            break
        seq += fresh
    return seq[P:], stats
