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



def plot_schedule(num_blocks: int = 10, block_size: int = 4, max_num_seqs: int = 4, max_num_batched_tokens: int = 24):
    """Kata 13: who prefills, decodes, waits or is preempted at each step, and the blocks in use."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ref, plt = _reference("13"), _pyplot()
    # (prompt_len, max_new_tokens, arrival step): mixed lengths, staggered arrivals
    work = [(9, 8, 0), (6, 12, 0), (3, 4, 1), (12, 6, 2), (5, 10, 3), (4, 3, 5), (8, 5, 6), (2, 9, 8)]
    sched = ref.Scheduler(num_blocks, block_size, max_num_seqs, max_num_batched_tokens)
    made, held, rows, used = [0] * len(work), {}, [], []
    step, live = 0, set()
    while step < 200 and (live or any(a >= step for *_, a in work)):
        for r, (p, n, a) in enumerate(work):
            if a == step:
                sched.add_request(r, p, n)
                live.add(r)
        s = sched.schedule()
        state = [0 if r not in live or work[r][2] > step else 1 for r in range(len(work))]  # 1 waiting
        for r in s.preempted:
            state[r], held[r] = 4, 0
        for r in s.prefill + s.decode:
            made[r] += 1
            state[r] = 2 if r in s.prefill else 3
            held[r] = -(-(work[r][0] + made[r] - 1) // block_size)
        rows.append(state)
        used.append(sum(held.values()))
        for r in s.prefill + s.decode:
            if made[r] == work[r][1]:
                sched.finish(r)
                live.discard(r)
                held[r] = 0
        step += 1
    colours = ["white", "#d9d9d9", "#f4b183", "#9dc3e6", "#c00000"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.4), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]})
    top.imshow(np.array(rows).T, cmap=ListedColormap(colours), vmin=0, vmax=4, aspect="auto")
    top.set(ylabel="request", yticks=range(len(work)),
            yticklabels=[f"{r}: {p}+{n}" for r, (p, n, _) in enumerate(work)],
            title=f"{num_blocks} blocks of {block_size}, at most {max_num_seqs} running, "
                  f"{max_num_batched_tokens} tokens per step")
    top.legend(handles=[Patch(color=c, label=l) for c, l in zip(colours[1:], ("waiting", "prefill", "decode",
                                                                             "preempted"))],
               loc="lower left", fontsize=8, ncol=2)
    bottom.step(range(len(used)), used, where="mid")
    bottom.axhline(num_blocks, color="black", linestyle="--", linewidth=1)
    bottom.set(xlabel="step", ylabel="blocks in use", ylim=(0, num_blocks + 1))
    bottom.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig
