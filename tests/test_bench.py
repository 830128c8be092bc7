"""A smoke test of ``kvkata bench``: tiny sizes, checks the output's shape and sanity, never timings."""
from __future__ import annotations

import json

import pytest
import torch

from grader import grade, kernels, paged
from grader.bench import suite as bench
from grader.bench.fast_paged import FastPagedKVCache
from grader.engine import targets


def test_bench_runs_small_and_reports_every_part(tmp_path, capsys, monkeypatch):
    made = []

    class Recording(bench.Progress):  # the progress total is known before the first line and never changes
        def __init__(self, total, quiet=False):
            super().__init__(total, quiet)
            self.first_total = total
            made.append(self)

    monkeypatch.setattr(bench, "Progress", Recording)
    result = bench.run(quick=True, device=torch.device("cpu"), quiet=True, lengths=[32, 64], batches=[2],
                       steps=3, new_tokens=4, hf=False, speculative_tokens=6, serving_requests=4)
    (progress,) = made
    assert progress.done == progress.total == progress.first_total
    assert {"machine", "append", "generate", "memory", "quantized", "prefix_cache", "beam", "speculative",
            "serving", "latent", "hybrid", "targets"} <= result.keys()
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
    offload = result["offload"]["contexts"]
    assert [r["tokens"] for r in offload] == [32, 64] and all(r["misses"] == 0 for r in offload)
    assert all(r["device_kv_bytes_offloaded"] * r["layers"] <= 2 * r["device_kv_bytes_default"] for r in offload)
    assert all(r["d2h_bytes_per_step"] < r["d2h_bytes_per_step_whole_layers"] for r in offload)
    assert [r["S"] for r in result["latent"]] == [32, 64]
    assert all(r["naive_flops"] > r["absorbed_flops"] and r["max_diff"] < 1e-3 for r in result["latent"])
    assert [r["model"] for r in result["hybrid"]] == list(bench.bench_k20.MODELS)
    assert all(r["hybrid"]["bytes"] == r["hybrid"]["formula"] and r["hybrid"]["seq_len"] == 64 + 4
               for r in result["hybrid"])  # (a linear layer's state outweighs 68 tokens: no ratio is promised here)
    json.dumps(result)  # serialisable as --json writes it


def test_uncached_loop_agrees_with_the_reference_loop():
    from grader.nn import Llama, LlamaConfig

    torch.manual_seed(0)
    model = Llama(LlamaConfig(**{**bench.GENERATE_CONFIG, "hidden_size": 32, "intermediate_size": 64,
                                 "num_hidden_layers": 2})).double().eval()
    prompts = [[5, 6, 7], [9], [1, 2, 3, 4, 5]]
    generate = bench.reference("08")["generate"]
    assert bench.uncached_generate(model, prompts, 5) == generate(model, prompts, 5)


# -- figures that are noise: synthetic timings, never timed here ---------------------------------
QUIET = [101.0, 99.0, 100.0, 104.0, 98.0, 102.0, 100.0, 97.0]  # repeats that agree to a few percent
BUSY = [26.0, 29.0, 163.0, 78086.0, 109924.0, 31.0, 24000.0, 52.0]  # a thread waiting for a busy core


def test_spread_is_the_interquartile_range_over_the_median():
    from grader.bench import noise as bench_noise

    assert bench_noise.spread([10, 10, 10, 10]) == 0
    assert abs(bench_noise.spread([1, 2, 3, 4, 5]) - (4 - 2) / 3) < 1e-12  # inclusive quartiles 2 and 4
    assert bench_noise.spread([5.0, 6.0]) is None  # too few repeats to tell


def test_repeats_that_disagree_are_flagged_and_agreeing_ones_are_not():
    from grader.bench import noise as bench_noise

    assert not bench_noise.noisy(QUIET) and not bench_noise.figure(QUIET)["noisy"]
    assert bench_noise.noisy(BUSY) and bench_noise.figure(BUSY)["spread"] > bench_noise.SPREAD_LIMIT
    assert bench_noise.noisy([5.0, 6.0])  # a figure of two runs cannot be trusted either
    assert "repeats spread" in bench_noise.mark(bench_noise.figure(BUSY))
    assert bench_noise.mark(bench_noise.figure(QUIET)) == ""


def test_a_process_that_waited_for_a_core_is_flagged_even_when_its_repeats_agree():
    from grader.bench import noise as bench_noise

    # every repeat equally slow: the process had a core a tenth of the time it measured
    timing = bench_noise.figure(QUIET, cpu_share=0.1)
    assert timing["noisy"] and "had a core 10% of the time" in bench_noise.mark(timing)
    assert not bench_noise.figure(QUIET, cpu_share=0.97)["noisy"]
    assert not bench_noise.figure(QUIET, cpu_share=1.9)["noisy"]  # two threads busy on two cores


