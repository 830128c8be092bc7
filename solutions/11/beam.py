"""Kata 11 — beam search over a shared prefix (reference solution).

Shapes: P prompt tokens, k beams (``num_beams``), N ``max_new_tokens``, n live beams (n <= k),
V vocabulary, Hkv KV heads, S tokens of a sequence, D head width. The cache is a
``PagedKVCache`` with kata 06's API (``grader.paged`` holds one); the model is ``grader.nn.Llama``
or anything with its interface (``config``, ``device``, ``dtype``, ``model(input_ids,
position_ids=, cache=) -> logits (B, T, V)``).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch


class _PagedBatch:
    """Some sequences of a paged cache, shown to the model as one batch: the ``update`` it calls."""

    def __init__(self, cache, seq_ids: list, n_tokens: int):
        """Reserve ``n_tokens`` slots in each sequence of ``seq_ids`` (once: the slots serve every layer)."""
        self.cache, self.seq_ids = cache, seq_ids
        # One reservation per forward, not per layer: the slots are the same in every layer.
        self.slots = [cache.reserve(seq, n_tokens) for seq in seq_ids]  # each (T,)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write row b of ``k``, ``v`` (B, Hkv, T, D) into sequence b; return every row's (B, Hkv, S, D).

        The model calls this once per layer and attends to what it returns: each row's gathered
        keys and values, stacked. Every row holds the same number of tokens here.
        """
        keys, values = [], []
        for b, (seq, slots) in enumerate(zip(self.seq_ids, self.slots)):
            self.cache.write(layer, slots, k[b], v[b])
            K, V = self.cache.gather(seq, layer)  # (Hkv, S, D)
            keys.append(K)
            values.append(V)
        # Every live beam holds P + t tokens, so the rows stack without padding or a mask.
        return torch.stack(keys), torch.stack(values)  # (B, Hkv, S, D)


@dataclass
class _Beam:
    seq: object  # its sequence id in the cache
    tokens: list  # the new tokens so far
    total: float  # summed log-probability of those tokens


