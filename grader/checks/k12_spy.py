"""The models kata 12's checks hand to ``speculative_generate``, and what they see.

``SpyLlama`` is the tiny float64 Llama noting every call into a log the target and the draft
share (so the order of their calls is known): the tokens fed, their position ids, how many
tokens the cache held before the call (read from what ``cache.update`` returned) and the
logits returned. ``near_tie_model`` is one whose top two logits are always 1e-8 apart.
``WrongDraft`` proposes the token the target likes least (at every position, or at every
third one). ``replay_calls`` walks the log against the final sequence and reports the first
forward that read a rejected token, re-fed accepted ones a rollback cut away, used wrong
positions, or returned logits an uncached forward disagrees with.
"""
from __future__ import annotations

import torch
from torch import nn

from grader.checks.support.common import randn, tiny_llama
from grader.nn import Llama, LlamaConfig

LOGIT_TOL = 1e-8  # float64: a cached and an uncached forward agree far closer than this
NEAR_TIE = 1e-8  # the near-tie model's margin: distinct in float64, one float32 value (1 + 1e-8 rounds to 1)


class _LengthSpy:
    """Stands between the model and the learner's cache; notes each layer's length before the call."""

    def __init__(self, cache, before: dict):
        self._cache, self._before = cache, before

    def update(self, layer, k, v):
        K, V = self._cache.update(layer, k, v)
        self._before[layer] = (K.shape[2] - k.shape[2]) if isinstance(K, torch.Tensor) and K.dim() == 4 else None
        return K, V

    def __getattr__(self, name):
        return getattr(self._cache, name)


class SpyLlama(Llama):
    """The tiny Llama, noting every call in ``log`` (a list it may share with another model)."""

    def __init__(self, config):
        super().__init__(config)
        self.log: list[dict] = []
        self.role = "model"

    def forward(self, input_ids, position_ids=None, cache=None, attention_mask=None, **kwargs):
        call = {"model": self, "ids": input_ids.detach().cpu(), "cache": cache is not None, "before": {},
                "positions": None if position_ids is None else position_ids.detach().cpu()}
        self.log.append(call)
        spy = None if cache is None else _LengthSpy(cache, call["before"])
        out = super().forward(input_ids, position_ids, spy, attention_mask, **kwargs)
        call["logits"] = out.detach().cpu()
        return out


def spy_model(seed: int, device, role: str, log: list, **overrides) -> SpyLlama:
    model = tiny_llama(seed, device, cls=SpyLlama, **overrides)
    model.role, model.log = role, log
    return model


class NearTieHead(nn.Linear):
    """The LM head of ``near_tie_model``: its logits moved so the best one is 1 + NEAR_TIE and the next
    lower id's exactly 1 (id 0 is never the best), each row's other logits shifted as the best was."""

    def forward(self, h):
        logits = super().forward(h)  # (B, T, V)
        best = logits.argmax(-1, keepdim=True).clamp(min=1)  # (B, T, 1): a lower id always exists
        out = logits - logits.amax(-1, keepdim=True) + 1.0
        return out.scatter(-1, best - 1, 1.0).scatter(-1, best, 1.0 + NEAR_TIE)  # (B, T, V)


def near_tie_model(seed: int, device, role: str, log: list, **overrides) -> SpyLlama:
    """The spy Llama of ``seed`` whose every greedy choice beats the next lower id by NEAR_TIE."""
    model = spy_model(seed, device, role, log, **overrides)
    head = NearTieHead(model.config.hidden_size, model.config.vocab_size, bias=False)
    head.weight = model.lm_head.weight
    model.lm_head = head
    return model


def perturbed(model: SpyLlama, seed: int, scale: float, role: str = "draft") -> SpyLlama:
    """A copy of ``model`` with its weights moved by noise of ``scale`` times their own size."""
    copy = spy_model(0, model.device, role, model.log, **_overrides(model.config))
    with torch.no_grad():
        for i, ((_, mine), (_, theirs)) in enumerate(zip(sorted(copy.named_parameters()),
                                                        sorted(model.named_parameters()))):
            noise = randn(seed * 53 + i, *theirs.shape, device=theirs.device, scale=scale)
            mine.copy_(theirs + noise * theirs.std())
    return copy


def _overrides(config: LlamaConfig) -> dict:
    return {"num_hidden_layers": config.num_hidden_layers, "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads, "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size}