def test_repeat_times_every_call_and_measures_the_cpu_share():
    from grader.bench import noise as bench_noise

    calls = []
    timing, last = bench_noise.repeat(lambda: calls.append(1) or len(calls), 5)
    assert calls == [1] * 5 and last == 5 and timing["cpu_share"] is not None and timing["median"] >= 0
    timing, _ = bench_noise.repeat(lambda: None, 3, on_cpu=False)
    assert timing["cpu_share"] is None


def _append_rows(concat: tuple[float, float], noisy: bool) -> list[dict]:
    rows = []
    for tokens, index in ((256, 0), (4096, 1)):
        rows += [{"cache": "concat", "tokens": tokens, "step_us": concat[index], "noisy": noisy},
                 {"cache": "preallocated", "tokens": tokens, "step_us": 6.0, "noisy": False},
                 {"cache": "paged-16", "tokens": tokens, "step_us": 7.0, "noisy": False}]
    return rows


def _generate_rows(noisy: bool) -> list[dict]:
    return [{"impl": "reference", "batch": 1, "tokens_per_s": 200.0, "noisy": noisy},
            {"impl": "uncached", "batch": 1, "tokens_per_s": 20.0, "noisy": False}]


def test_a_target_built_on_noise_is_not_judged():
    flat = {"append": _append_rows((22000.0, 22500.0), noisy=True), "generate": _generate_rows(noisy=True)}
    lines = bench.targets_met(flat)
    concat = next(line for line in lines if "concat step" in line)
    assert concat.startswith("NOISY") and "not judged" in concat, concat
    assert next(line for line in lines if "reference / uncached" in line).startswith("NOISY")
    assert next(line for line in lines if "preallocated step" in line).startswith("ok")
    assert bench.flagged(flat) == 3

    trusted = {"append": _append_rows((22000.0, 22500.0), noisy=False), "generate": _generate_rows(noisy=False)}
    lines = bench.targets_met(trusted)
    assert next(line for line in lines if "concat step" in line).startswith("MISS")  # a flat curve, measured cleanly
    assert next(line for line in lines if "reference / uncached" in line).startswith("ok")
    assert bench.flagged(trusted) == 0


def test_the_notes_say_what_miss_and_noisy_mean():
    from grader.bench import noise as bench_noise

    quiet = bench_noise.notes(0)
    assert len(quiet) == 1 and quiet[0].startswith("ok / MISS") and "not a fault in your code" in quiet[0]
    busy = bench_noise.notes(4, threads=2)
    assert "4 figure(s) flagged" in busy[1] and "busy" in busy[1] and "noise, not a result" in busy[1]
    assert "--threads 1" in busy[1] and "--threads 1" not in bench_noise.notes(4, threads=1)[1]


def test_speculative_and_serving_lines_flag_noisy_speeds():
    from grader.bench import k12 as bench_k12
    from grader.bench import k13 as bench_k13

    plain = {"decoder": "plain", "tokens_per_s": 100.0, "noisy": True}
    draft = {"decoder": "speculative", "draft": "close", "k": 4, "tokens_per_s": 250.0, "acceptance": 0.9,
             "target_forwards_per_token": 0.3, "noisy": False}
    assert "NOISY" in bench_k12.lines([plain, draft])[0]
    assert "2.50" in bench_k12.lines([{**plain, "noisy": False}, draft])[0]
    row = {"impl": "serve", "tokens_per_s": 300.0, "mean_ttft_steps": 2, "mean_latency_steps": 9,
           "max_latency_steps": 20, "noisy": True}
    assert "NOISY" in bench_k13.lines([row])[0] and "300.0" in bench_k13.lines([{**row, "noisy": False}])[0]


def test_a_busy_machine_gets_one_thread_unless_asked_otherwise():
    from grader.bench import noise as bench_noise

    assert bench_noise.threads(None, 0.3, 2) == (2, "")  # quiet: two threads
    threads, note = bench_noise.threads(None, 8.8, 2)
    assert threads == 1 and "busy" in note and "load average 8.8 on 2 cores" in note and "--threads 2" in note
    assert bench_noise.threads(3, 8.8, 2) == (3, "")  # asked for: as asked
    assert bench_noise.threads(None, None, 4) == (2, "")  # no load average on this system
    assert bench_noise.threads(None, 1.5, 2)[0] == 1 and bench_noise.threads(None, 1.5, 8)[0] == 2


# -- the benchmark's fast paged write agrees with kata 06's lesson -----------------------------------------
def test_fast_paged_cache_passes_kata_06s_checks():
    names = {"PagedKVCache": FastPagedKVCache, "BlockAllocator": paged.BlockAllocator,
             "OutOfBlocksError": paged.OutOfBlocksError}
    results = grade.grade("06", targets.from_namespace(names, label="the fast paged cache"), diagnose=False)
    failed = [f"{r.check.id}: {r.status}: {r.message}" for r in results if not r.passed]
    assert results and not failed, "\n".join(failed)


