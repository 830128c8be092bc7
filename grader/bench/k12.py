"""``kvkata bench``, part 4: speculative decoding (kata 12) against plain greedy decoding.

The target is a 6-layer Llama whose top 4 layers add only a small correction to the residual
stream, so a 2-layer draft made of its embedding, first 2 layers, norm and head agrees with it
on almost every token: the *close* draft, as good as drafts get. The *perturbed* draft is that
draft with noise on its weights, the *random* draft a fresh 2-layer model. The costs are real
(a 2-layer against a 6-layer forward); the three drafts set the acceptance rate. Plain decoding
is kata 08's cached loop at batch 1. Everything runs the reference solutions.

On a real model (``python -m grader.bench.k12``, or ``kvkata bench --real-model``): self-speculation
as LayerSkip does it, SmolLM2-135M-Instruct's first few layers with its final norm and LM head as the
draft, on a chat reply; acceptance, target forwards per token, and whether the tokens equal greedy's.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch

from grader import models
from grader.bench import noise as bench_noise
from grader.bench.k07 import PrintProgress
from grader.bench.shared import reference
from grader.nn import Llama, LlamaConfig

TARGET_CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=6,
                     num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)
DRAFT_LAYERS, TOP_SCALE, NOISE = 2, 0.02, 0.1
DRAFTS = ("close", "perturbed", "random")


def _models(device: torch.device):
    """The target and its three drafts: close, perturbed, random."""
    torch.manual_seed(0)
    target = Llama(LlamaConfig(**TARGET_CONFIG)).to(device).eval()
    with torch.no_grad():
        for layer in target.model.layers[DRAFT_LAYERS:]:  # the top layers only nudge the residual stream
            layer.self_attn.o_proj.weight.mul_(TOP_SCALE)
            layer.mlp.down_proj.weight.mul_(TOP_SCALE)
    small = {**TARGET_CONFIG, "num_hidden_layers": DRAFT_LAYERS}
    close = Llama(LlamaConfig(**small)).to(device).eval()
    close.load_state_dict({name: p for name, p in target.state_dict().items() if name in close.state_dict()})
    noisy = Llama(LlamaConfig(**small)).to(device).eval()
    noisy.load_state_dict(close.state_dict())
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn_like(p) * NOISE * p.std())
    random = Llama(LlamaConfig(**small)).to(device).eval()
    return target, dict(zip(DRAFTS, (close, noisy, random)))


def steps() -> int:
    """Progress lines ``bench_speculative`` prints: plain decoding, then each draft."""
    return 1 + len(DRAFTS)


def _timed(run, repeats: int, device: torch.device):
    """(bench_noise.figure of the seconds, last result) of ``run()`` after one warm-up call."""
    run()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    return bench_noise.repeat(run, repeats, sync, on_cpu=device.type == "cpu")


def bench_speculative(device: torch.device, progress, quick: bool, new_tokens: int | None = None,
                      k: int = 4) -> list[dict]:
    """Tokens/s and target forwards per token: plain greedy, then speculative with each draft."""
    N = new_tokens or (32 if quick else 96)
    repeats = bench_noise.MIN_REPEATS
    target, drafts = _models(device)
    generate, speculate = reference("08")["generate"], reference("12")["speculative_generate"]
    prompt = torch.randint(1, TARGET_CONFIG["vocab_size"], (24,), generator=torch.Generator().manual_seed(1)).tolist()
    timing, rows = _timed(lambda: generate(target, [prompt], N), repeats, device)
    plain = rows[0]
    out = [{"decoder": "plain", "draft": None, "k": None, "tokens_per_s": round(N / timing["median"], 1),
            "target_forwards_per_token": 1.0, "acceptance": None, "same_tokens": True,
            "spread": timing["spread"], "cpu_share": timing["cpu_share"], "noisy": timing["noisy"]}]
    progress.step("speculative plain greedy", f"{out[-1]['tokens_per_s']:9.1f} tokens/s"
                  f"{bench_noise.mark(timing)}, 1.00 target forwards/token")
    for name, draft in drafts.items():
        timing, (tokens, stats) = _timed(lambda: speculate(target, draft, prompt, N, k), repeats, device)
        out.append({"decoder": "speculative", "draft": name, "k": k, "tokens_per_s": round(N / timing["median"], 1),
                    "target_forwards_per_token": round(stats["target_forwards"] / N, 3),
                    "acceptance": round(stats["accepted"] / max(stats["proposed"], 1), 3),
                    "same_tokens": tokens == plain, "spread": timing["spread"], "cpu_share": timing["cpu_share"],
                    "noisy": timing["noisy"]})
        row = out[-1]
        progress.step(f"speculative k={k} {name:>9} draft",
                      f"{row['tokens_per_s']:9.1f} tokens/s{bench_noise.mark(timing)}, "
                      f"{row['target_forwards_per_token']:.2f} target forwards/token, "
                      f"acceptance {row['acceptance']:.2f}, same tokens as plain: {row['same_tokens']}")
    return out


def lines(rows: list[dict]) -> list[str]:
    """One line per speculative run: its speed against plain greedy decoding."""
    plain = next(r for r in rows if r["decoder"] == "plain")
    return [f"speculative k={r['k']} {r['draft']} draft / plain greedy tokens/s: "
            + ("NOISY, not a result" if r.get("noisy") or plain.get("noisy") else f"{r['tokens_per_s'] / plain['tokens_per_s']:.2f}")
            + f" (acceptance {r['acceptance']:.2f}, {r['target_forwards_per_token']:.2f} target forwards per token)"
            for r in rows if r["decoder"] == "speculative"]


# -- a real model drafting for itself ---------------------------------------------------------
def early_exit_draft(model: Llama, layers: int) -> Llama:
    """A draft sharing ``model``'s weights: its embedding, first ``layers`` layers, final norm and head."""
    config = dataclasses.replace(model.config, num_hidden_layers=layers)
    with torch.device("meta"):  # shapes only: every module is replaced by the target's own below
        draft = Llama(config)
    draft.model["embed_tokens"], draft.model["norm"] = model.model.embed_tokens, model.model.norm
    draft.model["layers"] = torch.nn.ModuleList(model.model.layers[:layers])
    draft.lm_head = model.lm_head
    return draft.eval()