def _check_args(model, prompt, num_beams, max_new_tokens, cache) -> None:
    if not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams: expected an int >= 1, got {num_beams!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
    V = model.config.vocab_size
    if len(prompt) == 0 or not all(isinstance(t, int) and 0 <= t < V for t in prompt):
        raise ValueError(f"prompt: expected a non-empty list of token ids in 0 … {V - 1}, got {list(prompt)!r}")
    pages = cache.k_pages[0]  # (N, Hkv, P, D)
    if pages.dtype != model.dtype:
        raise ValueError(f"cache: expected pages of the model's dtype {model.dtype}, got {pages.dtype}")
    expected = (model.config.num_hidden_layers, model.config.num_key_value_heads, model.config.head_dim)
    if (len(cache.k_pages), pages.shape[1], pages.shape[3]) != expected:
        raise ValueError(f"cache: expected (n_layers, n_kv_heads, head_dim) = {expected} like the model, got "
                         f"{(len(cache.k_pages), pages.shape[1], pages.shape[3])}")
    if cache.allocator.num_free != pages.shape[0]:
        raise ValueError(f"cache: expected every block free, got {pages.shape[0] - cache.allocator.num_free} "
                         f"of {pages.shape[0]} in use")


def _walk(live: list[_Beam], logp: torch.Tensor, k: int, eos_token_id, length_penalty: float, finished: list) -> list[tuple[int, list, float]]:
    """Rank every extension of every live beam; walk the top 2k until k live ones are found.

    ``logp`` (n, V). Returns the next live beams as (parent index, tokens, total), best first;
    EOS candidates met on the way join ``finished`` as (tokens, score).
    """
    V = logp.shape[1]
    totals = torch.tensor([b.total for b in live], dtype=logp.dtype, device=logp.device)
    ranked = (totals[:, None] + logp).flatten().sort(descending=True, stable=True)  # ties: lower beam, then token
    chosen = []
    for value, index in zip(ranked.values[:2 * k].tolist(), ranked.indices[:2 * k].tolist()):
        parent, token = divmod(index, V)
        tokens = live[parent].tokens + [token]
        if token == eos_token_id:
            finished.append((tokens, value / len(tokens) ** length_penalty))
            continue
        chosen.append((parent, tokens, value))
        if len(chosen) == k:
            break
    return chosen


def _done(live: list[_Beam], finished: list, k: int, step: int, N: int, length_penalty: float) -> bool:
    """Whether no live beam can still beat the k-th best finished hypothesis."""
    if len(finished) < k:
        return False
    L = N if length_penalty > 0 else step  # the length at which the best live beam could score best
    kth = sorted((score for _, score in finished), reverse=True)[k - 1]
    return live[0].total / L ** length_penalty <= kth


@torch.inference_mode()
def beam_search(model, prompt: list[int], num_beams: int, max_new_tokens: int, *, cache,
                eos_token_id: int | None = None, length_penalty: float = 1.0) -> list[tuple[list[int], float]]:
    """The best ``num_beams`` continuations of ``prompt`` as (new tokens, score), best first.

    The prompt is prefilled once into ``cache`` (a PagedKVCache with every block free, of the
    model's dtype); every beam is a fork of it, sharing the prompt's blocks. Each step ranks every
    extension of every live beam by summed log-probability (ties: lower beam, then lower token) and
    walks the top 2 * num_beams: an ``eos_token_id`` candidate finishes, the others become the next
    live beams until num_beams are found. A score is the sum over ``len(new_tokens) ** length_penalty``.
    Stops early once num_beams hypotheses are finished and no live beam can beat them (README,
    task 3). Dropped beams are freed before the next decode step, every sequence before returning.
    ValueError (README, task 4) for ``num_beams`` or ``max_new_tokens`` not an int >= 1, a ``prompt``
    empty or with an id outside 0 … vocab_size - 1, a ``cache`` in use or unlike the model (dtype,
    layers, KV heads, head width).
    """
    _check_args(model, prompt, num_beams, max_new_tokens, cache)
    k, N, P, device = num_beams, max_new_tokens, len(prompt), model.device
    work = torch.promote_types(model.dtype, torch.float32)  # log-probabilities in float32 or wider
    ids = itertools.count()
    root = next(ids)
    cache.add_sequence(root)
    live, finished, ran_all = [_Beam(root, [], 0.0)], [], False
    try:
        logits = model(torch.tensor([prompt], device=device), position_ids=torch.arange(P, device=device)[None],
                       cache=_PagedBatch(cache, [root], P), logits_to_keep=1)[:, -1]  # (1, V): prefilled once
        for step in range(1, N + 1):
            logp = torch.log_softmax(logits.to(work), dim=-1)  # (n, V)
            chosen = _walk(live, logp, k, eos_token_id, length_penalty, finished)
            # Reorder the cache: each new beam forks its parent, sharing every block; then the old
            # beams go, so a block only its dropped owner held is free before the next forward.
            new = []
            for parent, tokens, total in chosen:
                seq = next(ids)
                cache.fork(live[parent].seq, seq)
                new.append(_Beam(seq, tokens, total))
            for beam in live:
                if beam.seq != root:  # the prompt's own sequence may stay until the end
                    cache.free(beam.seq)
            live = new
            if step == N:
                ran_all = True
                break
            if not live or _done(live, finished, k, step, N, length_penalty):
                break
            tokens = torch.tensor([[b.tokens[-1]] for b in live], device=device)  # (n, 1)
            positions = torch.full_like(tokens, P + step - 1)  # (n, 1): every beam is P + step - 1 tokens long
            logits = model(tokens, position_ids=positions,
                           cache=_PagedBatch(cache, [b.seq for b in live], 1))[:, -1]  # (n, V)
    finally:
        for beam in live:
            if beam.seq != root:
                cache.free(beam.seq)
        cache.free(root)
    hypotheses = finished + ([(b.tokens, b.total / N ** length_penalty) for b in live] if ran_all else [])
    # sorted() is stable: on equal scores finished hypotheses keep their place before live ones.
    return sorted(hypotheses, key=lambda h: -h[1])[:k]