def _paged_program(cache, seed: int) -> list:
    """Prefill, forks and decode steps of one token (the fast path) with random data; what came back."""
    g = torch.Generator().manual_seed(seed)
    H, D, out, live = cache.n_kv_heads, cache.head_dim, [], [0]
    cache.add_sequence(0)
    slots = cache.reserve(0, 5)
    cache.write(0, slots, torch.randn(H, 5, D, generator=g), torch.randn(H, 5, D, generator=g))
    for step in range(40):
        seq = live[int(torch.randint(len(live), (1,), generator=g))]
        if step % 7 == 3:  # a fork shares a partly filled block: the next write copies it
            cache.fork(seq, step)
            live.append(step)
        slots = cache.reserve(seq, 1)
        for layer in range(cache.n_layers):
            cache.write(layer, slots, torch.randn(H, 1, D, generator=g), torch.randn(H, 1, D, generator=g))
        out.append(slots.tolist())
    return out + [cache.gather(s, layer) for s in live for layer in range(cache.n_layers)]


def _error(cache, *args) -> str:
    try:
        cache.write(*args)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_fast_paged_write_stores_what_the_lesson_stores_and_refuses_the_same():
    for seed in range(3):
        lesson, fast = paged.PagedKVCache(64, 4, 2, 2, 3), FastPagedKVCache(64, 4, 2, 2, 3)
        for ours, theirs in zip(_paged_program(fast, seed), _paged_program(lesson, seed)):
            assert ours == theirs if isinstance(ours, list) else all(torch.equal(a, b) for a, b in zip(ours, theirs))
        assert all(torch.equal(a, b) for a, b in zip(fast.k_pages + fast.v_pages, lesson.k_pages + lesson.v_pages))
    one, slot = torch.zeros(2, 1, 3), torch.tensor([1])
    for args in [(2, slot, one, one), (-1, slot, one, one), (0, torch.tensor([256]), one, one),
                 (0, torch.tensor([-1]), one, one), (0, slot, torch.zeros(2, 2, 3), one), (0, slot, one, None),
                 (0, torch.tensor([1.0]), one, one), (0, [1], one, one)]:
        assert _error(fast, *args) == _error(lesson, *args) != "no error", args


def test_cross_cache_section_agrees_with_recomputing_and_counts_both_parts():
    from grader.bench import k17 as bench_k17

    rows = bench_k17.bench_cross(torch.device("cpu"), bench.Progress(3, quiet=True), True, batch=1, new_tokens=3)
    assert [r["encoder_len"] for r in rows] == [64, 256, 1024]
    assert all(r["same_tokens"] and r["cached"]["tokens_per_s"] > 0 for r in rows)
    # 4 decoder layers, 8 KV heads of 32, float32: 2 x 4 x 8 x 32 x 4 bytes per position and row
    assert [(r["self_bytes"], r["cross_bytes"]) for r in rows] == [(8192 * 3, 8192 * n) for n in (64, 256, 1024)]
    assert "9,216,000 B" in bench_k17.lines(rows)[-1]


