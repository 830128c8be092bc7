"""``kvkata bench``, offloading part (kata 14's reference): a Llama decoding over a long cache held
whole on the device (a plain cache) or offloaded to host memory one layer ahead, and a paged sequence
swapped back in against recomputing it as a prefill.

Per context length: the cache bytes on the device (every layer, against the layers ``resident()``
lists at the worst update; on CUDA also the measured peak of ``torch.cuda.max_memory_allocated``),
decode tokens/s both ways, and the bytes each decode step moves (the cache's own stats: every layer
in, the new tokens out; and what writing whole layers back would move, computed). On a CPU-only
machine the "device" is host memory too: its memory and copy times mean nothing there, and the lines
say so; the byte counts hold everywhere.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from grader import models
from grader.bench.k07 import PrintProgress
from grader.bench.shared import reference
from grader.nn import Llama, LlamaConfig
from grader.paged import PagedKVCache

CONFIG = dict(vocab_size=256, hidden_size=512, intermediate_size=1024, num_hidden_layers=8,
              num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=16384)
BLOCK = 16


class _Plain:
    def __init__(self):
        self.layers = {}

    def update(self, layer, k, v):
        if layer in self.layers:
            K, V = self.layers[layer]
            k, v = torch.cat([K, k], 2), torch.cat([V, v], 2)  # (B, Hkv, S + T, D)
        self.layers[layer] = (k, v)
        return k, v


class _Worst:
    """Notes the largest bytes of the layers the offloaded cache holds on the device after any update."""

    def __init__(self, cache, layer_bytes):
        self.cache, self.layer_bytes, self.worst = cache, layer_bytes, 0

    def update(self, layer, k, v):
        out = self.cache.update(layer, k, v)
        held = sum(self.layer_bytes(i) for i in set(self.cache.resident()))
        self.worst = max(self.worst, held)
        return out


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fill(cache, batch: int, tokens: int, device, dtype):
    """A context of ``tokens`` random keys and values in every layer (one update each, in order)."""
    c = LlamaConfig(**CONFIG)
    g = torch.Generator().manual_seed(0)
    for layer in range(c.num_hidden_layers):
        k, v = (torch.randn(batch, c.num_key_value_heads, tokens, c.head_dim, generator=g).to(device, dtype)
                for _ in range(2))
        cache.update(layer, k, v)


def _decode(model, cache, batch: int, start: int, steps: int, device) -> float:
    ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
    _sync(device)
    began = time.perf_counter()
    with torch.no_grad():
        for n in range(steps):
            model(ids, torch.full((batch, 1), start + n, device=device), cache=cache)
    _sync(device)
    return time.perf_counter() - began


def bench_context(model, Offloaded, batch: int, tokens: int, steps: int, device) -> dict:
    c, dtype = model.config, model.dtype
    per_token = 2 * batch * c.num_key_value_heads * c.head_dim * torch.empty(0, dtype=dtype).element_size()
    plain = _Plain()
    _fill(plain, batch, tokens, device, dtype)
    plain_s = _decode(model, plain, batch, tokens, steps, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    cache = Offloaded(c.num_hidden_layers, device=device)
    _fill(cache, batch, tokens, device, dtype)
    worst = _Worst(cache, lambda i: per_token * cache.seq_len(i))
    before = dict(cache.stats)
    off_s = _decode(model, worst, batch, tokens, steps, device)
    after = cache.stats
    row = {"tokens": tokens, "batch": batch, "layers": c.num_hidden_layers,
           "device_kv_bytes_default": per_token * (tokens + steps) * c.num_hidden_layers,
           "device_kv_bytes_offloaded": worst.worst,
           "tokens_per_s_default": round(batch * steps / plain_s, 1),
           "tokens_per_s_offloaded": round(batch * steps / off_s, 1),
           "h2d_bytes_per_step": (after["h2d_bytes"] - before["h2d_bytes"]) // steps,
           "d2h_bytes_per_step": (after["d2h_bytes"] - before["d2h_bytes"]) // steps,
           "misses": after["misses"] - before["misses"]}
    # Whole layers written back: each step sends every layer's S + 1 tokens to the host (computed, mid-run S).
    row["d2h_bytes_per_step_whole_layers"] = per_token * (tokens + steps // 2 + 1) * c.num_hidden_layers
    if device.type == "cuda":
        row["cuda_peak_bytes_offloaded"] = torch.cuda.max_memory_allocated(device) - base
    return row


def bench_swap(model, ns, lengths: list[int], device, repeats: int = 3) -> list[dict]:
    """Seconds to swap a sequence of S tokens back in, against a prefill of S tokens (the recompute)."""
    c = model.config
    rows = []
    for S in lengths:
        n_blocks = -(-S // BLOCK)
        cache = PagedKVCache(n_blocks + 1, BLOCK, c.num_hidden_layers, c.num_key_value_heads, c.head_dim,
                             dtype=model.dtype, device=device)
        pool = ns["HostBlockPool"](n_blocks, BLOCK, c.num_hidden_layers, c.num_key_value_heads, c.head_dim,
                                   dtype=model.dtype)
        cache.add_sequence(0)
        cache.reserve(0, S)
        swap_in_s = []
        for _ in range(repeats):
            ns["swap_out"](cache, pool, 0)
            _sync(device)
            began = time.perf_counter()
            ns["swap_in"](cache, pool, 0)
            _sync(device)
            swap_in_s.append(time.perf_counter() - began)
        ids = torch.zeros(1, S, dtype=torch.long, device=device)
        prefill_s = []
        with torch.no_grad():
            for _ in range(repeats):
                _sync(device)
                began = time.perf_counter()
                model(ids, cache=_Plain())
                _sync(device)
                prefill_s.append(time.perf_counter() - began)
        rows.append({"tokens": S, "swap_in_ms": round(1000 * min(swap_in_s), 3),
                     "recompute_ms": round(1000 * min(prefill_s), 3)})
    return rows


SWAP_LONGEST = 4096  # a longer recompute prefill holds a (heads, S, S) score matrix of gigabytes


def steps(lengths: list[int]) -> int:
    """Progress lines ``bench_offload`` prints: one per context length, one for the swap."""
    return len(lengths) + 1


def bench_offload(device: torch.device, progress, quick: bool, lengths: list[int]) -> dict:
    """Decoding at each context length of ``lengths``, default against offloaded; then swap against recompute."""
    ns = reference("14")
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**CONFIG)).to(device).eval()
    batch = 4 if quick else 8
    rows = []
    for tokens in lengths:
        rows.append(bench_context(model, ns["OffloadedKVCache"], batch, tokens, 8 if quick else 16, device))
        r = rows[-1]
        progress.step(f"offload  {tokens} tokens", f"{r['tokens_per_s_offloaded']:9.1f} tokens/s offloaded, "
                      f"{r['tokens_per_s_default']:.1f} default")
    swap = bench_swap(model, ns, [64] + [n for n in lengths if n <= SWAP_LONGEST], device)
    progress.step("offload  swap vs recompute", ", ".join(f"{r['tokens']}: {r['swap_in_ms']} / {r['recompute_ms']} ms"
                                                          for r in swap))
    return {"device": device.type, "contexts": rows, "swap": swap}


def lines(result: dict) -> list[str]:
    """Human-readable lines of the offloading rows."""
    out = []
    if result["device"] == "cpu":
        out.append("offload: on a CPU-only machine the device is host memory too: device bytes, copy times and "
                   "tokens/s here say nothing about a GPU; the bytes each step moves do")
    for r in result["contexts"]:
        mib = 1 << 20
        out.append(f"offload {r['tokens']:>5} tokens x {r['batch']}: device KV {r['device_kv_bytes_default'] / mib:.1f}"
                   f" MiB default, {r['device_kv_bytes_offloaded'] / mib:.1f} MiB offloaded "
                   f"({r['device_kv_bytes_offloaded'] / r['device_kv_bytes_default']:.2f} of it, 2/L = "
                   f"{2 / r['layers']:.2f}); {r['tokens_per_s_default']} vs {r['tokens_per_s_offloaded']} tokens/s; "
                   f"per step {r['h2d_bytes_per_step'] / mib:.2f} MiB in, {r['d2h_bytes_per_step'] / 1024:.1f} KiB out "
                   f"(whole layers back: {r['d2h_bytes_per_step_whole_layers'] / mib:.2f} MiB); {r['misses']} misses")
    wins = [r["tokens"] for r in result["swap"] if r["swap_in_ms"] < r["recompute_ms"]]
    shown = ", ".join(f"{r['tokens']} tokens {r['swap_in_ms']} ms vs {r['recompute_ms']} ms" for r in result["swap"])
    out.append(f"offload swap-in vs recompute: {shown}; swap wins from "
               f"{min(wins) if wins else 'none of these'} tokens")
    return out


# -- a real model ---------------------------------------------------------------------------------
@torch.no_grad()
def _greedy(model, prompt: list[int], new_tokens: int, cache) -> tuple[list[int], float]:
    """Greedy tokens after ``prompt``: one prefill, then one-token steps, all through ``cache``."""
    device, out = model.device, []
    ids = torch.tensor([prompt], device=device)
    started = time.perf_counter()
    logits = model(ids, cache=cache)
    for n in range(new_tokens):
        out.append(int(logits[0, -1].argmax()))
        position = torch.tensor([[len(prompt) + n]], device=device)
        logits = model(torch.tensor([[out[-1]]], device=device), position, cache=cache)
    return out, time.perf_counter() - started


def bench_real(device, progress, new_tokens: int = 32,
               question: str = "Explain in a few sentences what a KV cache is.") -> dict:
    """SmolLM2 answering ``question`` through a plain cache and through the offloaded one."""
    loaded = models.load(models.SMOLLM2, device=device)
    model, c = loaded.model, loaded.model.config
    prompt = loaded.chat(question)
    plain, plain_s = _greedy(model, prompt, new_tokens, _Plain())
    per_token = 2 * c.num_key_value_heads * c.head_dim * torch.empty(0, dtype=model.dtype).element_size()
    cache = reference("14")["OffloadedKVCache"](c.num_hidden_layers, device=device)
    worst = _Worst(cache, lambda i: per_token * cache.seq_len(i))
    offloaded, offloaded_s = _greedy(model, prompt, new_tokens, worst)
    row = {"layers": c.num_hidden_layers, "prompt_tokens": len(prompt), "new_tokens": new_tokens,
           "same_tokens": offloaded == plain, "seconds_default": round(plain_s, 2),
           "seconds_offloaded": round(offloaded_s, 2),
           "device_kv_bytes_default": per_token * (len(prompt) + new_tokens - 1) * c.num_hidden_layers,
           "device_kv_bytes_offloaded": worst.worst, **cache.stats}
    progress.step("offload  SmolLM2", f"same tokens: {row['same_tokens']}, {row['seconds_offloaded']} s offloaded, "
                  f"{row['seconds_default']} s default")
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.bench.k14", description="SmolLM2 through the offloaded cache.")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch (1 is faster on a busy machine)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        r = bench_real(torch.device("cpu"), PrintProgress(), args.new_tokens)
    except (OSError, ValueError, ImportError) as exc:
        print(f"bench_k14: skipped: {exc}", file=sys.stderr)
        return 2
    share = r["device_kv_bytes_offloaded"] / r["device_kv_bytes_default"]
    print(f"SmolLM2, {r['layers']} layers, a {r['prompt_tokens']}-token prompt, {r['new_tokens']} greedy tokens: "
          f"same tokens as the plain cache: {r['same_tokens']}; device KV {r['device_kv_bytes_offloaded']:,} bytes at "
          f"most, against {r['device_kv_bytes_default']:,} held whole ({share:.3f}); "
          f"{r['h2d_bytes']:,} bytes in, {r['d2h_bytes']:,} out, "
          f"{r['misses']} misses; {r['seconds_default']} s default, {r['seconds_offloaded']} s offloaded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
