"""``kvkata bench``, kata 09: what a quantized cache holds and what it costs in attention accuracy.

1. bytes — the reference ``QuantizedKVCache`` at 2, 4 and 8 bits with a realistic residual
   (32 and 128 tokens), filled to a few lengths, against kata 04's fp16 formula;
2. error — the relative error of attention outputs over the dequantized cache against the
   full-precision one, on keys with outlier channels: keys quantized per channel (KIVI), per token,
   or kept exact (values per token in all three).

Everything runs the reference solutions, never the learner's files.
"""
from __future__ import annotations

import torch

from grader.bench.shared import reference
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
