"""``kvkata bench``, disaggregation part: kata 16's reference workers in two gloo processes on the
loopback interface (``grader.checks.support.gloo``), on a Llama of 8 layers, width 512, 8 query heads
over 4 KV heads of width 64, float32, for prompts of 512 and 2,048 tokens (128 and 512 with ``quick``).

Printed: the bytes of K and V sent against kata 04's formula (plus the 72 bytes of header and first
token); gloo's loopback bandwidth; the time to first token split into the prefill forward, the
transfer left after it, and the decode worker's first step; whole-cache against layer-wise sending
and the share of the transfer hidden behind the forward; decode tokens/s on the decode worker
against one process doing both (each on one thread; the decode steps timed inside the worker, never
its wait for the prefill). ``python -m grader.bench.k16 [--quick]``.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from grader import manifest
from grader.checks.k16_peers import PlainCache, prefill_alone
from grader.checks.support.gloo import run_pair
from grader.engine import targets
from grader.nn import Llama, LlamaConfig

CONFIG = dict(vocab_size=512, hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8,
              num_key_value_heads=4, max_position_embeddings=4096)
NEW_TOKENS = 16


def steps() -> int:
    """Progress lines ``bench_disagg`` prints: one per prompt length."""
    return 2


def _bandwidth(mb: int = 64) -> float:
    """GB/s of one gloo send of ``mb`` MB on loopback, timed on the receiver after a handshake."""
    def sender():
        dist.send(torch.zeros(1), 1)
        dist.send(torch.zeros(mb * 2**18), 1)
        return None

    def receiver():
        dist.recv(torch.empty(1), 0)
        big, began = torch.empty(mb * 2**18), time.perf_counter()
        dist.recv(big, 0)
        return mb * 2**20 / (time.perf_counter() - began) / 1e9
    return run_pair(sender, receiver, deadline=120.0)[1].value


def _one(ns, model, prompt, layerwise: bool, new_tokens: int) -> dict:
    """One exchange: the prefill worker's forward alone and its whole call, the decode worker's time."""
    def prefill():
        prefill_alone(model, prompt[:8])  # warm-up
        times, forward = {}, model.forward

        def timed(*args, **kwargs):  # when the worker's forward starts and ends
            times["start"] = time.perf_counter()
            out = forward(*args, **kwargs)
            times["end"] = time.perf_counter()
            return out
        model.forward = timed
        dist.send(torch.zeros(1), 1)  # both sides start together
        stats = ns["prefill_worker"](model, prompt, layerwise=layerwise)
        done = time.perf_counter()
        return {**stats, "forward_s": times["end"] - times["start"], "after_forward_s": done - times["end"]}

    def decode():
        dist.recv(torch.empty(1), 0)
        calls, forward = [], model.forward

        def timed(*args, **kwargs):  # the decode steps alone, never the wait for the prefill
            began = time.perf_counter()
            out = forward(*args, **kwargs)
            calls.append(time.perf_counter() - began)
            return out
        model.forward = timed
        tokens = ns["decode_worker"](model, new_tokens)
        return {"first_step_s": calls[0] if calls else None, "step_s": sum(calls) / len(calls) if calls else None,
                "tokens": len(tokens)}
    a, b = run_pair(prefill, decode, deadline=300.0)
    if a.status != "ok" or b.status != "ok":
        raise RuntimeError(f"bench exchange failed: {a.status} {a.message} / {b.status} {b.message}")
    return {**a.value, **b.value}


def _one_process(model, prompt, new_tokens: int) -> float:
    """Seconds of one process's decode steps after its own prefill (kata 08's loop, plain cache), on one
    thread as each worker has."""
    cache, threads = PlainCache(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _steps_alone(model, prompt, new_tokens, cache)
    finally:
        torch.set_num_threads(threads)


def _steps_alone(model, prompt, new_tokens: int, cache) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), position_ids=torch.arange(len(prompt))[None], cache=cache)
        token, began = int(logits[0, -1].argmax()), time.perf_counter()
        for i in range(new_tokens - 1):
            logits = model(torch.tensor([[token]]), position_ids=torch.tensor([[len(prompt) + i]]), cache=cache)
            token = int(logits[0, -1].argmax())
    return time.perf_counter() - began


def bench_disagg(quick: bool = False, progress=None) -> dict:
    ns = targets.reference(manifest.get("16")).namespace
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**CONFIG)).eval()
    rows = []
    for P in ((128, 512) if quick else (512, 2048)):
        prompt = torch.randint(0, CONFIG["vocab_size"], (P,), generator=torch.Generator().manual_seed(P)).tolist()
        whole, layer = _one(ns, model, prompt, False, NEW_TOKENS), _one(ns, model, prompt, True, NEW_TOKENS)
        formula = 2 * CONFIG["num_hidden_layers"] * P * CONFIG["num_key_value_heads"] * 64 * 4
        exposed_whole, exposed_layer = whole["after_forward_s"], layer["after_forward_s"]
        step = whole["step_s"]
        alone = _one_process(model, prompt, NEW_TOKENS) / (NEW_TOKENS - 1)
        rows.append({"prompt": P, "kv_bytes": whole["kv_bytes"], "formula_bytes": formula, "framing_bytes": 8 * 8 + 8,
                     "prefill_forward_ms": round(whole["forward_s"] * 1e3, 1),
                     "transfer_after_forward_ms": round(exposed_whole * 1e3, 1),
                     "first_decode_step_ms": round(whole["first_step_s"] * 1e3, 1),
                     "layerwise_transfer_after_forward_ms": round(exposed_layer * 1e3, 1),
                     "hidden_share": round(1 - exposed_layer / exposed_whole, 2) if exposed_whole > 0 else None,
                     "decode_worker_tokens_per_s": round(1 / step, 1), "one_process_tokens_per_s": round(1 / alone, 1)})
        if progress is not None:
            progress.step(f"disagg prompt {P}", f"{rows[-1]['transfer_after_forward_ms']} ms transfer after forward")
    return {"bandwidth_gb_s": round(_bandwidth(16 if quick else 64), 2), "rows": rows}


def lines(result: dict) -> list[str]:
    out = [f"disaggregation (kata 16): gloo loopback {result['bandwidth_gb_s']} GB/s"]
    for r in result["rows"]:
        out.append(f"  prompt {r['prompt']:>5}: K+V {r['kv_bytes']:,} B (formula {r['formula_bytes']:,}, +{r['framing_bytes']} "
                   f"header/token); TTFT = prefill {r['prefill_forward_ms']} ms + transfer {r['transfer_after_forward_ms']} "
                   f"ms + first step {r['first_decode_step_ms']} ms; layer-wise transfer after forward "
                   f"{r['layerwise_transfer_after_forward_ms']} ms (hidden {r['hidden_share']}); decode "
                   f"{r['decode_worker_tokens_per_s']} tok/s on the worker vs {r['one_process_tokens_per_s']} in one process")
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args(argv)
    result = bench_disagg(args.quick)
    print("\n".join(lines(result)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
