"""Kata 08 — a batched generate loop (reference solution).

Shapes: B prompts, P padded prompt width, N max_new_tokens, S = P + N - 1 cache slots,
Hkv KV heads, D head width, V vocabulary. The model is ``grader.nn.Llama`` or anything with
its interface: ``model.config``, ``model.device``, ``model.dtype`` and
``model(input_ids, position_ids=, cache=, attention_mask=) -> logits (B, T, V)``.
"""
from __future__ import annotations

import torch


class _StaticCache:
    """Per-layer key and value buffers (B, Hkv, S, D), allocated once and written in place."""

    def __init__(self, n_layers: int, batch: int, max_len: int, n_kv_heads: int, head_dim: int, dtype, device):
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.filled, self.max_len = [0] * n_layers, max_len

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k``, ``v`` (B, Hkv, T, D) at the layer's next slots; return the filled part (B, Hkv, S', D)."""
        start, end = self.filled[layer], self.filled[layer] + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"k: {k.shape[2]} new tokens overflow the cache ({start} of {self.max_len} slots used)")
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        self.filled[layer] = end
        # Views of the one buffer: nothing is copied, and attention reads only the filled slots.
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


def _check_args(prompts, max_new_tokens, temperature) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an int >= 0, got {max_new_tokens!r}")
    if temperature < 0:
        raise ValueError(f"temperature: expected a number >= 0 (0 is greedy), got {temperature!r}")
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts: expected a list of lists of token ids, got {type(prompts).__name__}")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
            raise ValueError(f"prompts: prompt {i} should be a list of int token ids, got {prompt!r}")
        if len(prompt) == 0:
            raise ValueError(f"prompts: prompt {i} is empty; every prompt needs at least one token")


def _pick(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """The next token of every row (B,) from its logits (B, V): argmax, or a draw from softmax(logits / T)."""
    if temperature == 0:
        return logits.argmax(-1)
    scaled = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    return torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator)[:, 0]


@torch.inference_mode()
def generate(model, prompts: list[list[int]], max_new_tokens: int, *, eos_token_id: int | None = None,
             pad_token_id: int = 0, temperature: float = 0.0, generator: torch.Generator | None = None) -> list[list[int]]:
    """Continue every prompt by up to ``max_new_tokens`` tokens; return the new tokens of each.

    A row stops after its first ``eos_token_id`` (which it includes). One prefill over the prompts,
    left-padded with ``pad_token_id`` to (B, P), then one-token decode steps over a cache allocated
    once. Greedy at ``temperature`` 0; otherwise draws from softmax(logits / temperature) with
    ``generator``. Runs on ``model.device``. ValueError naming the argument for prompts that are
    not lists of int token ids of the vocabulary, an empty prompt, a negative ``max_new_tokens``
    or ``temperature``, and a ``pad_token_id`` outside the vocabulary (pads are fed to the model).
    """
    _check_args(prompts, max_new_tokens, temperature)
    if not prompts or max_new_tokens == 0:
        return [[] for _ in prompts]
    config, device = model.config, model.device
    B, N = len(prompts), max_new_tokens
    P = max(len(p) for p in prompts)
    S = P + N - 1  # the last new token is returned, never fed back, so it needs no slot
    ids = torch.full((B, P), pad_token_id, dtype=torch.long)
    for b, prompt in enumerate(prompts):
        ids[b, P - len(prompt):] = torch.tensor(prompt)  # left padding: every prompt ends at column P-1
    if not isinstance(pad_token_id, int) or not 0 <= pad_token_id < config.vocab_size:  # it is fed to the model
        raise ValueError(f"pad_token_id: expected a token id in 0 … {config.vocab_size - 1}, got {pad_token_id!r}")
    if int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size:  # checked here, on the host: no sync
        raise ValueError(f"prompts: token ids must lie in 0 … {config.vocab_size - 1}, "
                         f"got ids from {int(ids.min())} to {int(ids.max())}")
    lengths = torch.tensor([len(p) for p in prompts])
    ids, lengths = ids.to(device), lengths.to(device)

    first = P - lengths  # (B,) column of each row's first real token
    slots = torch.arange(S, device=device)
    real = slots[None, :P] >= first[:, None]  # (B, P) False on padding
    real = torch.cat([real, torch.zeros(B, S - P, dtype=torch.bool, device=device)], dim=1)  # (B, S)
    positions = (slots[None, :P] - first[:, None]).clamp(min=0)  # (B, P) 0 … len-1 on real tokens
    step_positions = lengths[:, None] + torch.arange(N, device=device)  # (B, N) position of new token i
    causal = torch.ones(P, P, dtype=torch.bool, device=device).tril()

    cache = _StaticCache(config.num_hidden_layers, B, S, config.num_key_value_heads, config.head_dim,
                         model.dtype, device)
    logits = model(ids, position_ids=positions, cache=cache, attention_mask=causal & real[:, None, :P],
                   logits_to_keep=1)[:, -1]  # (B, V)
    out = torch.zeros(B, N, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    produced = torch.zeros(B, dtype=torch.long, device=device)
    for step in range(N):
        token = _pick(logits, temperature, generator).masked_fill(done, pad_token_id)  # (B,) finished rows frozen
        out[:, step] = token
        produced += ~done
        if eos_token_id is not None:
            done |= token == eos_token_id
            if done.all():  # the one host-device sync of a step
                break
        if step == N - 1:
            break
        real[:, P + step] = True  # the slot this token is written to: its query must see its own key
        logits = model(token[:, None], position_ids=step_positions[:, step:step + 1], cache=cache,
                       attention_mask=real[:, None, :P + step + 1])[:, -1]  # (B, V)
    return [row[:n] for row, n in zip(out.tolist(), produced.tolist())]