class WrongDraft(nn.Module):
    """A stand-in draft whose greedy token is never the target's: it returns the target's logits negated.

    With ``every`` = 3 only the rows proposing a token at a position divisible by 3 are negated: the
    others give the target's own choice after what the draft was fed, so after a wrong proposal the
    next ones agree with the target's rows again (a match after a mismatch, which is not accepted).
    It reads the context from the tokens and positions it was fed, writes zeros into the cache
    (one layer, one KV head of width 4), notes its calls in the target's log (for ``count_rounds``;
    ``replay_calls`` reads Llama calls only) and has the interface the loop relies on.
    """

    def __init__(self, target: Llama, every: int = 1):
        super().__init__()
        self.target = [target]  # in a list: not a submodule
        self.config = LlamaConfig(vocab_size=target.config.vocab_size, hidden_size=8, intermediate_size=8,
                                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=4)
        self.anchor = nn.Parameter(torch.zeros(1, dtype=torch.float64, device=target.device), requires_grad=False)
        self.seen: dict[int, int] = {}
        self.calls, self.every = 0, every
        self.role, self.log = "draft", getattr(target, "log", [])  # its calls go into the target's log

    @property
    def device(self):
        return self.anchor.device

    @property
    def dtype(self):
        return self.anchor.dtype

    def forward(self, input_ids, position_ids=None, cache=None, attention_mask=None, logits_to_keep: int = 0, **_):
        self.calls += 1
        B, T = input_ids.shape
        positions = position_ids if position_ids is not None else torch.arange(T).expand(B, T)
        pos, ids = positions[0].tolist(), input_ids[0].tolist()
        self.seen.update(zip(pos, ids))
        if cache is not None:
            zeros = torch.zeros(B, 1, T, 4, dtype=self.dtype, device=self.device)
            cache.update(0, zeros, zeros)
        context = [self.seen.get(j, 0) for j in range(max(pos) + 1)]
        logits = Llama.forward(self.target[0], torch.tensor([context], device=self.device))[:, pos]  # (1, T, V)
        wrong = torch.tensor([(p + 1) % self.every == 0 for p in pos], device=self.device)  # (T,)
        logits = torch.where(wrong[:, None], -logits, logits).expand(B, T, -1)
        logits = logits[:, -logits_to_keep:] if logits_to_keep else logits
        self.log.append({"model": self, "ids": input_ids.detach().cpu(), "cache": cache is not None, "before": {},
                         "positions": None if position_ids is None else position_ids.detach().cpu(),
                         "logits": logits.detach().cpu()})
        return logits


# -- reading the log ----------------------------------------------------------------------------------
def _positions(call) -> list[int]:
    T = call["ids"].shape[1]
    return call["positions"][0].tolist() if call["positions"] is not None else list(range(T))


