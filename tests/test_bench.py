"""A smoke test of ``kvkata bench``: tiny sizes, checks the output's shape and sanity, never timings."""
from __future__ import annotations

import json

import torch

from grader.bench import suite as bench


def test_bench_runs_small_and_reports_every_part(tmp_path, capsys):
    result = bench.run(quick=True, device=torch.device("cpu"), quiet=True, lengths=[32, 64], batches=[2],
                       steps=3, new_tokens=4, hf=False, speculative_tokens=6, serving_requests=4)
    assert {"machine", "append", "generate", "memory", "quantized", "prefix_cache", "beam", "speculative",
            "serving", "targets"} <= result.keys()
    assert result["machine"]["device"] == "cpu" and result["machine"]["torch"] == torch.__version__
    assert {(r["cache"], r["tokens"]) for r in result["append"]} == {
        (c, n) for c in ("concat", "preallocated", "paged-16", "paged-64") for n in (32, 64)}
    assert all(r["step_us"] > 0 and r["attend_us"] > 0 for r in result["append"])
    assert {r["impl"] for r in result["generate"]} == {"reference", "uncached"}
    assert all(r["tokens_per_s"] > 0 for r in result["generate"])
    memory = {r["cache"]: r for r in result["memory"]}
    assert memory["concat"]["held_bytes"] == memory["concat"]["formula_bytes"]
    assert memory["preallocated"]["held_bytes"] >= memory["preallocated"]["formula_bytes"]
    assert memory["paged-16"]["held_bytes"] >= memory["paged-16"]["formula_bytes"]
    quantized = [r for r in result["quantized"] if "ratio" in r]
    assert {(r["n_bits"], r["residual_len"], r["tokens"]) for r in quantized} == {
        (b, r, n) for b in (2, 4, 8) for r in (32, 128) for n in (32, 64)}
    assert all(r["quant_bytes"] < r["fp16_bytes"] for r in quantized if r["tokens"] >= r["residual_len"])
    errors = {(r["n_bits"], r["keys"]): r["attention_rel_error"] for r in result["quantized"] if "keys" in r}
    assert all(errors[b, "per channel"] < errors[b, "per token"] for b in (2, 4, 8))
    for row in result["prefix_cache"]:  # 16 requests, a 512-token prompt prefilled once: 15 x 512 reused
        assert row["computed_without"] - row["computed_with"] == 15 * 512
        assert 0 < row["hit_rate"] < 1
    assert [r["beams"] for r in result["beam"]] == [4, 8]
    assert all(0 < r["shared_blocks"] < r["dense_blocks"] for r in result["beam"])
    assert [(r["decoder"], r["draft"]) for r in result["speculative"]] == [
        ("plain", None), ("speculative", "close"), ("speculative", "perturbed"), ("speculative", "random")]
    assert all(r["same_tokens"] and r["tokens_per_s"] > 0 for r in result["speculative"])
    serving = {r["impl"]: r for r in result["serving"]}
    assert serving.keys() == {"serve", "static"}
    assert all(r["tokens"] == serving["serve"]["tokens"] and r["tokens_per_s"] > 0 for r in serving.values())
    assert serving["serve"]["peak_blocks"] <= serving["serve"]["num_blocks"]
    assert len(serving["serve"]["blocks_over_time"]) == serving["serve"]["steps"]
    json.dumps(result)  # serialisable as --json writes it


def test_uncached_loop_agrees_with_the_reference_loop():
    from grader.nn import Llama, LlamaConfig

    torch.manual_seed(0)
    model = Llama(LlamaConfig(**{**bench.GENERATE_CONFIG, "hidden_size": 32, "intermediate_size": 64,
                                 "num_hidden_layers": 2})).double().eval()
    prompts = [[5, 6, 7], [9], [1, 2, 3, 4, 5]]
    generate = bench.reference("08")["generate"]
    assert bench.uncached_generate(model, prompts, 5) == generate(model, prompts, 5)
