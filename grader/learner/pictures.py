"""The pictures of the kata notebooks, drawn with matplotlib from the reference solutions (never
from the learner's code). They work headless: Agg when there is no display, the inline backend
inside Jupyter."""
from __future__ import annotations

import functools
import os
import sys
import time
from types import SimpleNamespace

from grader import manifest
from grader.engine import targets


def _pyplot():
    """pyplot, on the Agg backend when there is no display (a kernel's inline backend is kept)."""
    import matplotlib

    no_display = sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    if no_display and not os.environ.get("MPLBACKEND") and "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class NoReference(Exception):
    """A picture's reference solution is not in this copy (a handout)."""


def _reference(kata_id: str) -> SimpleNamespace:
    kata = manifest.get(kata_id)
    if not (manifest.REPO_ROOT / kata.solution).is_file():
        raise NoReference(kata.solution)
    return SimpleNamespace(**targets.reference(kata).namespace)


def from_reference(plot):
    """A picture that needs the reference solutions says so in one line where they are missing."""
    @functools.wraps(plot)
    def drawn(*args, **kwargs):
        try:
            return plot(*args, **kwargs)
        except NoReference as missing:
            print(f"This picture is drawn with the reference solution ({missing}), which this copy does not "
                  "hold (a handout); the README's description of it stands in.")
            return None
    return drawn


@from_reference
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


@from_reference
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


@from_reference
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


def _beam_blocks(model, prompt: list[int], beams: int, new: int, block_size: int) -> list[int]:
    """Blocks in use at each forward of the reference beam search (the prefill first); the reference
    reserves a forward's slots before it calls the model, so each count includes them."""
    from grader.paged import PagedKVCache

    config = model.config
    cache = PagedKVCache(512, block_size, config.num_hidden_layers, config.num_key_value_heads, config.head_dim)
    used: list[int] = []
    hook = model.register_forward_pre_hook(lambda module, args: used.append(512 - cache.allocator.num_free))
    try:
        _reference("11").beam_search(model, prompt, beams, new, cache=cache)
    finally:
        hook.remove()
    return used


