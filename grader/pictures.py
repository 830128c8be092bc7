"""The pictures of the kata notebooks, drawn with matplotlib from the reference solutions (never
from the learner's code). They work headless: Agg when there is no display, the inline backend
inside Jupyter."""
from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace

from grader import manifest, targets


def _pyplot():
    """pyplot, on the Agg backend when there is no display (a kernel's inline backend is kept)."""
    import matplotlib

    no_display = sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    if no_display and not os.environ.get("MPLBACKEND") and "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _reference(kata_id: str) -> SimpleNamespace:
    return SimpleNamespace(**targets.reference(manifest.get(kata_id)).namespace)


def plot_memory(n_layers: int = 32, head_dim: int = 128, bytes_per_elem: int = 2, weight_bytes: int = 16 * 10**9):
    """Kata 04: KV-cache bytes against cached tokens for MHA, GQA and MQA, the weights as a line."""
    ref, plt = _reference("04"), _pyplot()
    tokens = [2**k for k in range(10, 22)]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, n_kv, below in (("MHA", 32, False), ("GQA", 8, True), ("MQA", 1, False)):
        sizes = [ref.kv_cache_bytes(n_layers, 1, t, n_kv, head_dim, bytes_per_elem) / 1e9 for t in tokens]
        (line,) = ax.loglog(tokens, sizes, marker=".", label=f"{name}: {n_kv} KV heads")
        cross = ref.crossover_tokens(weight_bytes, n_layers, n_kv, head_dim, bytes_per_elem)
        ax.plot([cross], [weight_bytes / 1e9], "o", color=line.get_color())
        ax.annotate(f"{cross:,} tokens", (cross, weight_bytes / 1e9), textcoords="offset points", fontsize=8,
                    xytext=(6, -14) if below else (-6, 8), ha="left" if below else "right", color=line.get_color())
    ax.axhline(weight_bytes / 1e9, color="black", linestyle="--", label=f"weights, {weight_bytes / 1e9:g} GB")
    ax.set(xlabel="cached tokens (batch × context length)", ylabel="KV cache (GB)",
           title=f"KV cache of {n_layers} layers, head width {head_dim}, {bytes_per_elem} bytes per number")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_append_time(max_len: int = 8192, points: int = 16, repeats: int = 7, heads: int = 4, head_dim: int = 64):
    """Kata 05: time of one append against cache length, concatenation vs a preallocated buffer."""
    import torch

    dynamic_ref, static_ref, plt = _reference("01"), _reference("05"), _pyplot()
    grown = torch.randn(1, heads, max_len, head_dim, generator=torch.Generator().manual_seed(0))
    caches = {"concatenation (kata 01)": dynamic_ref.DynamicKVCache(),
              "preallocated (kata 05)": static_ref.StaticKVCache(1, 1, max_len, heads, head_dim)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy machine, waking a second thread costs more than the copy
    try:
        lengths, times = _time_appends(caches, grown, max_len // points, repeats)
    finally:
        torch.set_num_threads(threads)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, values in times.items():
        ax.plot(lengths, values, marker=".", label=name)
    ax.set(xlabel="tokens already cached (S)", ylabel=f"one append (µs, fastest of {repeats})", ylim=(0, None),
           title=f"One append: batch 1, {heads} KV heads, head width {head_dim}, fp32, one CPU thread")
    ax.legend(loc="upper left")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def _time_appends(caches: dict, grown, step: int, repeats: int) -> tuple[list[int], dict[str, list[float]]]:
    """Grow every cache to each multiple of ``step``, timing ``repeats`` one-token appends there."""
    lengths, times, filled = [], {name: [] for name in caches}, 0
    for target in range(step, grown.shape[2] - repeats + 1, step):
        chunk = grown[:, :, filled:target]  # (1, H, target - filled, D)
        for cache in caches.values():
            cache.update(0, chunk, chunk)
        samples, filled = {name: [] for name in caches}, target
        for _ in range(repeats):
            one = grown[:, :, filled:filled + 1]  # (1, H, 1, D)
            for name, cache in caches.items():  # interleaved, so both see the same machine load
                started = time.perf_counter()
                cache.update(0, one, one)
                samples[name].append(time.perf_counter() - started)
            filled += 1
        lengths.append(target)
        for name in caches:
            times[name].append(min(samples[name]) * 1e6)  # the fastest: least disturbed by the machine
    return lengths, times


def _shared_prefix(ref, requests: int, prompt: int, new: int, block_size: int, num_blocks: int):
    """A paged cache where ``requests`` sequences share a ``prompt`` and each wrote ``new`` tokens."""
    cache = ref.PagedKVCache(num_blocks, block_size, 1, 1, 2)
    cache.add_sequence(0)
    cache.reserve(0, prompt)
    for seq in range(1, requests):
        cache.fork(0, seq)
    for seq in range(requests):
        cache.reserve(seq, new)
    return cache


def plot_block_table(requests: int = 4, prompt: int = 10, new: int = 5, block_size: int = 4):
    """Kata 06: block tables of requests sharing a prompt, and blocks saved by sharing."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ref, plt = _reference("06"), _pyplot()
    cache = _shared_prefix(ref, requests, prompt, new, block_size, num_blocks=64)
    tables = [cache.block_table(seq) for seq in range(requests)]
    width = max(len(t) for t in tables)
    kinds = np.zeros((requests, width))  # 0 none, 1 shared, 2 own
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [1, 1.2]})
    for row, table in enumerate(tables):
        for col, block in enumerate(table):
            kinds[row, col] = 1 if cache.allocator.refcount(block) > 1 else 2
            left.text(col, row, str(block), ha="center", va="center", fontsize=11)
    left.imshow(kinds, cmap=ListedColormap(["white", "#f4b183", "#9dc3e6"]), vmin=0, vmax=2)
    left.set_xticks(range(width), [f"{c * block_size}–{c * block_size + block_size - 1}" for c in range(width)])
    left.set_yticks(range(requests), [f"request {s}" for s in range(requests)])
    left.set(xlabel="logical block (token positions)", title="block tables: physical block ids")
    left.legend(handles=[Patch(color="#f4b183", label="shared (refcount > 1)"), Patch(color="#9dc3e6", label="own")],
                loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, fontsize=8)

    counts = list(range(1, 17))
    long_prompt, long_new, size = 200, 20, 16
    shared = [512 - _shared_prefix(ref, n, long_prompt, long_new, size, 512).allocator.num_free for n in counts]
    separate = [n * -(-(long_prompt + long_new) // size) for n in counts]
    right.plot(counts, separate, marker=".", label="a copy of the prompt per request")
    right.plot(counts, shared, marker=".", label="shared prompt, copy-on-write")
    saved = 1 - shared[-1] / separate[-1]
    right.annotate(f"{saved:.0%} fewer blocks", (counts[-1], shared[-1]), textcoords="offset points",
                   xytext=(-4, 10), ha="right")
    right.set(xlabel="requests sharing the prompt", ylabel="blocks in use", ylim=(0, None),
              title=f"{long_prompt}-token prompt, {long_new} new tokens each, blocks of {size}")
    right.legend(loc="upper left", fontsize=8)
    right.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def plot_sinks(seq_len: int = 24, n_sink: int = 2, window: int = 6):
    """Kata 07: which past tokens each new token attends to with sinks plus a sliding window."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ref, plt = _reference("07"), _pyplot()
    grid = np.zeros((seq_len, seq_len))  # 0 future, 1 evicted, 2 sink, 3 window
    for t in range(seq_len):
        grid[t, : t + 1] = 1
        for p in ref.kept_positions(t + 1, n_sink, window):
            grid[t, p] = 2 if p < n_sink else 3
    colours = ["white", "#d9d9d9", "#f4b183", "#9dc3e6"]
    fig, ax = plt.subplots(figsize=(6, 5.6))
    ax.imshow(grid, cmap=ListedColormap(colours), vmin=0, vmax=3)
    ax.set_xticks(np.arange(-0.5, seq_len), minor=True)
    ax.set_yticks(np.arange(-0.5, seq_len), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.8)
    ax.tick_params(which="minor", length=0)
    ax.set(xlabel="key: original token position", ylabel="query: step that adds token t",
           title=f"{n_sink} sinks + a window of {window}: cache never holds more than {n_sink + window}")
    ax.legend(handles=[Patch(color=c, label=l) for c, l in zip(colours[1:], ("evicted", "sink", "window"))],
              loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig



def plot_speculative(ks: tuple[int, ...] = (2, 4, 8), noises: tuple[float, ...] = (0.0, 0.03, 0.1, 0.3),
                     new_tokens: int = 24, seed: int = 3, draft_cost: float = 0.05):
    """Kata 12: tokens per target forward as the draft gets worse (measured), and the speedup formula."""
    import torch

    from grader.checks.common import randn, tiny_llama

    ref, plt = _reference("12"), _pyplot()
    target = tiny_llama(seed, "cpu", num_hidden_layers=3)
    prompt = torch.randint(0, target.config.vocab_size, (6,), generator=torch.Generator().manual_seed(seed)).tolist()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    alphas = [i / 100 for i in range(96)]
    for k in ks:
        measured = []
        for noise in noises:
            draft = tiny_llama(seed, "cpu", num_hidden_layers=3)
            with torch.no_grad():
                for i, p in enumerate(sorted(draft.parameters(), key=lambda p: p.numel())):
                    p.add_(randn(seed * 7 + i, *p.shape, scale=noise) * p.std())
            _, stats = ref.speculative_generate(target, draft, prompt, new_tokens, k)
            measured.append((new_tokens - 1) / (stats["target_forwards"] - 1))  # the first forward is the prefill
        (line,) = left.plot([max(n, 0.01) for n in noises], measured, "o-", label=f"k = {k}")
        left.axhline(k + 1, color=line.get_color(), linestyle=":", linewidth=1)
        right.plot(alphas, [(1 - a ** (k + 1)) / ((1 - a) * (k * draft_cost + 1)) for a in alphas], label=f"k = {k}")
    left.set(xscale="log", xlabel="noise added to the draft's weights (0 plotted at 0.01: identical)",
             ylabel="tokens per verification forward", ylim=(0, max(ks) + 1.5),
             title=f"measured, {new_tokens} tokens (dotted: k + 1)")
    right.axhline(1, color="black", linestyle="--", linewidth=1, label="plain decoding")
    right.set(xlabel="acceptance rate α of each proposal", ylabel="expected speedup",
              title=f"(1 - α^(k+1)) / ((1 - α)(k c + 1)), c = {draft_cost}")
    for ax in (left, right):
        ax.legend(loc="upper left" if ax is right else "upper right", fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig
