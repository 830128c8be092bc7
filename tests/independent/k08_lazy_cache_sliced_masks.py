"""Kata 08, written from its README: a cache whose per-layer buffers are allocated once, at that layer's first update, from the shape the model hands it; every mask a slice of one (B, S, S) mask built before the prefill; pad positions left negative (arange minus the pad count); finished rows fed their EOS again; new tokens stacked on the device and read once at the end.

Shapes: B prompts, P padded prompt width, N max_new_tokens, S = P + N - 1 cache slots,
Hkv KV heads, D head width, V vocabulary.
"""
from __future__ import annotations

import operator

import torch


class _StaticCache:
    def __init__(self, n_layers: int, batch: int, max_len: int, n_kv_heads: int, head_dim: int, dtype, device):
        self.n_layers, self.batch, self.max_len = n_layers, batch, max_len
        self.n_kv_heads, self.head_dim, self.dtype, self.device = n_kv_heads, head_dim, dtype, device
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> (K, V), made on first use
        self.used: dict[int, int] = {}

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if layer not in self.buffers:
            shape = (self.batch, self.n_kv_heads, self.max_len, self.head_dim)
            if (k.shape[0], k.shape[1], k.shape[3]) != (shape[0], shape[1], shape[3]):
                raise ValueError(f"k: expected (batch, n_kv_heads, T, head_dim) = {shape[:2]} and {shape[3]}, "
                                 f"got {tuple(k.shape)}")
            self.buffers[layer] = (torch.empty(shape, dtype=self.dtype, device=self.device),
                                   torch.empty(shape, dtype=self.dtype, device=self.device))
            self.used[layer] = 0
        K, V = self.buffers[layer]
        a = self.used[layer]
        b = a + k.shape[2]
        if b > self.max_len:
            raise ValueError(f"k: layer {layer} would need {b} slots, the cache has {self.max_len}")
        K[:, :, a:b] = k
        V[:, :, a:b] = v
        self.used[layer] = b
        return K[:, :, :b], V[:, :, :b]


def _pick(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    if temperature == 0.0:
        return logits.argmax(-1)
    probs = logits.float().div(temperature).softmax(-1)  # float32 at least: half logits / small T overflow
    return torch.multinomial(probs, 1, generator=generator).view(-1)


def _token(name: str, value, vocab: int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a token id in [0, {vocab}), got the bool {value}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected a token id in [0, {vocab}), got {value!r}") from None
    if not 0 <= value < vocab:
        raise ValueError(f"{name}: expected a token id in [0, {vocab}), got {value}")
    return value


@torch.inference_mode()
def generate(model, prompts, max_new_tokens: int, *, eos_token_id=None, pad_token_id: int = 0,
             temperature: float = 0.0, generator=None) -> list[list[int]]:
    vocab = model.config.vocab_size
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts: expected a list of prompts (lists of token ids), got {type(prompts).__name__}")
    rows_in = []
    for i, p in enumerate(prompts):
        if not isinstance(p, (list, tuple)):
            raise ValueError(f"prompts: expected prompt {i} to be a list of token ids, got {type(p).__name__}")
        if not p:
            raise ValueError(f"prompts: prompt {i} is empty; expected at least one token")
        rows_in.append([_token(f"prompts (prompt {i})", t, vocab) for t in p])
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an int >= 0, got {max_new_tokens!r}")
    try:
        temp_ok = float(temperature) >= 0 and not isinstance(temperature, bool)
    except (TypeError, ValueError):
        temp_ok = False
    if not temp_ok:
        raise ValueError(f"temperature: expected a number >= 0, got {temperature!r}")
    pad = _token("pad_token_id", pad_token_id, vocab)
    if not rows_in:
        return []
    if max_new_tokens == 0:
        return [[] for _ in rows_in]

    device, cfg = model.device, model.config
    B, N = len(rows_in), max_new_tokens
    lens = [len(r) for r in rows_in]
    P = max(lens)
    S = P + N - 1
    ids = torch.tensor([[pad] * (P - n) + r for r, n in zip(rows_in, lens)], dtype=torch.long, device=device)
    n_pad = torch.tensor([P - n for n in lens], device=device)  # (B,)
    slots = torch.arange(S, device=device)
    # full[b, q, k]: the token in slot q of row b may attend to slot k (causal, pads hidden)
    full = (slots[None, :, None] >= slots[None, None, :]) & (slots[None, None, :] >= n_pad[:, None, None])
    positions = slots[None, :] - n_pad[:, None]  # (B, S): slot minus the row's pads (pads negative, never used)
    cache = _StaticCache(cfg.num_hidden_layers, B, S, cfg.num_key_value_heads, cfg.head_dim, model.dtype, device)

    logits = model(ids, position_ids=positions[:, :P], cache=cache, attention_mask=full[:, :P, :P])[:, -1, :]
    picked = []
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    for s in range(N):
        nxt = _pick(logits, temperature, generator)
        nxt = torch.where(finished, torch.as_tensor(eos_token_id if eos_token_id is not None else pad,
                                                    device=device), nxt)  # frozen rows repeat their EOS
        picked.append(nxt)
        if eos_token_id is not None:
            finished = finished | (nxt == eos_token_id)
        if s == N - 1 or (eos_token_id is not None and bool(finished.all())):
            break
        q = P + s
        logits = model(nxt[:, None], position_ids=positions[:, q:q + 1], cache=cache,
                       attention_mask=full[:, q:q + 1, :q + 1])[:, -1, :]
    table = torch.stack(picked, dim=1).tolist()  # (B, steps)
    out = []
    for row in table:
        if eos_token_id is not None and eos_token_id in row:
            row = row[:row.index(eos_token_id) + 1]
        out.append(row)
    return out