@from_reference
def plot_beam_blocks(prompt_len: int = 100, new: int = 20, block_size: int = 16, beams: int = 4):
    """Kata 11: blocks a beam search holds when the beams share the prompt, against a cache per beam."""
    import torch

    from grader.nn import Llama, LlamaConfig

    plt = _pyplot()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Llama(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2)).eval()
        prompt = torch.randint(0, 64, (prompt_len,)).tolist()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    used = _beam_blocks(model, prompt, beams, new, block_size)
    steps = range(len(used))
    dense = [1 * -(-prompt_len // block_size)] + [beams * -(-(prompt_len + s) // block_size) for s in steps[1:]]
    left.step(steps, dense, where="post", marker=".", label="a cache per beam")
    left.step(steps, used, where="post", marker=".", label="forks of one prefilled prompt")
    left.set(xlabel="forward (0 = the prefill)", ylabel="blocks in use", ylim=(0, None),
             title=f"{beams} beams, {prompt_len}-token prompt, blocks of {block_size}")
    left.legend(loc="center right", fontsize=8)
    left.grid(True, alpha=0.3)
    counts = list(range(1, 9))
    peaks = [max(_beam_blocks(model, prompt, k, new, block_size)) for k in counts]
    separate = [k * -(-(prompt_len + new - 1) // block_size) for k in counts]
    right.plot(counts, separate, marker=".", label="a cache per beam")
    right.plot(counts, peaks, marker=".", label="shared prompt blocks")
    right.set(xlabel="beams", ylabel="peak blocks in use", ylim=(0, None), title=f"after {new} new tokens")
    right.legend(loc="upper left", fontsize=8)
    right.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


@from_reference
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


@from_reference
def plot_quantized_cache(n_bits: int = 4, tokens: int = 32, channels: int = 16, outlier: int = 5):
    """Kata 09: key error per channel, per-channel vs per-token scales; bytes held against fp16."""
    import torch

    ref, plt = _reference("09"), _pyplot()
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(tokens, channels, generator=g, dtype=torch.float64)  # (R, D): one head, one group
    keys[:, outlier] = keys[:, outlier] * 4 + 50  # an outlier channel: large in every token
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.4
    for shift, (label, dim) in zip((-width / 2, width / 2), (("per channel (over tokens)", 0),
                                                              ("per token (over channels)", 1))):
        back = ref.dequantize(*ref.quantize(keys, n_bits, dim))
        error = (back - keys).abs().mean(0)  # (D,)
        left.bar([c + shift for c in range(channels)], error.tolist(), width, label=label)
    left.set_ylim(0, left.get_ylim()[1] * 1.3)  # room for the legend
    left.set(xlabel=f"channel (channel {outlier} is the outlier)", ylabel="mean |error|",
             title=f"{n_bits}-bit keys, {tokens} tokens × {channels} channels")
    left.legend(fontsize=8)

    L, H, D, R, e = 32, 8, 128, 32, 2  # a Llama-3-8B-like cache in fp16, one sequence
    lengths = [256 * i for i in range(1, 17)]
    right.plot(lengths, [2 * L * H * D * e * s / 2**20 for s in lengths], marker=".", label="fp16 (kata 04)")
    for bits in (8, 4, 2):
        cache = ref.QuantizedKVCache(n_bits=bits, residual_len=R)
        sizes, filled = [], 0
        for s in lengths:  # one layer measured, times L: every layer holds the same
            kv = torch.zeros(1, H, s - filled, D, dtype=torch.float16)
            cache.update(0, kv, kv)
            filled = s
            sizes.append(L * cache.nbytes() / 2**20)
        right.plot(lengths, sizes, marker=".", label=f"{bits} bits, residual {R}")
    right.set(xlabel="tokens cached", ylabel="MiB", ylim=(0, None),
              title=f"{L} layers, {H} KV heads of width {D}: bytes held")
    right.legend(fontsize=8)
    right.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


@from_reference
def plot_prefix_cache(block_size: int = 4, system: int = 8):
    """Kata 10: block tables of requests found in the prefix cache, and prefill tokens saved."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ref, plt = _reference("10"), _pyplot()
    from grader.checks.k10_programs import prefix_workload

    base = list(range(100, 100 + system))
    prompts = {"request 0": base + [1, 2, 3, 4, 5], "request 1": base + [6, 7, 8],
               "request 2 (= 0)": base + [1, 2, 3, 4, 5], "request 3 (0's first 12)": base + [1, 2, 3, 4]}
    cache = ref.PrefixCache(32, block_size)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1, 1.2]})
    width = max(-(-len(p) // block_size) for p in prompts.values())
    kinds = np.zeros((len(prompts), width))  # 0 none, 1 reused, 2 computed
    for row, (name, prompt) in enumerate(prompts.items()):
        reused = cache.allocate(row, prompt) // block_size
        for col, block in enumerate(cache.block_table(row)):
            kinds[row, col] = 1 if col < reused else 2
            left.text(col, row, str(block), ha="center", va="center", fontsize=11)
    left.imshow(kinds, cmap=ListedColormap(["white", "#f4b183", "#9dc3e6"]), vmin=0, vmax=2)
    left.set_xticks(range(width), [f"{c * block_size}–{c * block_size + block_size - 1}" for c in range(width)])
    left.set_yticks(range(len(prompts)), list(prompts))
    left.set(xlabel="logical block (token positions)", title=f"{system}-token system prompt, blocks of {block_size}")
    left.legend(handles=[Patch(color="#f4b183", label="reused (hit)"), Patch(color="#9dc3e6", label="computed")],
                loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, fontsize=8)

    prompts, size = prefix_workload(), 16
    cache = ref.PrefixCache(sum(-(-len(p) // size) for p in prompts), size)
    counts, without, with_cache = [0], [0], [0]
    for seq, prompt in enumerate(prompts):
        counts.append(seq + 1)
        without.append(without[-1] + len(prompt))
        with_cache.append(with_cache[-1] + len(prompt) - cache.allocate(seq, prompt))
    right.plot(counts, without, marker=".", label="no prefix cache")
    right.plot(counts, with_cache, marker=".", label="prefix cache")
    right.annotate(f"{1 - with_cache[-1] / without[-1]:.0%} fewer", (counts[-1], with_cache[-1]),
                   textcoords="offset points", xytext=(-4, 10), ha="right")
    right.set(xlabel="requests", ylabel="prompt tokens prefilled", ylim=(0, None),
              title=f"512-token shared prompt, 32–128 own tokens, blocks of {size}")
    right.legend(loc="upper left", fontsize=8)
    right.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


@from_reference
def plot_speculative(ks: tuple[int, ...] = (2, 4, 8), noises: tuple[float, ...] = (0.0, 0.03, 0.1, 0.3),
                     new_tokens: int = 24, seed: int = 3, draft_cost: float = 0.05):
    """Kata 12: tokens per target forward as the draft gets worse (measured), and the speedup formula."""
    import torch

    from grader.checks.support.common import randn, tiny_llama

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


@from_reference
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
