"""``kvkata bench``, kata 09: what a quantized cache holds and what it costs in attention accuracy.

1. bytes — the reference ``QuantizedKVCache`` at 2, 4 and 8 bits with a realistic residual
   (32 and 128 tokens), filled to a few lengths, against kata 04's fp16 formula;
2. error — the relative error of attention outputs over the dequantized cache against the
   full-precision one, on keys with outlier channels: keys quantized per channel (KIVI), per token,
   or kept exact (values per token in all three).
3. real (``kvkata bench --real-model``, or ``python -m grader.bench.k09``) — KIVI's findings on
   SmolLM2-135M-Instruct reading the katas' READMEs: the error of keys quantized per channel against
   per token and of values per token against per channel, at 2, 4 and 8 bits; the outlier channels
   of the keys; and the perplexity with ``QuantizedKVCache`` at each width against full precision.

Sections 1 and 2 run the reference solutions, never the learner's files; section 3 the reference
unless ``--cache stub`` (your katas/09 file) or a PATH is given.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from grader import manifest, models
from grader.bench import k07 as bench_k07
from grader.bench.shared import reference
from grader.engine import targets
from grader.learner.pictures_models import KIVI_RESULTS as RESULTS
from grader.nn import attend

LAYERS, KV_HEADS, HEAD_DIM = 32, 8, 128  # shaped like an 8-billion-parameter Llama, one sequence
OUTLIERS = (3, 40, 77, 101)  # key channels that are large in every token


def outlier_keys(tokens: int, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys with a few outlier channels (large and offset in every token) and plain values, (1, Hkv, S, D)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, KV_HEADS, tokens, HEAD_DIM, generator=g)
    v = torch.randn(1, KV_HEADS, tokens, HEAD_DIM, generator=g)
    for i, channel in enumerate(OUTLIERS):
        k[..., channel] = k[..., channel] * 4 + (15 if i % 2 else -15)
    return k.to(device), v.to(device)


def bench_bytes(lengths: list[int], device: torch.device, progress) -> list[dict]:
    ref, fp16 = reference("09"), reference("04")["kv_cache_bytes"]
    rows = []
    for residual in (32, 128):
        for bits in (2, 4, 8):
            cache, filled = ref["QuantizedKVCache"](n_bits=bits, residual_len=residual), 0
            for tokens in lengths:  # one layer filled, times LAYERS: every layer holds the same
                kv = torch.zeros(1, KV_HEADS, tokens - filled, HEAD_DIM, dtype=torch.float16, device=device)
                cache.update(0, kv, kv)
                filled = tokens
                held, full = LAYERS * cache.nbytes(), fp16(LAYERS, 1, tokens, KV_HEADS, HEAD_DIM, 2)
                rows.append({"n_bits": bits, "residual_len": residual, "tokens": tokens, "quant_bytes": held,
                             "fp16_bytes": full, "ratio": full / held})
                progress.step(f"quantized bytes {bits}-bit R={residual} {tokens} tokens",
                              f"{held:,} B against {full:,} B in fp16 ({full / held:.2f}× smaller)")
    return rows


def _per_token_keys(ref: dict, k: torch.Tensor, bits: int, residual: int) -> torch.Tensor:
    """Keys quantized per token in the same groups the cache uses (the residual left exact)."""
    full = residual * (k.shape[2] // residual)
    codes, scale, zero = ref["quantize"](k[:, :, :full], bits, 3)  # statistics over D: per token
    return torch.cat([ref["dequantize"](codes, scale, zero), k[:, :, full:]], 2)  # (1, Hkv, S, D)


def _queries(k: torch.Tensor, queries: int, rep: int = 4) -> torch.Tensor:
    """Queries that look for particular cached tokens, as real ones do: half the ordinary channels
    of a random cached key plus noise, so each attends mostly to a few keys. (1, Hkv * rep, T, D)."""
    g = torch.Generator().manual_seed(1)
    picks = torch.randint(0, k.shape[2], (queries,), generator=g).to(k.device)
    q = 0.5 * k[:, :, picks].repeat_interleave(rep, 1)  # (1, Hq, T, D), query head h reads KV head h // rep
    q[..., list(OUTLIERS)] = 0.0
    return q + 0.5 * torch.randn(q.shape, generator=g).to(k.device)


def bench_error(tokens: int, device: torch.device, progress, residual: int = 32, queries: int = 16) -> list[dict]:
    ref = reference("09")
    k, v = outlier_keys(tokens, device)
    q = _queries(k, queries)
    sees_all = torch.ones(1, 1, queries, tokens, dtype=torch.bool, device=device)
    exact = attend(q, k, v, sees_all)  # (1, Hq, queries, D)
    rows = []
    for bits in (2, 4, 8):
        K, V = ref["QuantizedKVCache"](n_bits=bits, residual_len=residual).update(0, k, v)
        variants = (("per channel", K), ("per token", _per_token_keys(ref, k, bits, residual)),
                    ("full precision", k))  # the last: only the values quantized, for comparison
        normal = [c for c in range(HEAD_DIM) if c not in OUTLIERS]
        for keys, K_used in variants:
            out = attend(q, K_used, V, sees_all)
            error = ((out - exact).norm() / exact.norm()).item()
            key_error = ((K_used - k)[..., normal].norm() / k[..., normal].norm()).item()
            rows.append({"n_bits": bits, "keys": keys, "tokens": tokens, "residual_len": residual,
                         "attention_rel_error": error, "key_rel_error_normal_channels": key_error})
            progress.step(f"quantized attention {bits}-bit keys {keys}", f"relative error {error:.4f}, "
                          f"ordinary key channels {key_error:.4f}")
    return rows


def bench_quant(lengths: list[int], device: torch.device, progress) -> list[dict]:
    """Bytes at each of ``lengths`` (the append lengths of the run), attention error at a quarter of the longest."""
    return bench_bytes(lengths, device, progress) + bench_error(max(64, max(lengths) // 4), device, progress)


def steps(lengths: list[int]) -> int:
    """Progress lines ``bench_quant`` prints."""
    return len(lengths) * 2 * 3 + 9


def summary(rows: list[dict]) -> list[str]:
    """One line per bit width: bytes against fp16 at the longest length, and attention error."""
    lines = []
    longest = max(r["tokens"] for r in rows if "quant_bytes" in r)
    for bits in (2, 4, 8):
        sizes = {r["residual_len"]: r["ratio"] for r in rows if r.get("n_bits") == bits and r.get("tokens") == longest
                 and "ratio" in r}
        errors = {r["keys"]: r["attention_rel_error"] for r in rows if r.get("n_bits") == bits and "keys" in r}
        lines.append(f"quantized {bits}-bit at {longest} tokens: {sizes[32]:.2f}× smaller than fp16 (R=32), "
                     f"{sizes[128]:.2f}× (R=128); attention error, keys per channel {errors['per channel']:.4f}, "
                     f"per token {errors['per token']:.4f}, exact keys {errors['full precision']:.4f}")
    return lines


# -- 3. on a real model -------------------------------------------------------------------------
class _Capture:
    """A cache that keeps what each layer hands it (rotated keys, values) and returns it unchanged."""

    def __init__(self):
        self.k, self.v = {}, {}

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.k[layer], self.v[layer] = k, v
        return k, v


def _grouped_error(ref: dict, x: torch.Tensor, bits: int, dim: int, group: int) -> float:
    """Relative error of ``x`` (1, Hkv, S, D) quantized in groups of ``group`` tokens, statistics over
    ``dim`` (2: per channel, over the group's tokens; 3: per token, over the channels)."""
    S = group * (x.shape[2] // group)
    g = x[:, :, :S].reshape(x.shape[0], x.shape[1], S // group, group, x.shape[3])  # (1, Hkv, G, R, D)
    back = ref["dequantize"](*ref["quantize"](g, bits, dim + 1)).reshape(x[:, :, :S].shape)
    return ((back - x[:, :, :S]).norm() / x[:, :, :S].norm()).item()


def outliers(keys: torch.Tensor) -> dict:
    """Per-channel magnitude (mean |k| over heads and tokens), (D,), and the channels above 3× the median."""
    size = keys.abs().mean(dim=(0, 1, 2))  # (D,)
    big = (size > 3 * size.median()).nonzero()[:, 0].tolist()
    return {"magnitude": [round(x, 4) for x in size.tolist()], "outliers": big,
            "max_over_median": (size.max() / size.median()).item()}


@torch.no_grad()
def bench_real_errors(loaded, ids: list[int], ref: dict, progress, group: int = 32) -> list[dict]:
    capture = _Capture()
    loaded.model(torch.tensor([ids], device=loaded.model.device), cache=capture)
    layers = sorted(capture.k)
    rows = []
    for bits in (2, 4, 8):
        row = {"n_bits": bits, "tokens": len(ids), "group": group}
        for name, stash in (("keys", capture.k), ("values", capture.v)):
            for how, dim in (("per_channel", 2), ("per_token", 3)):
                errors = [_grouped_error(ref, stash[i].float(), bits, dim, group) for i in layers]
                row[f"{name}_{how}"] = sum(errors) / len(errors)
        rows.append(row)
        progress.step(f"real {bits}-bit errors", f"keys per channel {row['keys_per_channel']:.4f}, per token "
                      f"{row['keys_per_token']:.4f}; values per token {row['values_per_token']:.4f}, "
                      f"per channel {row['values_per_channel']:.4f}")
    rows.append({"layers": {i: {"keys": outliers(capture.k[i]), "values": outliers(capture.v[i])} for i in layers}})
    return rows


def _fp8_error(ref: dict, x: torch.Tensor, fmt: str, per_head: bool) -> float:
    """Relative error of ``x`` (1, Hkv, S, D) through the reference's FP8 cast, one scale for all of it."""
    scale = ref["fp8_scale"](x, fmt, per_head)
    back = ref["fp8_dequantize"](ref["fp8_quantize"](x, scale, fmt), scale, x.dtype)
    return ((back - x).norm() / x.norm()).item()


@torch.no_grad()
def bench_real_fp8(loaded, ids: list[int], ref: dict, progress, calibrate: int = 64) -> dict:
    """Task 6 on the real cache: the relative error of e4m3 and e5m2 per tensor and per head (mean over
    layers), and how many key elements a scale frozen after ``calibrate`` tokens pushes past 448."""
    capture = _Capture()
    loaded.model(torch.tensor([ids], device=loaded.model.device), cache=capture)
    layers = sorted(capture.k)
    rows = []
    for fmt, per_head in (("e4m3", False), ("e4m3", True), ("e5m2", False), ("e5m2", True)):
        row = {"fmt": fmt, "per_head": per_head, "tokens": len(ids)}
        for name, stash in (("keys", capture.k), ("values", capture.v)):
            row[name] = sum(_fp8_error(ref, stash[i].float(), fmt, per_head) for i in layers) / len(layers)
        rows.append(row)
        progress.step(f"real FP8 {fmt} {'per head' if per_head else 'per tensor'}",
                      f"keys {row['keys']:.4f}, values {row['values']:.4f}")
    past = sum(int((capture.k[i].float().abs() > 448 * ref["fp8_scale"](capture.k[i][:, :, :calibrate].float(), "e4m3")
                    ).sum()) for i in layers)
    total = sum(capture.k[i].numel() for i in layers)
    progress.step(f"real FP8 scale frozen after {calibrate} tokens", f"{past} of {total} key elements saturate")
    return {"rows": rows, "frozen_after": calibrate, "saturated": past, "elements": total}


def fp8_table(result: dict) -> str:
    """Markdown: FP8 error by format and scale."""
    out = ["| format | scale | keys | values |", "|---|---|---:|---:|"]
    for r in result["rows"]:
        out.append(f"| {r['fmt']} | {'per head' if r['per_head'] else 'per tensor'} | {r['keys']:.4f} | "
                   f"{r['values']:.4f} |")
    out.append(f"\nA key scale (e4m3) frozen after {result['frozen_after']} tokens: {result['saturated']:,} of "
               f"{result['elements']:,} key elements past 448, saturated.")
    return "\n".join(out)


@torch.inference_mode()
def quantized_nll(model, ids: list[int], cache, prefill: int) -> torch.Tensor:
    """NLL of tokens 1 … N-1 (N-1,) read through ``cache``: ``prefill`` tokens in one chunk, then one at a time."""
    tokens = torch.tensor([ids], device=model.device)
    positions = torch.arange(len(ids), device=model.device)[None]
    logits = [model(tokens[:, :prefill], position_ids=positions[:, :prefill], cache=cache)[0]]
    for i in range(prefill, len(ids) - 1):
        logits.append(model(tokens[:, i:i + 1], position_ids=positions[:, i:i + 1], cache=cache)[0])
    logp = torch.log_softmax(torch.cat(logits).float(), -1)
    return -logp.gather(1, tokens[0, 1:, None])[:, 0]


def bench_real_perplexity(loaded, ids: list[int], cache_class, progress, residual: int = 32) -> list[dict]:
    with torch.inference_mode():
        full = loaded.model(torch.tensor([ids], device=loaded.model.device))[0, :-1].float()
    target = torch.tensor(ids[1:], device=full.device)[:, None]
    nll = -torch.log_softmax(full, -1).gather(1, target)[:, 0]
    rows = [{"n_bits": None, "tokens": len(ids), "ppl": math.exp(nll.mean().item())}]
    progress.step("real perplexity full precision", f"{rows[0]['ppl']:.3f}")
    for bits in (8, 4, 2):
        # The prefill stays under one group: every token is then read as decoding would read it.
        nll = quantized_nll(loaded.model, ids, cache_class(n_bits=bits, residual_len=residual), residual - 1)
        rows.append({"n_bits": bits, "residual_len": residual, "tokens": len(ids), "ppl": math.exp(nll.mean().item())})
        progress.step(f"real perplexity {bits}-bit cache", f"{rows[-1]['ppl']:.3f} ({rows[-1]['ppl'] / rows[0]['ppl']:.3f}× full)")
    return rows


def bench_real(device, progress, tokens: int = 512, spec: str = "solution") -> dict:
    loaded = models.load(models.SMOLLM2, device=device)
    target = targets.resolve(manifest.get("09"), spec)
    ids = bench_k07.corpus(loaded.tokenizer, tokens)
    return {"impl": target.label, "errors": bench_real_errors(loaded, ids, reference("09"), progress),
            "fp8": bench_real_fp8(loaded, ids, reference("09"), progress),
            "perplexity": bench_real_perplexity(loaded, ids, target.namespace["QuantizedKVCache"], progress)}


def real_table(result: dict) -> str:
    """Markdown: quantization error by axis, and perplexity by bit width."""
    out = ["| bits | keys per channel | keys per token | values per token | values per channel | perplexity |",
           "|---:|---:|---:|---:|---:|---:|"]
    ppl = {r["n_bits"]: r["ppl"] for r in result["perplexity"]}
    for r in (r for r in result["errors"] if "n_bits" in r):
        out.append(f"| {r['n_bits']} | {r['keys_per_channel']:.4f} | {r['keys_per_token']:.4f} | "
                   f"{r['values_per_token']:.4f} | {r['values_per_channel']:.4f} | {ppl[r['n_bits']]:.3f} |")
    out.append(f"| full | 0 | 0 | 0 | 0 | {ppl[None]:.3f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.bench.k09", description="KIVI on SmolLM2: " + __doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--cache", default="solution", help="whose QuantizedKVCache: solution (default), stub or a PATH")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch (1 is faster on a busy machine)")
    p.add_argument("--json", metavar="FILE", type=Path, help=f"also write the results (the notebook reads {RESULTS.name})")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        result = bench_real(torch.device("cpu"), bench_k07.PrintProgress(), args.tokens, args.cache)
        if args.json:
            args.json.write_text(json.dumps(result) + "\n", encoding="utf-8")
    except (OSError, ValueError, ImportError, targets.TargetLoadError, NotImplementedError) as exc:
        print(f"bench_k09: error: {exc or type(exc).__name__}", file=sys.stderr)
        return 2
    print(real_table(result))
    print(fp8_table(result["fp8"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
