"""``python -m grader.bench.k21``: which tokens to keep after a prefill, measured on a real model.

SmolLM2-135M-Instruct (``grader.models``) reads a context of 512 tokens of the katas' own READMEs in one
prefill, with full attention. Each layer's cache, a kata 21 ``ScoredKVCache``, is then cut to a budget
of tokens per KV head, and the model reads the next 127 tokens one at a time through it (no more
eviction: the cache grows by what it reads); the perplexity of each next token is measured. Policies:

  full      nothing evicted;
  recent    the last ``budget`` tokens of the context;
  sinks     the first 4 and the last ``budget - 4``;
  h2o       ``observe`` of the prefill's attention weights: the best accumulated totals, a quarter of the
            budget kept as the recent window;
  snapkv    ``snapkv_scores`` of the context's last 16 queries, ``compress(snapkv_keep(...))``.

Kept keys keep their true rotation and every new token sits at ``tokens_seen``, as the kata teaches.

    python -m grader.bench.k21 [--budgets 128 64] [--windows 3] [--cache stub]
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from grader import manifest, models
from grader.bench.k07 import corpus
from grader.engine import targets
from grader.nn import apply_rope, attend

CONTEXT, NEXT, WINDOWS, SINKS, SNAP_WINDOW = 512, 127, 3, 4, 16
POLICIES = ("recent", "sinks", "h2o", "snapkv")


def evict_api(spec: str = "solution") -> tuple[str, dict]:
    """kata 21's functions: the reference (``solution``), the learner's file (``stub``) or a PATH."""
    target = targets.resolve(manifest.get("21"), spec)
    missing = [n for n in ("ScoredKVCache", "snapkv_scores", "snapkv_keep") if n not in target.namespace]
    if missing:
        raise ValueError(f"cache: {target.label} defines no {', '.join(missing)}")
    return target.label, target.namespace


def _heads(attn, x, proj, n):
    T = x.shape[1]
    return proj(x).view(1, T, n, attn.head_dim).transpose(1, 2)  # (1, H, T, D)


@torch.inference_mode()
def prefill(model, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """ids (1, S) with full causal attention; per layer the unrotated keys, the values (1, Hkv, S, D) and
    the rotated queries (1, Hq, S, D)."""
    S, theta = ids.shape[1], model.config.rope_theta
    pos = torch.arange(S, device=ids.device)
    h, kept = model.model.embed_tokens(ids), []
    for layer in model.model.layers:
        attn, x = layer.self_attn, layer.input_layernorm(h)
        q = apply_rope(_heads(attn, x, attn.q_proj, attn.n_q), pos, theta)
        k, v = _heads(attn, x, attn.k_proj, attn.n_kv), _heads(attn, x, attn.v_proj, attn.n_kv)
        out = attend(q, apply_rope(k, pos, theta), v)
        kept.append((k, v, q))
        h = h + attn.o_proj(out.transpose(1, 2).reshape(1, S, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return kept


def _weights(q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Causal attention weights of the prefill (1, Hq, S, S), each query head over its group's keys."""
    K = K.repeat_interleave(q.shape[1] // K.shape[1], dim=1)
    S = q.shape[2]
    logits = q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])
    hidden = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(logits.masked_fill(hidden, float("-inf")), dim=-1)


