"""A smoke test of ``kvkata bench``: tiny sizes, checks the output's shape and sanity, never timings."""
from __future__ import annotations

import json

import torch

from grader import bench


def test_bench_runs_small_and_reports_every_part(tmp_path, capsys):
    result = bench.run(quick=True, device=torch.device("cpu"), quiet=True, lengths=[32, 64], batches=[2],
                       steps=3, new_tokens=4, hf=False, serving_requests=4)
    assert {"machine", "append", "generate", "memory", "serving", "targets"} <= result.keys()
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
