"""``kvkata bench --real-model``, kata 07: StreamingLLM's headline reproduced on a real model.

SmolLM2-135M-Instruct (``grader.models``) reads a long text that ships with the repository — the
katas' own READMEs, one after another — token by token, and the perplexity of each next token is
measured with three caches built from kata 07's ``SinkKVCache``:

(a) full      every token kept (a window longer than the text);
(b) window    the last S + W tokens, no sinks;
(c) sinks     the first S tokens + the last W.

Kept tokens sit at their slots in the cache, as kata 07 teaches. The expected shape, from the paper:
(b) far worse than (a) once the first tokens have left the window, (c) close to (a).

    python -m grader.bench.k07 [--tokens 1024] [--sinks 4] [--window 60] [--cache stub]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from grader import manifest, models
from grader.engine import targets
from grader.learner.pictures_models import STREAMING_RESULTS as RESULTS
from grader.nn import apply_rope, attend

TOKENS, SINKS, WINDOW = 1024, 4, 60


def corpus(tokenizer, tokens: int) -> list[int]:
    """The first ``tokens`` token ids of every kata README, in kata order, joined by blank lines."""
    readmes = [manifest.REPO_ROOT / k.readme for k in manifest.load().values()]
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in readmes if p.is_file())
    ids = tokenizer.encode(text).ids
    if len(ids) < tokens:
        raise ValueError(f"tokens: expected at most {len(ids)} (the katas' READMEs), got {tokens}")
    return ids[:tokens]


def sink_cache_class(spec: str = "solution"):
    """kata 07's ``SinkKVCache``: the reference (``solution``), the learner's file (``stub``) or a PATH."""
    target = targets.resolve(manifest.get("07"), spec)
    if "SinkKVCache" not in target.namespace:
        raise ValueError(f"cache: {target.label} defines no SinkKVCache")
    return target.label, target.namespace["SinkKVCache"]


def _forward(model, ids: torch.Tensor, caches: list) -> torch.Tensor:
    """ids (1, T) through the model, each layer's keys and values through its own sink cache;
    the queries rotated at the new tokens' slots. Returns logits (1, T, V)."""
    config, T = model.config, ids.shape[1]
    h = model.model.embed_tokens(ids)  # (1, T, hidden)
    for layer, cache in zip(model.model.layers, caches):
        attn, x = layer.self_attn, layer.input_layernorm(h)
        q = attn.q_proj(x).view(1, T, attn.n_q, attn.head_dim).transpose(1, 2)  # (1, Hq, T, D)
        k = attn.k_proj(x).view(1, T, attn.n_kv, attn.head_dim).transpose(1, 2)  # (1, Hkv, T, D) unrotated
        v = attn.v_proj(x).view(1, T, attn.n_kv, attn.head_dim).transpose(1, 2)
        K, V = cache.update(k, v)  # (1, Hkv, n, D), keys rotated at slots 0 … n-1
        n = K.shape[2]
        q = apply_rope(q, torch.arange(n - T, n, device=ids.device), config.rope_theta)
        out = attend(q, K, V)  # causal: the T new tokens are the last T of the n kept
        h = h + attn.o_proj(out.transpose(1, 2).reshape(1, T, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(model.model.norm(h))  # (1, T, V)


@torch.inference_mode()
def stream_nll(model, ids: list[int], make_cache, prefill: int) -> torch.Tensor:
    """Negative log-likelihood of tokens 1 … N-1, (N-1,): the first ``prefill`` tokens in one chunk
    (nothing is evicted yet), the rest one at a time."""
    caches = [make_cache() for _ in model.model.layers]
    tokens = torch.tensor([ids], device=model.device)
    prefill = max(1, min(prefill, len(ids) - 1))
    logits = [_forward(model, tokens[:, :prefill], caches)[0]]  # (prefill, V)
    for i in range(prefill, len(ids) - 1):
        logits.append(_forward(model, tokens[:, i:i + 1], caches)[0])  # (1, V)
    logp = torch.log_softmax(torch.cat(logits).float(), -1)  # (N-1, V)
    return -logp.gather(1, tokens[0, 1:, None])[:, 0]


def bench_streaming(device, progress, tokens: int = TOKENS, sinks: int = SINKS, window: int = WINDOW,
                    spec: str = "solution") -> list[dict]:
    loaded = models.load(models.SMOLLM2, device=device)
    label, SinkKVCache = sink_cache_class(spec)
    ids = corpus(loaded.tokenizer, tokens)
    base = loaded.model.config.rope_theta
    setups = (("full", 0, tokens), ("window", 0, sinks + window), ("sinks", sinks, window))
    rows = []
    for name, n_sink, kept in setups:
        started = time.perf_counter()
        nll = stream_nll(loaded.model, ids, lambda: SinkKVCache(n_sink, kept, rope_base=base), n_sink + kept)
        late = nll[sinks + window:]  # the tokens read after the first ones could have left the cache
        rows.append({"cache": name, "n_sink": n_sink, "window": kept, "tokens": tokens, "impl": label,
                     "ppl": math.exp(nll.mean().item()), "ppl_after_eviction": math.exp(late.mean().item()),
                     "nll": [round(x, 4) for x in nll.tolist()], "seconds": time.perf_counter() - started})
        progress.step(f"streaming {name} (sinks {n_sink}, window {kept})",
                      f"perplexity {rows[-1]['ppl']:.2f}, after eviction {rows[-1]['ppl_after_eviction']:.2f}")
    return rows


def lines(rows: list[dict]) -> list[str]:
    full = next(r for r in rows if r["cache"] == "full")["ppl_after_eviction"]
    return [f"streaming {r['cache']:>6} (sinks {r['n_sink']}, window {r['window']}) over {r['tokens']} tokens: "
            f"perplexity {r['ppl']:.2f}, after eviction {r['ppl_after_eviction']:.2f} "
            f"({r['ppl_after_eviction'] / full:.2f}× full)" for r in rows]


def table(rows: list[dict]) -> str:
    """A Markdown table: one row per cache."""
    full = next(r for r in rows if r["cache"] == "full")["ppl_after_eviction"]
    out = ["| cache | sinks | window | perplexity | after eviction | × full |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['cache']} | {r['n_sink']} | {r['window']} | {r['ppl']:.2f} | "
                   f"{r['ppl_after_eviction']:.2f} | {r['ppl_after_eviction'] / full:.2f} |")
    return "\n".join(out)


class PrintProgress:
    total = done = 0

    def step(self, label: str, result: str) -> None:
        print(f"{label}: {result}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.bench.k07", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=TOKENS)
    p.add_argument("--sinks", type=int, default=SINKS)
    p.add_argument("--window", type=int, default=WINDOW)
    p.add_argument("--cache", default="solution", help="whose SinkKVCache: solution (default), stub (katas/07) or a PATH")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch (1 is faster on a busy machine)")
    p.add_argument("--json", metavar="FILE", type=Path, help=f"also write the rows (the notebook reads {RESULTS.name})")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        rows = bench_streaming(torch.device("cpu"), PrintProgress(), args.tokens, args.sinks, args.window, args.cache)
        if args.json:
            args.json.write_text(json.dumps(rows) + "\n", encoding="utf-8")
    except (OSError, ValueError, ImportError, targets.TargetLoadError, NotImplementedError) as exc:
        print(f"bench_k07: error: {exc or type(exc).__name__}", file=sys.stderr)
        return 2
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
