"""Kata 08, written from its README: one slab (2, layers, B, Hkv, S, D) for the whole cache, padding by a per-row loop into a pad-filled tensor, pad positions 1 as Hugging Face writes them, each mask built from scratch with arange comparisons, logits_to_keep=1 for the prefill, sampling in float64, and one host read per step carrying both the tokens and the "all done?" answer.

Shapes: B prompts, P padded prompt width, N max_new_tokens, S = P + N - 1 cache slots,
Hkv KV heads, D head width, V vocabulary.
"""
from __future__ import annotations

import numbers

import torch


class _StaticCache:
    def __init__(self, n_layers: int, batch: int, max_len: int, n_kv_heads: int, head_dim: int, dtype, device):
        self.slab = torch.zeros(2, n_layers, batch, n_kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.lengths = [0] * n_layers

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        begin = self.lengths[layer]
        end = begin + k.shape[-2]
        keys, values = self.slab[0, layer], self.slab[1, layer]
        if end > keys.shape[-2]:
            raise ValueError(f"k: layer {layer} holds {begin} of {keys.shape[-2]} slots, {k.shape[-2]} more do not fit")
        keys[:, :, begin:end] = k
        values[:, :, begin:end] = v
        self.lengths[layer] = end
        return keys[:, :, :end], values[:, :, :end]


def _pick(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    if not temperature:
        return torch.argmax(logits, dim=-1)
    probs = (logits.to(torch.float64) / float(temperature)).softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]


def _is_token(t, vocab) -> bool:
    return isinstance(t, numbers.Integral) and not isinstance(t, bool) and 0 <= int(t) < vocab


@torch.inference_mode()
def generate(model, prompts, max_new_tokens: int, *, eos_token_id=None, pad_token_id: int = 0,
             temperature: float = 0.0, generator=None) -> list[list[int]]:
    vocab = model.config.vocab_size
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts should be a list of lists of token ids; received {type(prompts).__name__}")
    for n, prompt in enumerate(prompts):
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise ValueError(f"prompts: entry {n} should be a non-empty list of token ids; received {prompt!r}")
        bad = [t for t in prompt if not _is_token(t, vocab)]
        if bad:
            raise ValueError(f"prompts: entry {n} holds {bad[0]!r}, not a token id of the vocabulary [0, {vocab})")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens should be a non-negative int; received {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or temperature < 0 \
            or temperature != temperature:
        raise ValueError(f"temperature should be a number >= 0; received {temperature!r}")
    if not _is_token(pad_token_id, vocab):
        raise ValueError(f"pad_token_id should be a token id in [0, {vocab}) since pads are fed to the model; "
                         f"received {pad_token_id!r}")
    if not prompts:
        return []
    if max_new_tokens == 0:
        return [[] for _ in prompts]

    device, cfg = model.device, model.config
    B, N = len(prompts), int(max_new_tokens)
    P = max(map(len, prompts))
    S = P + N - 1
    ids = torch.full((B, P), int(pad_token_id), dtype=torch.long)
    for b, prompt in enumerate(prompts):
        ids[b, P - len(prompt):] = torch.tensor([int(t) for t in prompt], dtype=torch.long)
    ids = ids.to(device)
    first = torch.tensor([P - len(p) for p in prompts], device=device)  # first real slot of each row
    cols = torch.arange(S, device=device)
    is_pad = cols[None, :P] < first[:, None]  # (B, P)
    pos = (cols[None, :P] - first[:, None]).masked_fill(is_pad, 1)  # real tokens 0 … len-1; pads 1
    mask = (cols[None, None, :P] <= cols[:P, None][None]) & ~is_pad[:, None, :]  # (B, P, P): causal, pads hidden
    cache = _StaticCache(cfg.num_hidden_layers, B, S, cfg.num_key_value_heads, cfg.head_dim, model.dtype, device)
    logits = model(ids, position_ids=pos, cache=cache, attention_mask=mask, logits_to_keep=1)[:, -1]

    rows: list[list[int]] = [[] for _ in range(B)]
    alive = [True] * B
    done = torch.zeros(B, dtype=torch.bool, device=device)
    eos = None if eos_token_id is None else torch.tensor(eos_token_id, device=device)
    for step in range(N):
        token = _pick(logits, temperature, generator)
        if eos is not None:
            done = done | (token == eos)
        # one read from the device: this step's tokens and whether every row is done
        host = torch.cat([token, done.all().long()[None]]).tolist()
        for b in range(B):
            if alive[b]:
                rows[b].append(host[b])
                if eos_token_id is not None and host[b] == eos_token_id:
                    alive[b] = False
        if host[-1] or step == N - 1:
            break
        slot = P + step
        fed = token.masked_fill(done, int(pad_token_id))[:, None]  # (B, 1); finished rows ride along
        step_pos = (slot - first)[:, None]  # (B, 1): the row's real tokens before this one
        step_mask = (cols[None, :slot + 1] >= first[:, None])[:, None, :]  # (B, 1, slot + 1)
        logits = model(fed, position_ids=step_pos, cache=cache, attention_mask=step_mask)[:, -1]
    return rows