def build_cache(api: dict, layer, policy: str, budget: int, theta: float):
    """One layer's cache after the prefill, cut to ``budget`` tokens per KV head by ``policy``."""
    k, v, q = layer
    S = k.shape[2]
    if policy == "h2o":
        cache = api["ScoredKVCache"](budget, budget // 4, rope_base=theta)
        K, _ = cache.update(k, v)
        cache.observe(_weights(q, K))
        return cache
    cache = api["ScoredKVCache"](S + NEXT + 1, 0, rope_base=theta)  # a budget no decode step reaches
    K, _ = cache.update(k, v)
    if policy == "full" or budget >= S:
        return cache
    if policy == "snapkv":
        keep = api["snapkv_keep"](api["snapkv_scores"](q[:, :, -SNAP_WINDOW:], K), budget, SNAP_WINDOW)
    else:
        first = list(range(SINKS)) if policy == "sinks" else []
        rows = first + list(range(S - budget + len(first), S))
        keep = torch.tensor(rows, device=k.device).expand(1, k.shape[1], len(rows))
    cache.compress(keep.contiguous())
    return cache


@torch.inference_mode()
def decode_nll(model, ids: torch.Tensor, caches: list) -> torch.Tensor:
    """ids (1, N): each token read through the caches, one at a time, its query at ``tokens_seen - 1``;
    the negative log-likelihood of tokens 1 … N-1, (N-1,)."""
    theta, nll = model.config.rope_theta, []
    for i in range(ids.shape[1] - 1):
        h = model.model.embed_tokens(ids[:, i:i + 1])
        for layer, cache in zip(model.model.layers, caches):
            attn, x = layer.self_attn, layer.input_layernorm(h)
            K, V = cache.update(_heads(attn, x, attn.k_proj, attn.n_kv), _heads(attn, x, attn.v_proj, attn.n_kv))
            where = torch.tensor([cache.tokens_seen - 1], device=ids.device)
            q = apply_rope(_heads(attn, x, attn.q_proj, attn.n_q), where, theta)
            h = h + attn.o_proj(attend(q, K, V).transpose(1, 2).reshape(1, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        logp = torch.log_softmax(model.lm_head(model.model.norm(h))[0, -1].float(), -1)
        nll.append(-logp[ids[0, i + 1]])
    return torch.stack(nll)


def run(model, windows: list[list[int]], api: dict, budgets, context: int = CONTEXT, progress=None) -> list[dict]:
    """Perplexity of each (policy, budget) and of the full cache over every window of the text."""
    theta, device = model.config.rope_theta, model.model.embed_tokens.weight.device
    setups = [("full", context)] + [(p, b) for b in budgets for p in POLICIES]
    nll = {s: [] for s in setups}
    for w in windows:
        ids = torch.tensor([w], device=device)
        layers = prefill(model, ids[:, :context])
        for policy, budget in setups:
            caches = [build_cache(api, layer, policy, budget, theta) for layer in layers]
            nll[(policy, budget)].append(decode_nll(model, ids[:, context:], caches))
            if progress:
                progress(f"{policy} {budget}: {math.exp(nll[(policy, budget)][-1].mean().item()):.2f}")
    return [{"policy": p, "budget": b, "ppl": math.exp(torch.cat(nll[(p, b)]).mean().item())} for p, b in setups]


def table(rows: list[dict]) -> str:
    full = next(r["ppl"] for r in rows if r["policy"] == "full")
    out = ["| kept of the context | " + " | ".join(POLICIES) + " |", "|---:|" + "---:|" * len(POLICIES)]
    for b in sorted({r["budget"] for r in rows if r["policy"] != "full"}, reverse=True):
        cells = [next(f"{r['ppl']:.2f}" for r in rows if r["policy"] == p and r["budget"] == b) for p in POLICIES]
        out.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(out) + f"\n\nfull cache: {full:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.bench.k21", description=__doc__.splitlines()[0])
    p.add_argument("--budgets", type=int, nargs="+", default=[128, 64])
    p.add_argument("--windows", type=int, default=WINDOWS, help="how many 640-token stretches of the text")
    p.add_argument("--cache", default="solution", help="whose kata 21: solution (default), stub (katas/21) or a PATH")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    try:
        loaded = models.load(models.SMOLLM2, device=torch.device("cpu"))
        label, api = evict_api(args.cache)
        span = CONTEXT + NEXT + 1
        ids = corpus(loaded.tokenizer, span * args.windows)
        windows = [ids[i * span:(i + 1) * span] for i in range(args.windows)]
        rows = run(loaded.model, windows, api, args.budgets,
                   progress=lambda line: print(line, file=sys.stderr, flush=True))
    except (OSError, ValueError, ImportError, targets.TargetLoadError, NotImplementedError) as exc:
        print(f"bench_k21: error: {exc or type(exc).__name__}", file=sys.stderr)
        return 2
    print(f"{label}, SmolLM2-135M-Instruct, {args.windows} windows of {CONTEXT} + {NEXT} tokens, "
          f"{time.perf_counter() - started:.0f} s")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
