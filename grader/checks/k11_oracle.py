"""The machinery of kata 11's checks: a paged cache that notes what the search does with it, kata
08's recording Llama that also notes the live sequences at each forward, a stand-in model whose logits
depend on the last token only, and the answer — a brute-force beam search from uncached forwards
that follows the SPEC's rules and says when a decision was too close for float32 to call.
"""
from __future__ import annotations

import torch

from grader.checks.support.models import FixedLogits, Recording
from grader.nn import Llama
from grader.paged import PagedKVCache

TIE = 1e-6  # candidates closer than this (relative) may come in either order: float32 cannot tell them apart


# -- the watched cache and the probed model ------------------------------------------------------
class WatchedCache(PagedKVCache):
    """The paged cache handed to the learner; notes blocks in use and the live sequences after every change."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.alive: set = set()
        self.events: list[tuple[str, int, int]] = []  # (what, blocks in use, longest sequence so far)
        self.longest = 0

    @property
    def in_use(self) -> int:
        return self.k_pages[0].shape[0] - self.allocator.num_free

    def _note(self, what: str) -> None:
        self.events.append((what, self.in_use, self.longest))

    def add_sequence(self, seq_id) -> None:
        super().add_sequence(seq_id)
        self.alive.add(seq_id)
        self._note(f"add_sequence({seq_id!r})")

    def fork(self, parent_id, child_id) -> None:
        super().fork(parent_id, child_id)
        self.alive.add(child_id)
        self._note(f"fork({parent_id!r}, {child_id!r})")

    def free(self, seq_id) -> None:
        super().free(seq_id)
        self.alive.discard(seq_id)
        self._note(f"free({seq_id!r})")

    def reserve(self, seq_id, n_tokens):
        slots = super().reserve(seq_id, n_tokens)
        self.longest = max(self.longest, self.seq_len(seq_id))
        self._note(f"reserve({seq_id!r}, {n_tokens})")
        return slots


class Probed(Recording):
    """Kata 08's recording Llama, also noting how many sequences the watched cache holds at each forward."""

    watched: WatchedCache | None = None

    def forward(self, input_ids, *args, **kwargs):
        alive = None if self.watched is None else len(self.watched.alive)
        out = super().forward(input_ids, *args, **kwargs)
        self.calls[-1]["alive"] = alive
        return out


def cache_for(model, num_blocks: int = 256, block_size: int = 4, dtype=None, watched: bool = True, **shape):
    """A cache for ``model`` (its layers, KV heads, head width and dtype); ``shape`` may replace
    ``n_layers``, ``n_kv_heads`` or ``head_dim`` to build one for another model."""
    config = model.config
    kind = WatchedCache if watched else PagedKVCache
    sizes = {"n_layers": config.num_hidden_layers, "n_kv_heads": config.num_key_value_heads,
             "head_dim": config.head_dim, **shape}
    cache = kind(num_blocks, block_size, sizes["n_layers"], sizes["n_kv_heads"], sizes["head_dim"],
                 dtype=dtype or model.dtype, device=model.device)
    if isinstance(model, Probed) and watched:
        model.watched = cache
    return cache


def stand_in(ex: dict, device) -> FixedLogits:
    """Logits from the last token only: a seeded table (V, V), or the same logits everywhere when uniform;
    of ``ex["dtype"]`` (float64 unless set)."""
    V = ex["vocab"]
    if ex.get("uniform"):
        table = torch.zeros(V, V, dtype=torch.float64)
    else:
        g = torch.Generator().manual_seed(ex["seed"])
        table = torch.randn(V, V, generator=g, dtype=torch.float64) * ex.get("spread", 2.0)
    return FixedLogits(table, device, dtype=ex.get("dtype", torch.float64))


class ModelFailed(RuntimeError):
    """What ``Failing`` raises: the checks' own error, which beam_search must let through."""


