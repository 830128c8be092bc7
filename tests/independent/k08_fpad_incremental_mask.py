"""Kata 08, written from its README: left padding with torch.nn.functional.pad per prompt, one "real slot" row per prompt grown step by step for the decode masks, a per-layer preallocated cache returning views of its filled part, tokens kept in a device tensor and cut at EOS once at the end.

Shapes: B prompts, P padded prompt width, N max_new_tokens, S = P + N - 1 cache slots,
Hkv KV heads, D head width, V vocabulary.
"""
from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F


class _StaticCache:
    def __init__(self, n_layers: int, batch: int, max_len: int, n_kv_heads: int, head_dim: int, dtype, device):
        self.max_len = max_len
        self.k = [torch.zeros(batch, n_kv_heads, max_len, head_dim, dtype=dtype, device=device)
                  for _ in range(n_layers)]
        self.v = [torch.zeros_like(buf) for buf in self.k]
        self.filled = [0] * n_layers

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        start, stop = self.filled[layer], self.filled[layer] + k.shape[2]
        if stop > self.max_len:
            raise ValueError(f"k: {k.shape[2]} new entries for layer {layer} overflow the {self.max_len} slots "
                             f"({start} filled)")
        self.k[layer][:, :, start:stop].copy_(k)
        self.v[layer][:, :, start:stop].copy_(v)
        self.filled[layer] = stop
        return self.k[layer][:, :, :stop], self.v[layer][:, :, :stop]


def _pick(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    if temperature == 0:
        return logits.argmax(dim=-1)
    wide = logits.float() if logits.dtype not in (torch.float32, torch.float64) else logits
    probs = torch.softmax(wide / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _int_like(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _validate(model, prompts, max_new_tokens, eos_token_id, pad_token_id, temperature) -> int:
    vocab = int(model.config.vocab_size)
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts: a list of token-id lists was expected, not {type(prompts).__name__}")
    for i, p in enumerate(prompts):
        if not isinstance(p, (list, tuple)):
            raise ValueError(f"prompts[{i}]: a list of int token ids was expected, not {type(p).__name__}")
        if len(p) == 0:
            raise ValueError(f"prompts[{i}]: an empty prompt has no last token to continue from")
        for t in p:
            if not _int_like(t) or not 0 <= t < vocab:
                raise ValueError(f"prompts[{i}]: token ids in 0 … {vocab - 1} were expected, found {t!r}")
    if not _int_like(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: an int >= 0 was expected, not {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature >= 0:
        raise ValueError(f"temperature: a number >= 0 was expected, not {temperature!r}")
    if not _int_like(pad_token_id) or not 0 <= pad_token_id < vocab:
        raise ValueError(f"pad_token_id: a token id in 0 … {vocab - 1} was expected (pads are fed to the model), "
                         f"not {pad_token_id!r}")
    if eos_token_id is not None and not _int_like(eos_token_id):
        raise ValueError(f"eos_token_id: None or an int token id was expected, not {eos_token_id!r}")
    return vocab


@torch.inference_mode()
def generate(model, prompts, max_new_tokens: int, *, eos_token_id=None, pad_token_id: int = 0,
             temperature: float = 0.0, generator=None) -> list[list[int]]:
    _validate(model, prompts, max_new_tokens, eos_token_id, pad_token_id, temperature)
    if len(prompts) == 0:
        return []
    if max_new_tokens == 0:
        return [[] for _ in prompts]
    device, cfg = model.device, model.config
    B, N = len(prompts), int(max_new_tokens)
    P = max(len(p) for p in prompts)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    ids = torch.stack([F.pad(torch.tensor([int(t) for t in p], dtype=torch.long, device=device),
                             (P - len(p), 0), value=int(pad_token_id)) for p in prompts])  # (B, P)
    S = P + N - 1
    # real[b, j]: slot j of row b holds a real token (its prompt or a generated one)
    real = torch.zeros(B, S, dtype=torch.bool, device=device)
    real[:, :P] = torch.arange(P, device=device)[None, :] >= (P - lengths)[:, None]
    positions = (real[:, :P].long().cumsum(-1) - 1).clamp(min=0)  # (B, P)
    causal = torch.ones(P, P, dtype=torch.bool, device=device).tril()
    mask = causal[None] & real[:, None, :P]  # (B, P, P)
    cache = _StaticCache(cfg.num_hidden_layers, B, S, cfg.num_key_value_heads, cfg.head_dim, model.dtype, device)

    logits = model(ids, position_ids=positions, cache=cache, attention_mask=mask)[:, -1]  # (B, V)
    out = torch.empty(B, N, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    steps = 0
    for step in range(N):
        token = _pick(logits, temperature, generator)  # (B,)
        out[:, step] = token
        steps = step + 1
        if eos_token_id is not None:
            done = done | (token == eos_token_id)
            if bool(done.all()):  # the one synchronisation of the step
                break
        if step == N - 1:
            break
        slot = P + step  # where this token's key goes
        real[:, slot] = True
        fed = torch.where(done, torch.full_like(token, int(pad_token_id)), token)  # done rows ride along
        pos = (lengths + step)[:, None]  # (B, 1)
        logits = model(fed[:, None], position_ids=pos, cache=cache,
                       attention_mask=real[:, None, :slot + 1].clone())[:, -1]
    rows = out[:, :steps].tolist()
    if eos_token_id is not None:
        for row in rows:
            if eos_token_id in row:
                del row[row.index(eos_token_id) + 1:]
    return rows
