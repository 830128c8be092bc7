"""Kata 04's and kata 10's numbers on a real model, SmolLM2-135M-Instruct: no forward pass, so
seconds rather than minutes.

1. memory (kata 04) — the formula on SmolLM2's own ``config.json`` against the bytes kata 05's
   reference cache allocates for the same shape, and the context at which the cache outweighs
   the weights;
2. prefix cache (kata 10) — chat requests rendered with SmolLM2's chat template, which opens every
   conversation with the same system prompt: the share of prompt tokens a prefix cache reuses;
3. generate (``--generate``, needs transformers) — kata 08's reference loop against Hugging Face
   ``generate()`` on the same converted weights, side by side in one run, greedy, same tokens.

    python -m grader.bench.smollm2
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from grader import manifest, models
from grader.bench.k07 import PrintProgress
from grader.engine import targets

QUESTIONS = ["What is a KV cache?", "Why do transformers cache keys and values?", "What does RoPE rotate?",
             "How does grouped-query attention save memory?", "What is paged attention?",
             "Explain attention sinks.", "Why quantize keys per channel?", "What is speculative decoding?",
             "How does beam search share memory?", "What is continuous batching?",
             "How big is the cache of a long chat?", "What is prefix caching?"]


def _reference(kata_id: str) -> dict:
    return targets.reference(manifest.get(kata_id)).namespace


def bench_memory(loaded, progress, seq_len: int = 8192, batch: int = 1) -> dict:
    k04, k05 = _reference("04"), _reference("05")
    config = json.loads((loaded.folder / "config.json").read_text(encoding="utf-8"))
    c = loaded.model.config
    formula = k04["kv_cache_bytes_from_config"](config, batch, seq_len, 2)
    cache = k05["StaticKVCache"](c.num_hidden_layers, batch, seq_len, c.num_key_value_heads, c.head_dim,
                                 dtype=torch.float16)
    held = sum(t.numel() * t.element_size() for t in cache.keys + cache.values)
    weights = sum(p.numel() for p in loaded.model.parameters()) * 2  # fp16; the tied head counted once
    crossover = k04["crossover_tokens"](weights, c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 2)
    row = {"seq_len": seq_len, "batch": batch, "formula_bytes": formula, "allocated_bytes": held,
           "per_token_bytes": formula // (batch * seq_len), "weight_bytes_fp16": weights, "crossover_tokens": crossover}
    progress.step("SmolLM2 cache memory", f"formula {formula:,} B, kata 05's cache allocates {held:,} B for "
                  f"{seq_len} tokens in fp16; the cache outweighs the weights ({weights:,} B) past {crossover:,} tokens")
    return row


def bench_prefix(loaded, progress, block_sizes: tuple[int, ...] = (4, 16)) -> list[dict]:
    prompts = [loaded.chat(q) for q in QUESTIONS]
    total, rows = sum(map(len, prompts)), []
    for block in block_sizes:
        cache = _reference("10")["PrefixCache"](sum(-(-len(p) // block) for p in prompts), block)
        reused = sum(cache.allocate(i, p) for i, p in enumerate(prompts))
        rows.append({"block_size": block, "requests": len(prompts), "prompt_tokens": total, "reused_tokens": reused,
                     "hit_rate": reused / total})
        progress.step(f"SmolLM2 chats, prefix cache, blocks of {block}",
                      f"{reused} of {total} prompt tokens reused (hit rate {reused / total:.0%})")
    return rows


def _timed(run, repeats: int = 3):
    result, times = run(), []  # one warm-up call
    for _ in range(repeats):
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


@torch.inference_mode()
def bench_generate(loaded, progress, batches: tuple[int, ...] = (1, 4), new_tokens: int = 32) -> list[dict]:
    import transformers  # optional: only this section needs it

    hf = transformers.LlamaForCausalLM.from_pretrained(loaded.folder, dtype=torch.float32).eval()
    generate = _reference("08")["generate"]
    rows = []
    for batch in batches:
        prompts = [loaded.chat(q) for q in QUESTIONS[:batch]]
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        ours_s, ours = _timed(lambda: generate(loaded.model, prompts, new_tokens))
        hf_s, theirs = _timed(lambda: hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                                  min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                                                  eos_token_id=None)[:, width:].tolist())
        rows.append({"batch": batch, "new_tokens": new_tokens, "reference_tokens_per_s": batch * new_tokens / ours_s,
                     "hf_tokens_per_s": batch * new_tokens / hf_s, "same_tokens": ours == theirs})
        r = rows[-1]
        progress.step(f"SmolLM2 generate batch {batch}", f"reference {r['reference_tokens_per_s']:.1f} tokens/s, "
                      f"transformers {r['hf_tokens_per_s']:.1f} tokens/s "
                      f"({r['reference_tokens_per_s'] / r['hf_tokens_per_s']:.2f}×), same tokens: {r['same_tokens']}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.bench.smollm2", description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, default=8192, help="context for the memory row (default 8192)")
    p.add_argument("--generate", action="store_true", help="also time the reference loop against transformers")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch (1 is faster on a busy machine)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        loaded = models.load(models.SMOLLM2)
    except (OSError, ValueError, ImportError) as exc:
        print(f"bench_smollm2: error: {exc}", file=sys.stderr)
        return 2
    say = PrintProgress()
    result = {"memory": bench_memory(loaded, say, args.seq_len), "prefix_cache": bench_prefix(loaded, say)}
    if args.generate:
        try:
            result["generate"] = bench_generate(loaded, say)
        except ImportError:
            print("--generate needs transformers: pip install transformers", file=sys.stderr)
            return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
