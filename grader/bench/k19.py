"""``python -m grader.bench.k19``: latent attention (kata 19), naive decode against absorbed decode.

One layer of kata 19's reference at DeepSeek-V3's head shapes (``kv_lora_rank`` 512, ``qk_rope_dim`` 64,
``qk_nope_dim`` 128, ``v_head_dim`` 128) with 16 heads instead of 128 (a CPU's worth), float32, one thread
unless told otherwise: a decode step after S cached tokens, naive (``kv_b_proj`` over every cached latent)
and absorbed, timed as the median of repeats; the FLOPs ``decode_flops`` counts for each; how far apart their
outputs are; and the bytes a token takes in the latent cache against the per-head keys and values it
replaces. Everything runs the reference solution.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from grader.bench.shared import reference

SHAPES = dict(kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128)


class Frozen:
    """A cache that returns what it holds plus the new token, keeping nothing: every timed step sees S tokens."""

    def __init__(self, latents: torch.Tensor, keys: torch.Tensor):
        self.latents, self.keys = latents, keys

    def update(self, layer, c_kv, k_pe):
        return torch.cat([self.latents, c_kv], 1), torch.cat([self.keys, k_pe], 1)


def _median_ms(step, repeats: int) -> float:
    step()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def bench_mla(lengths=(512, 2048), heads: int = 16, hidden: int = 2048, repeats: int = 5, device="cpu") -> list[dict]:
    """One row per cached length: ms per decode step naive and absorbed, their FLOPs, their outputs' distance."""
    mla = reference("19")
    torch.manual_seed(0)
    layer = mla["MLAttention"](hidden, heads, **SHAPES).to(device).eval()
    rows = []
    for S in lengths:
        x = torch.randn(1, S + 1, hidden, device=device)
        pos = torch.arange(S + 1, device=device)[None]
        held = mla["LatentKVCache"]()
        with torch.inference_mode():
            layer(x[:, :S], pos[:, :S], held, absorbed=False)
            cache = Frozen(*held.layers[0])
            step = {flag: (lambda flag=flag: layer(x[:, S:], pos[:, S:], cache, absorbed=flag)) for flag in (False, True)}
            outs = {flag: step[flag]() for flag in (False, True)}
            ms = {flag: _median_ms(step[flag], repeats) for flag in (False, True)}
        flops = {flag: mla["decode_flops"](S + 1, heads, *SHAPES.values(), absorbed=flag) for flag in (False, True)}
        weights = sum(p.numel() * p.element_size() for p in layer.parameters())
        rows.append({"S": S, "heads": heads, "naive_ms": ms[False], "absorbed_ms": ms[True], "weight_bytes": weights,
                     "naive_flops": flops[False], "absorbed_flops": flops[True],
                     "max_diff": float((outs[False] - outs[True]).abs().max())})
    return rows


def lines(rows: list[dict]) -> list[str]:
    out = [f"latent attention, one layer, {rows[0]['heads']} heads at DeepSeek-V3's head shapes, float32:"]
    for r in rows:
        out.append(f"  S = {r['S']:>5}: naive {r['naive_ms']:8.2f} ms ({r['naive_flops'] / 1e9:6.2f} GFLOP), absorbed "
                   f"{r['absorbed_ms']:6.2f} ms ({r['absorbed_flops'] / 1e9:5.3f} GFLOP): "
                   f"{r['naive_ms'] / r['absorbed_ms']:5.1f}x faster; outputs agree to {r['max_diff']:.1e}")
    out.append(f"  (each step reads the layer's {rows[0]['weight_bytes'] / 2**20:.0f} MiB of weights: absorbed decode is bound "
               "by that read, naive by up-projecting every cached latent)")
    mla, S = reference("19"), SHAPES
    latent = mla["mla_cache_bytes"](1, 1, S["kv_lora_rank"], S["qk_rope_dim"])
    per_head = 2 * 128 * (S["qk_nope_dim"] + S["qk_rope_dim"] + S["v_head_dim"])
    out.append(f"  a token in one layer, bf16: latent cache {latent:,} bytes; the 128 heads' keys and values it "
               f"replaces {per_head:,} bytes ({per_head / latent:.0f}x)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.bench.k19", description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048], help="cached tokens (default 512 2048)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("\n".join(lines(bench_mla(tuple(args.lengths), device=args.device))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