class Failing(FixedLogits):
    """The stand-in model, raising ``ModelFailed`` on forward number ``fail_at`` (1 = the prefill), half-way
    through it: after the first layer's ``update`` wrote into the cache, before the second layer's."""

    def __init__(self, table: torch.Tensor, device, fail_at: int, dtype: torch.dtype = torch.float64):
        super().__init__(table, device, dtype)
        self.fail_at = fail_at

    def forward(self, input_ids, position_ids=None, cache=None, attention_mask=None, **kwargs):
        if self.calls + 1 < self.fail_at:
            return super().forward(input_ids, position_ids, cache, attention_mask, **kwargs)
        self.calls += 1
        B, T = input_ids.shape
        if cache is not None:
            zeros = torch.zeros(B, 1, T, 4, dtype=self.dtype, device=self.device)
            cache.update(0, zeros, zeros)
        raise ModelFailed(f"the model failed on forward {self.calls} (on purpose: the checks' failing model)")


def failing(ex: dict, device) -> Failing:
    """``stand_in``'s table in a model that raises on forward ``ex["fail_at"]``."""
    return Failing(stand_in(ex, device).table.detach().clone(), device, ex["fail_at"], dtype=ex.get("dtype", torch.float64))


# -- the answer: a brute-force beam search from uncached forwards ---------------------------------
@torch.no_grad()
def last_logits(model, rows: list[list[int]]) -> torch.Tensor:
    ids = torch.tensor(rows, device=model.device)  # (n, L): every row the same length
    if isinstance(model, FixedLogits):
        return model.table[ids[:, -1]].double()  # (n, V)
    return Llama.forward(model, ids)[:, -1].double()  # plain causal forward, no cache


def close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def brute_force(model, prompt, k, N, eos=None, lp=1.0, tie=TIE, exact_ties=False) -> dict:
    """The SPEC's beam search, spelled out. Returns ``result`` (best first), ``steps`` (the live
    beams' new tokens before each decode forward) and ``ambiguous`` (a decision closer than ``tie``).
    With ``exact_ties`` equal values are decided by the SPEC's rule, not called ambiguous."""
    live, finished, steps, ambiguous, ran_all = [([], 0.0)], [], [], False, False

    def near(a, b):
        return close(a, b, tie) and not (exact_ties and a == b)

    for step in range(1, N + 1):
        logp = torch.log_softmax(last_logits(model, [prompt + t for t, _ in live]), dim=-1)  # (n, V)
        V = logp.shape[1]
        totals = torch.tensor([s for _, s in live], dtype=torch.float64, device=logp.device)
        ranked = (totals[:, None] + logp).flatten().sort(descending=True, stable=True)
        values, indices = ranked.values.tolist(), ranked.indices.tolist()
        chosen, walked = [], 0
        for value, index in zip(values[:2 * k], indices[:2 * k]):
            walked += 1
            tokens = live[index // V][0] + [index % V]
            if index % V == eos:
                finished.append((tokens, value / len(tokens) ** lp))
                continue
            chosen.append((tokens, value))
            if len(chosen) == k:
                break
        if walked < len(values) and near(values[walked - 1], values[walked]):
            ambiguous = True  # which candidate is the last one walked depends on the last bits
        live = chosen
        if step == N:
            ran_all = True
            break
        if not live:
            break
        if len(finished) >= k:
            L = N if lp > 0 else step
            bound, kth = live[0][1] / L ** lp, sorted((s for _, s in finished), reverse=True)[k - 1]
            ambiguous |= near(bound, kth)
            if bound <= kth:
                break
        steps.append([t for t, _ in live])
    every = finished + ([(t, s / N ** lp) for t, s in live] if ran_all else [])
    every = sorted(every, key=lambda h: -h[1])
    if len(every) > k and near(every[k - 1][1], every[k][1]):
        ambiguous = True  # which hypothesis is the k-th depends on the last bits
    return {"result": every[:k], "steps": steps, "ambiguous": ambiguous}


def score_of(model, prompt, tokens, lp) -> float:
    """The score of one hypothesis recomputed from uncached forwards."""
    rows = [prompt + tokens[:i] for i in range(len(tokens))]
    total = 0.0
    for i, row in enumerate(rows):
        total += float(torch.log_softmax(last_logits(model, [row]), dim=-1)[0, tokens[i]])
    return total / len(tokens) ** lp
