"""``kvkata bench``, serving part: continuous batching (kata 13's ``serve``) against static batches
of kata 08's ``generate`` on one workload of mixed prompt and output lengths with staggered arrivals.

Time is counted two ways. Wall seconds give tokens/s (new tokens a request asked for, per second
of the whole run). Steps — one model forward each — give time to first token and latency per
request, from its arrival: a static batch starts when its last member has arrived and the batch
before it is done, and returns all its rows together after ``max(max_new_tokens)`` forwards.
Serve's steps come from its scheduler, replayed without the model (the schedule does not depend
on the tokens when no EOS is set).
"""
from __future__ import annotations

import statistics
import time

import torch

from grader import manifest
from grader.nn import Llama, LlamaConfig
from grader.engine import targets
from grader.bench import noise as bench_noise

SERVING_CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)


def _workload(n: int, quick: bool) -> list[tuple]:
    """(req_id, prompt, max_new_tokens, arrival_step): lengths mixed, two arrivals per step."""
    g = torch.Generator().manual_seed(13)
    longest_prompt, longest_new = (40, 32) if quick else (96, 64)
    work = []
    for i in range(n):
        prompt = torch.randint(0, SERVING_CONFIG["vocab_size"], (int(torch.randint(4, longest_prompt, (1,), generator=g)),),
                               generator=g).tolist()
        work.append((i, prompt, int(torch.randint(2, longest_new, (1,), generator=g)), i // 2))
    return work


def _timeline(Scheduler, work, limits: dict) -> dict:
    """Steps of serve's schedule: first-token and last-token step of each request, blocks in use."""
    sched, made, held = Scheduler(*limits.values()), {}, {}
    first, last, used, preempted = {}, {}, [], 0
    arrivals, step, live = sorted(work, key=lambda r: r[3]), 0, 0
    bs = limits["block_size"]
    while arrivals or live:
        if not live:
            step = max(step, arrivals[0][3])
        while arrivals and arrivals[0][3] <= step:
            r, prompt, n, _ = arrivals.pop(0)
            sched.add_request(r, len(prompt), n)
            made[r], live = 0, live + 1
        s = sched.schedule()
        preempted += len(s.preempted)
        for r in s.preempted:
            held[r] = 0
        for r in s.prefill + s.decode:
            made[r] += 1
            first.setdefault(r, step + 1)  # its first token exists once this step's forward is done
            held[r] = -(-(len(work[r][1]) + made[r] - 1) // bs)
        used.append(sum(held.values()))
        for r in s.prefill + s.decode:
            if made[r] == work[r][2]:
                sched.finish(r)
                last[r], held[r], live = step + 1, 0, live - 1
        step += 1
    return {"first": first, "last": last, "used": used, "preempted": preempted}


def _static(generate, model, work, batch: int) -> tuple[float, dict, dict]:
    """Static batches of ``batch`` requests in arrival order; returns (seconds, first, last) in steps."""
    clock, first, last, seconds = 0, {}, {}, 0.0
    for i in range(0, len(work), batch):
        group = work[i:i + batch]
        start = max(clock, max(a for *_, a in group))
        n = max(m for _, _, m, _ in group)
        began = time.perf_counter()
        generate(model, [p for _, p, _, _ in group], n)
        seconds += time.perf_counter() - began
        for r, *_ in group:
            first[r], last[r] = start + 1, start + n  # rows come back together at the end
        clock = start + n
    return seconds, first, last


def _summary(name, timing: dict, work, first, last, extra=None) -> dict:
    """A row from the wall seconds of the repeats (bench_noise.figure) and the steps of each request."""
    tokens, seconds = sum(m for _, _, m, _ in work), timing["median"]
    ttft = [first[r] - a for r, _, _, a in work]
    latency = [last[r] - a for r, _, _, a in work]
    return {"impl": name, "requests": len(work), "tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 1), "mean_ttft_steps": round(statistics.mean(ttft), 1),
            "mean_latency_steps": round(statistics.mean(latency), 1), "max_latency_steps": max(latency),
            "spread": timing["spread"], "cpu_share": timing["cpu_share"], "noisy": timing["noisy"], **(extra or {})}


def steps() -> int:
    """Progress lines ``bench_serving`` prints: serve, then static batches."""
    return 2


def bench_serving(device: torch.device, progress, quick: bool, n_requests: int | None = None) -> list[dict]:
    """One row for serve, one for static batches; serve's row carries blocks in use over time."""

    ns = {k: targets.reference(manifest.get(k)).namespace for k in ("08", "13")}
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**SERVING_CONFIG)).to(device).eval()
    work = _workload(n_requests or (24 if quick else 64), quick)
    batch = 8
    longest = max(len(p) + m - 1 for _, p, m, _ in work)
    limits = {"num_blocks": 24 if quick else 64, "block_size": 16, "max_num_seqs": batch,
              "max_num_batched_tokens": max(256, longest)}
    ns["13"]["serve"](model, work[:2], **limits)  # warm-up: first allocations are not timed
    timing, _ = bench_noise.repeat(lambda: ns["13"]["serve"](model, work, **limits), bench_noise.MIN_REPEATS,
                                   on_cpu=device.type == "cpu")
    line = _timeline(ns["13"]["Scheduler"], work, limits)
    used = line["used"]
    rows = [_summary("serve", timing, work, line["first"], line["last"],
                     {"steps": len(used), "preemptions": line["preempted"], "num_blocks": limits["num_blocks"],
                      "peak_blocks": max(used), "mean_blocks": round(statistics.mean(used), 1),
                      "blocks_over_time": used})]
    progress.step("serving  continuous", f"{rows[-1]['tokens_per_s']:9.1f} tokens/s"
                  f"{bench_noise.mark(timing)}, ttft "
                  f"{rows[-1]['mean_ttft_steps']} steps, {line['preempted']} preemptions")
    ns["08"]["generate"](model, [p for _, p, _, _ in work[:2]], 2)
    cpu, wall = time.process_time(), time.perf_counter()
    runs = [_static(ns["08"]["generate"], model, work, batch) for _ in range(bench_noise.MIN_REPEATS)]
    wall = time.perf_counter() - wall
    share = (time.process_time() - cpu) / wall if device.type == "cpu" and bench_noise.measurable(wall) else None
    timing = bench_noise.figure([seconds for seconds, _, _ in runs], share)
    _, first, last = runs[-1]
    rows.append(_summary("static", timing, work, first, last))
    progress.step("serving  static batches", f"{rows[-1]['tokens_per_s']:9.1f} tokens/s"
                  f"{bench_noise.mark(timing)}, ttft {rows[-1]['mean_ttft_steps']} steps")
    return rows


def lines(rows: list[dict]) -> list[str]:
    """Human-readable lines of the serving rows."""
    out = []
    for r in rows:
        speed = "   NOISY tokens/s, not a result" if r.get("noisy") else f"{r['tokens_per_s']:8.1f} tokens/s"
        text = (f"serving {r['impl']:>6}: {speed}, mean time to first token "
                f"{r['mean_ttft_steps']} steps, mean latency {r['mean_latency_steps']} steps (max "
                f"{r['max_latency_steps']})")
        if "peak_blocks" in r:
            text += (f", {r['steps']} steps, {r['preemptions']} preemptions, blocks in use mean "
                     f"{r['mean_blocks']} peak {r['peak_blocks']} of {r['num_blocks']}")
        out.append(text)
    return out