@torch.no_grad()
def replay_calls(log: list[dict], final: list[int], prompt_len: int):
    """The first forward of either model that breaks the rollback contract, as (message, observed); or None.

    ``final`` is the prompt followed by the generated tokens. A token the target has judged since
    it was fed (a target forward covered its position) must, if it is still in a cache when a
    later forward runs, be the accepted token of that position. And a cache keeps what is known
    to be accepted: the accepted tokens (those of ``final`` before the length the target's rounds
    have settled so far) its model computed at the start of its cache stay there.
    """
    record, held = {}, {}  # model -> {position: (token it was fed there, when), latest}; model -> its cache length
    judged, counts = {}, {}  # position -> when a target forward last covered it
    known = prompt_len  # tokens known to be accepted so far: the prompt, then a + 1 more per target forward
    for time, call in enumerate(log):
        model = call["model"]
        n = counts[model.role] = counts.get(model.role, 0) + 1
        where = f"{model.role} forward {n}"
        ids, pos = call["ids"], _positions(call)
        if ids.shape[0] != 1:
            return f"{where} fed input_ids of shape {tuple(ids.shape)}; speculative decoding here is batch 1", \
                ("batch", model.role, tuple(ids.shape))
        if not call["cache"]:
            return f"{where} passed no cache: every forward of either model must read and extend its own cache", \
                ("no cache", model.role, n)
        lengths = set(call["before"].values())
        if len(lengths) != 1 or None in lengths:
            return f"{where}: the cache layers held different numbers of tokens before the call {call['before']}", \
                ("layers differ", model.role, n)
        before, T, seen = lengths.pop(), ids.shape[1], record.setdefault(model, {})
        if pos != list(range(before, before + T)):
            return (f"{where}: the cache held {before} tokens, so the {T} tokens fed should sit at positions "
                    f"{before} … {before + T - 1}; they were given {pos}. Positions come from how many tokens the "
                    "cache really holds after a rollback."), ("positions", model.role, n, before, pos[0])
        kept = _accepted_prefix(seen, final, min(held.get(model, 0), known))
        if before < kept:
            return (f"{where}: its cache held {before} tokens, but the first {kept} it had computed are accepted "
                    f"tokens; the rollback cut {kept - before} accepted token(s) away, so they are fed and computed "
                    "again. Crop a cache to the accepted tokens it holds, not below them."), \
                ("cropped too far", model.role, n, before, kept)
        context = [seen[j][0] for j in range(before)]
        for j, token in enumerate(context):
            if judged.get(j, -1) >= seen[j][1] and j < len(final) and token != final[j]:
                good = next(i for i, t in enumerate(context) if i >= len(final) or t != final[i])
                return (f"{where}: its cache held {before} tokens, but only the first {good} are accepted tokens; "
                        f"the key and value of token {token} at position {j} (rejected: the accepted token there is "
                        f"{final[j]}) were still in the cache. Crop the cache to the accepted length after "
                        "every verification."), ("stale cache", model.role, n, before, good)
        expected = Llama.forward(model, torch.tensor([context + ids[0].tolist()], device=model.device))[0].cpu()
        got = call["logits"][0]
        rows = expected[-got.shape[0]:] if got.dim() == 2 and got.shape[0] <= T else None
        if rows is None or got.shape != rows.shape or (got - rows).abs().max() > LOGIT_TOL:
            err = "a different shape" if rows is None or got.shape != rows.shape else \
                f"max error {float((got - rows).abs().max()):.2e}"
            return (f"{where}: the logits differ from an uncached forward of the same {before + T} tokens at the same "
                    f"positions ({err}): the cache does not hold the keys and values of exactly the accepted tokens"), \
                ("logits", model.role, n)
        seen.update((j, (token, time)) for j, token in zip(pos, ids[0].tolist()))
        held[model] = before + T
        if model.role == "target":
            judged.update((j, time) for j in pos)
            known += _verdict(call, known)[2]
    return None


def _accepted_prefix(seen: dict, final: list[int], limit: int) -> int:
    """How many of the first ``limit`` tokens a model computed equal the final sequence."""
    n = 0
    while n < min(limit, len(final)) and seen[n][0] == final[n]:
        n += 1
    return n


def _verdict(call: dict, known: int) -> tuple[int, int, int]:
    """(m, a, g) of a target forward after ``known`` accepted tokens: the m proposals it fed beyond them
    (the tokens past the accepted sequence), the a of them that agree with its own rows, and the g tokens
    it settles: a + 1 when it fed the pending token (position known - 1) or went beyond it, 0 when it fed
    accepted tokens only, all before the pending one (a prefill of the prompt but its last token, which
    the README allows: such a forward verifies nothing and is not a round)."""
    pos, ids, logits = _positions(call), call["ids"][0].tolist(), call["logits"][0]
    if pos[-1] + 1 < known:
        return 0, 0, 0
    m = pos[-1] + 1 - known
    proposals = ids[len(ids) - m:] if m else []
    choices = logits[-(m + 1):].argmax(-1).tolist() if logits.shape[0] >= m + 1 else []
    a = 0
    while a < min(m, len(choices)) and proposals[a] == choices[a]:
        a += 1
    return m, a, a + 1


def count_rounds(log: list[dict], prompt_len: int) -> dict:
    """What the target's calls show: forwards, proposals checked per forward, agreeing-prefix lengths.

    Every target forward counts as a forward; one that feeds accepted tokens only, short of the pending
    one (a prefill of the prompt but its last token), checks no proposals and settles no token. A
    forward over the whole prompt with nothing proposed checks none and settles one (the first new token)."""
    known, out = prompt_len, {"target_forwards": 0, "draft_forwards": 0, "proposed": 0, "accepted": 0, "per_forward": []}
    for call in log:
        if call["model"].role != "target":
            out["draft_forwards"] += 1
            continue
        out["target_forwards"] += 1
        m, a, settled = _verdict(call, known)
        out["proposed"] += m
        out["accepted"] += a
        out["per_forward"].append(m)
        known += settled
    return out