def test_the_roofline_places_prefill_right_of_decode_and_counts_with_kata_18(monkeypatch, tmp_path):
    from grader.bench import roofline

    monkeypatch.setattr(roofline, "MATMUL_SIZES", (32, 64))
    monkeypatch.setattr(roofline, "STREAM_BYTES", 2**20)
    monkeypatch.setattr(roofline, "DECODE_STEPS", 2)
    device = torch.device("cpu")
    machine = roofline.measure_machine(device, repeats=3)
    assert machine["peak_flops"] > 0 and machine["bandwidth"] > 0 and machine["threads"] >= 1
    assert sorted({m["n"] for m in machine["matmul"]}) == [32, 64] and machine["stream"]["bytes"] == 2 * 2**20
    onednn = "onednn" in kernels.supported([torch.zeros(1, 1)])  # the loop's products may run on it: in the roof
    assert [(m["n"], m["kernel"]) for m in machine["matmul"]] == \
        [(n, k) for n in (32, 64) for k in ("plain", "onednn") if k == "plain" or onednn]
    torch.manual_seed(0)
    model = roofline.Llama(roofline.LlamaConfig(**roofline.LOOP_CONFIG)).eval()
    kernels.tune(model, rows_list=(1, 2), repeats=1)
    config = roofline._config_dict(model.config, "float32")
    with torch.no_grad():
        points = roofline.place_loop(model, config, machine, device, repeats=3, prefills=(16, 128), batches=(1, 2))
    prefill = {p["label"]: p for p in points if p["kind"] == "prefill"}
    decode = [p for p in points if p["kind"] == "decode"]
    assert prefill["prefill 128"]["intensity"] > prefill["prefill 16"]["intensity"] > max(p["intensity"] for p in decode)
    # 2 FLOPs per weight and 4 bytes per weight: a float32 decode of one sequence sits near 0.5 FLOP/byte
    assert 0.4 < decode[0]["intensity"] < 0.6
    assert all(p["fraction"] > 0 and p["roof_flops_per_s"] <= machine["peak_flops"] for p in points)
    # the roof is the best streaming figure, read-only or copy; the matmuls alone are a part of the step
    assert machine["bandwidth"] == max(machine["stream"]["bytes_per_s"], machine["read"]["bytes_per_s"])
    for p in decode:
        assert 0 < p["matmul_share"] <= 1 and p["matmul_fraction"] >= p["fraction"] * 0.999
        assert p["plain_seconds"] > 0 and p["speedup"] == pytest.approx(p["plain_seconds"] / p["seconds"])
        fused = {f"{p['kernel']}, fused"} if p["fused"][0] else set()  # the products as the step runs them
        assert p["fused"][0] == 0 or p["kernel"] != "stored"  # the plain product reads every weight alone
        assert set(p["matmuls"]) == set(kernels.supported([model.lm_head.weight])) | fused  # each kernel, alone
        assert p["kernel"] in p["matmuls"]
        assert p["fused"][1] in (0, 2 * model.config.num_hidden_layers) and p["fused"][0] in (0, p["fused"][1])
    result = {"machine": machine, "model": "test", "config": config, "points": points}
    text = "\n".join(roofline.lines(result))
    assert "ridge" in text and "prefill 128" in text and "decode batch 2" in text
    assert "weight matmuls alone" in text and "all plain" in text and "the matmuls alone by kernel: stored" in text
    pytest.importorskip("matplotlib")
    roofline.plot(result, str(tmp_path / "roof.png"))
    assert (tmp_path / "roof.png").stat().st_size > 0


@pytest.mark.skipif("onednn" not in kernels.supported([torch.zeros(1, 1)]), reason="no oneDNN in this torch")
def test_a_batch_whose_kernel_is_plain_reads_no_stacked_product(monkeypatch):
    """The plain product at one row, oneDNN at two: the groups fuse in the prefill, yet batch 1 runs apart."""
    from grader.bench import roofline

    monkeypatch.setattr(roofline, "DECODE_STEPS", 2)
    torch.manual_seed(0)
    model = roofline.Llama(roofline.LlamaConfig(**roofline.LOOP_CONFIG)).eval()
    kernels.install(model, {1: "stored", 2: "onednn"}, [w for w, _ in kernels.projections(model)])
    machine = {"peak_flops": 1e9, "bandwidth": 1e9}
    config = roofline._config_dict(model.config, "float32")
    with torch.no_grad():
        one, two = roofline.place_loop(model, config, machine, torch.device("cpu"), repeats=1, prefills=(),
                                       batches=(1, 2))
    groups = 2 * model.config.num_hidden_layers
    assert (one["kernel"], one["fused"], "stored, fused" in one["matmuls"]) == ("stored", (0, groups), False)
    assert (two["kernel"], two["fused"], "onednn, fused" in two["matmuls"]) == ("onednn", (groups, groups), True)


def test_the_roofline_sets_transformers_generate_beside_the_loop_on_the_same_weights(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from grader.bench import roofline

    monkeypatch.setattr(roofline, "DECODE_STEPS", 2)
    torch.manual_seed(0)
    model = roofline.Llama(roofline.LlamaConfig(**roofline.LOOP_CONFIG)).eval()
    model.save_pretrained(tmp_path)
    device, config = torch.device("cpu"), roofline._config_dict(model.config, "float32")
    machine = {"peak_flops": 1e10, "bandwidth": 1e10}
    hf = roofline.transformers_model(tmp_path, device)
    points = roofline.place_transformers(hf, config, machine, device, repeats=3, batches=(2,))
    ours = roofline.place_loop(model, config, machine, device, repeats=3, prefills=(), batches=(2,))
    assert [p["kind"] for p in points] == ["transformers"] and points[0]["label"] == "transformers batch 2"
    # the same counts: the same forward, only the loop differs
    assert (points[0]["flops"], points[0]["bytes"]) == (ours[0]["flops"], ours[0]["bytes"]) and points[0]["seconds"] > 0
    prompts = roofline._decode_prompts(2, config["vocab_size"])
    ids = torch.tensor(prompts)
    theirs = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                         do_sample=False, pad_token_id=0, eos_token_id=None)[:, ids.shape[1]:].tolist()
    assert roofline.reference("08")["generate"](model, prompts, 4) == theirs  # the same weights, the same tokens
