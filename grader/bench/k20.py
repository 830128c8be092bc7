"""Kata 20 on this machine: the layer patterns of four public models, one request streamed through a
``HybridKVCache`` (the reference's, the learner's file or a PATH), against the same layers all full.

For each model it prefills ``--tokens`` tokens, then decodes ``--steps`` tokens one at a time; every
attention layer attends over what its cache returned, masked by ``window_mask``. It prints the bytes the
cache holds (``nbytes()``, measured on the tensors), what ``hybrid_cache_bytes`` says, what an all-full
cache holds, and the median time of one decode step through the attention layers, hybrid against full.
Keys and values are random float32 tensors (a bf16 cache holds half their bytes) at the models' real
KV heads and widths, batch 1 (the weights
and the rest of each layer are left out: this is the cache and attention alone; a linear layer's state,
whose size never depends on how many tokens built it, takes one token per forward).

    python -m grader.bench.k20 [--tokens 4096] [--steps 8] [--cache stub] [--models gemma3-27b,gpt-oss]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from grader import manifest
from grader.engine import targets

S, F_, C, L = "sliding_attention", "full_attention", "chunked_attention", "linear_attention"
MODELS = {  # name: (layer types, window, KV heads, head width, linear heads, linear width)
    "gemma3-27b": (([S] * 5 + [F_]) * 10 + [S] * 2, 1024, 16, 128, 0, 0),
    "gpt-oss-120b": ([S, F_] * 18, 128, 8, 64, 0, 0),
    "llama4-text": (([C] * 3 + [F_]) * 12, 8192, 8, 128, 0, 0),
    "qwen3-next-80b": (([L] * 3 + [F_]) * 12, 1, 2, 256, 32, 128),
}
GIB = 2**30
DTYPE = torch.float32  # bf16 matrix products are slow on many CPUs; the bytes scale by 2 from here


def _attend(api, kind, K, V, k_pos, q_pos, window):
    q = K[:, :, -1:]  # (B, H, 1, D): a query of the right size; its values do not matter here
    mask = api.window_mask(kind, q_pos, k_pos, window)  # (1, S)
    return F.scaled_dot_product_attention(q, K, V, attn_mask=mask)


def _step(api, cache, types, window, T, heads, dim, lin, seen):
    """One forward of T tokens through every layer: write, then attend (linear layers: a state step)."""
    kv = torch.randn(1, heads, T, dim, dtype=DTYPE)
    q_pos = torch.arange(seen, seen + T)
    for layer, kind in enumerate(types):
        if kind == L:  # a state's size never depends on the tokens that built it: the prefill writes one
            heads_l, width = lin
            x = torch.randn(1, heads_l, 1, width, dtype=torch.float32)
            cache.state(layer).step(x, x, x, torch.full((1, heads_l, 1), 0.9))
        elif T == 1:  # the prefill only fills the cache; decode steps attend
            K, V, k_pos = cache.update(layer, kv, kv)
            _attend(api, kind, K, V, k_pos, q_pos, window)
        else:
            cache.update(layer, kv, kv)


def run(api, name: str, tokens: int, steps: int, full: bool) -> dict:
    types, window, heads, dim, lin_heads, lin_dim = MODELS[name]
    if full:
        types = [F_] * len(types)
    torch.manual_seed(0)
    cache = api.HybridKVCache(types, window=max(window, 1))
    _step(api, cache, types, window, tokens, heads, dim, (lin_heads, lin_dim), 0)
    times = []
    for i in range(steps):
        start = time.perf_counter()
        _step(api, cache, types, window, 1, heads, dim, (lin_heads, lin_dim), tokens + i)
        times.append(time.perf_counter() - start)
    state = 4 * lin_heads * lin_dim * lin_dim
    formula = api.hybrid_cache_bytes(types, tokens + steps, n_kv_heads=heads, head_dim=dim, window=max(window, 1),
                                     state_bytes=state, dtype_bytes=DTYPE.itemsize)
    return {"bytes": cache.nbytes(), "formula": formula, "step_ms": 1000 * statistics.median(times),
            "seq_len": cache.seq_len()}


def bench_hybrid(tokens: int, steps: int, names=tuple(MODELS), cache: str = "solution", progress=None) -> list[dict]:
    """One row per model: the hybrid cache against the same layers all full, after ``tokens`` and ``steps`` more."""
    api = _namespace(targets.resolve(manifest.get("20"), cache))
    rows = []
    for name in names:
        hybrid, full = run(api, name, tokens, steps, full=False), run(api, name, tokens, steps, full=True)
        rows.append({"model": name, "tokens": tokens, "steps": steps, "hybrid": hybrid, "full": full})
        if progress:
            progress.step(f"hybrid cache {name}", f"{full['bytes'] / max(hybrid['bytes'], 1):.1f}x fewer bytes")
    return rows


def lines(rows: list[dict]) -> list[str]:
    """A line per model: bytes held, the formula, all full, the ratio, a decode step's time hybrid and full."""
    out = [f"{'model':<16}{'held (GiB)':>12}{'formula':>10}{'all full':>10}{'ratio':>7}{'step ms':>9}{'full ms':>9}"]
    for r in rows:
        hybrid, full = r["hybrid"], r["full"]
        out.append(f"{r['model']:<16}{hybrid['bytes'] / GIB:>12.3f}{hybrid['formula'] / GIB:>10.3f}"
                   f"{full['bytes'] / GIB:>10.3f}{full['bytes'] / max(hybrid['bytes'], 1):>6.1f}x"
                   f"{hybrid['step_ms']:>9.1f}{full['step_ms']:>9.1f}")
        if hybrid["bytes"] != hybrid["formula"] or hybrid["seq_len"] != r["tokens"] + r["steps"]:
            out.append(f"  warning: nbytes() {hybrid['bytes']:,} vs formula {hybrid['formula']:,}, seq_len() "
                       f"{hybrid['seq_len']} vs {r['tokens'] + r['steps']} tokens seen")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.bench.k20", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096, help="prefill length (default 4096)")
    p.add_argument("--steps", type=int, default=8, help="decode steps timed (default 8)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--cache", default="solution",
                   help="whose HybridKVCache: solution (default), stub (katas/20) or a PATH")
    args = p.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown or args.tokens < 1 or args.steps < 1:
        p.error(f"models: unknown {unknown}" if unknown else "--tokens and --steps must be at least 1")
    try:
        print(f"kata 20 bench: {args.tokens} tokens prefilled, {args.steps} decode steps, float32 K/V, batch 1, "
              f"{torch.get_num_threads()} threads, cache = {args.cache}")
        print("\n".join(lines(bench_hybrid(args.tokens, args.steps, names, args.cache))))
    except (OSError, ValueError, ImportError, targets.TargetLoadError, NotImplementedError) as exc:
        print(f"kata 20 bench: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


class _namespace:
    """The target's names as attributes."""

    def __init__(self, target):
        self.__dict__.update(target.namespace)


if __name__ == "__main__":
    sys.exit(main())