def bench_self_speculation(device, progress, layers: tuple[int, ...] = (4, 10, 20), new_tokens: int = 48,
                           k: int = 4, question: str = "Explain in a few sentences what a KV cache is.") -> list[dict]:
    loaded = models.load(models.SMOLLM2, device=device)
    generate, speculate = reference("08")["generate"], reference("12")["speculative_generate"]
    prompt, eos = loaded.chat(question), loaded.special.get("eos_token_id")
    started = time.perf_counter()
    plain = generate(loaded.model, [prompt], new_tokens, eos_token_id=eos)[0]
    rows = [{"draft_layers": None, "tokens": len(plain), "seconds": time.perf_counter() - started}]
    progress.step("self-speculation plain greedy", f"{len(plain)} tokens in {rows[0]['seconds']:.1f} s")
    for n in layers:
        started = time.perf_counter()
        tokens, stats = speculate(loaded.model, early_exit_draft(loaded.model, n), prompt, new_tokens, k,
                                  eos_token_id=eos)
        rows.append({"draft_layers": n, "k": k, "tokens": len(tokens), "seconds": time.perf_counter() - started,
                     "acceptance": stats["accepted"] / max(stats["proposed"], 1),
                     "target_forwards_per_token": stats["target_forwards"] / max(len(tokens), 1),
                     "same_tokens": tokens == plain})
        r = rows[-1]
        progress.step(f"self-speculation draft = first {n} of {loaded.model.config.num_hidden_layers} layers",
                      f"acceptance {r['acceptance']:.2f}, {r['target_forwards_per_token']:.2f} target forwards/token, "
                      f"{r['seconds']:.1f} s, same tokens as greedy: {r['same_tokens']}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.bench.k12", description="Self-speculation on SmolLM2.")
    p.add_argument("--layers", type=int, nargs="+", default=[4, 10, 20], help="draft depths to try")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch (1 is faster on a busy machine)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        rows = bench_self_speculation(torch.device("cpu"), PrintProgress(), tuple(args.layers), args.new_tokens)
    except (OSError, ValueError, ImportError) as exc:
        print(f"bench_k12: error: {exc}", file=sys.stderr)
        return 2
    print("| draft layers | acceptance | target forwards / token | seconds | same tokens as greedy |")
    print("|---:|---:|---:|---:|---|")
    for r in rows:
        if r["draft_layers"] is None:
            print(f"| (plain greedy) | | 1.00 | {r['seconds']:.1f} | |")
        else:
            print(f"| {r['draft_layers']} | {r['acceptance']:.2f} | {r['target_forwards_per_token']:.2f} | "
                  f"{r['seconds']:.1f} | {r['same_tokens']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
