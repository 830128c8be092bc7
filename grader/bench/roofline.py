"""``kvkata bench --roofline``: this machine's roofline, with kata 08's reference loop placed on it.

1. ``measure_machine`` — matrix-multiply FLOP/s at a few square shapes (the best median is the
   compute roof) and streaming bandwidth from large tensor copies (the memory roof), each the
   median of repeats with its spread, flagged NOISY as the rest of the bench flags figures
   (grader.bench.noise);
2. ``place_loop`` — kata 08's reference ``generate`` on a Llama of ``grader.nn`` (SmolLM2 with
   ``--real-model``): a prefill alone at 16 … 1,024 prompt tokens, and decode steps at batch 1 … 32,
   each counted with kata 18's reference (FLOPs and bytes of the forward) and shown as achieved
   FLOP/s and bytes/s against the roof, and as a fraction of it. Each decode step is timed with the
   model's products as ``grader.kernels`` chose them and with every product plain, alternating, and
   set beside its weight matmuls alone (every projection of the model on the step's one token a row,
   in order) under each kernel, and as the step runs them (q/k/v and gate/up each one stacked product,
   ``grader.kernels.stacked``): the share of the step they take, and the fraction of the roof a step
   reaches if it took only that long, the ceiling of any loop over these products;
3. with ``--real-model`` and transformers installed, Hugging Face ``generate()`` on the same weights
   at the same decode batches, timed alternately with the reference loop, on the same roof.

Measured, shown, never graded: the fractions move with the machine's load. Everything runs the
reference solutions.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.nn.functional as F

from grader import kernels, models
from grader.bench import noise as bench_noise
from grader.bench.shared import GENERATE_CONFIG, reference
from grader.learner import pictures_models
from grader.nn import Llama, LlamaConfig

MATMUL_SIZES = (256, 1024, 2048)
STREAM_BYTES = 256 * 2**20  # large enough to leave every cache level
PREFILLS = (16, 64, 256, 1024)
DECODE_BATCHES = (1, 8, 32)
DECODE_PROMPT, DECODE_STEPS = 64, 16
LOOP_CONFIG = {**GENERATE_CONFIG, "max_position_embeddings": 2048}


def _sync(device: torch.device):
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None


def measure_machine(device: torch.device | None = None, repeats: int = 5, dtype=torch.float32) -> dict:
    """This machine's peaks: the best matmul FLOP/s over ``MATMUL_SIZES``, with torch's own product and, where
    ``grader.kernels`` may choose it, oneDNN's on packed weights (the loop's products run on it, so a roof
    without it would sit below what the loop reaches), and the copy bandwidth (a copy reads and writes each
    byte, so it counts twice), with the thread count; ``device`` defaults to the CPU."""
    device = torch.device("cpu") if device is None else device
    sync, on_cpu = _sync(device), device.type == "cpu"
    matmuls = []
    for n in MATMUL_SIZES:
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        products = {"plain": lambda: a @ b}
        if "onednn" in kernels.supported([b]):  # what grader.kernels may pick for the model's products
            packed = kernels.copies_for([b], ["onednn"])["onednn"][0]
            products["onednn"] = lambda: kernels.linear_with(a, packed, "onednn")
        for kernel, product in products.items():
            product()  # warm-up: first calls pick kernels and allocate
            timing, _ = bench_noise.repeat(product, repeats, sync, on_cpu)
            matmuls.append({"n": n, "kernel": kernel, "flops_per_s": 2 * n**3 / timing["median"], **timing})
    src = torch.empty(STREAM_BYTES // dtype.itemsize, device=device, dtype=dtype).uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    timing, _ = bench_noise.repeat(lambda: dst.copy_(src), repeats, sync, on_cpu)
    stream = {"bytes": 2 * STREAM_BYTES, "bytes_per_s": 2 * STREAM_BYTES / timing["median"], **timing}  # read + write
    src.sum()
    timing, _ = bench_noise.repeat(lambda: src.sum(), repeats, sync, on_cpu)  # reads only, as a weight read does
    read = {"bytes": STREAM_BYTES, "bytes_per_s": STREAM_BYTES / timing["median"], **timing}
    trusted = [m for m in matmuls if not m["noisy"]] or matmuls
    return {"device": str(device), "threads": torch.get_num_threads(), "dtype": str(dtype).removeprefix("torch."),
            "matmul": matmuls, "stream": stream, "read": read, "peak_flops": max(m["flops_per_s"] for m in trusted),
            "bandwidth": max(stream["bytes_per_s"], read["bytes_per_s"]),  # the roof is the best the machine does
            "noisy": any(m["noisy"] for m in matmuls) or stream["noisy"] or read["noisy"]}


def _config_dict(config: LlamaConfig, dtype: str) -> dict:
    fields = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
              "vocab_size", "head_dim")
    return {**{f: getattr(config, f) for f in fields}, "torch_dtype": dtype}


def _point(kind: str, label: str, flops: int, moved: int, seconds: float, timing: dict, machine: dict) -> dict:
    """A measured pass on the roofline: achieved rates, the roof at its intensity, the fraction of it."""
    intensity = flops / moved
    roof = min(machine["peak_flops"], intensity * machine["bandwidth"])
    achieved = flops / seconds
    return {"kind": kind, "label": label, "flops": flops, "bytes": moved, "intensity": intensity,
            "seconds": seconds, "flops_per_s": achieved, "bytes_per_s": moved / seconds, "roof_flops_per_s": roof,
            "fraction": achieved / roof, "bound": "compute" if intensity >= machine["peak_flops"] / machine["bandwidth"]
            else "bandwidth", "spread": timing["spread"], "noisy": timing["noisy"]}


def _decode_prompts(batch: int, vocab: int) -> list[list[int]]:
    return [[(5 * i + b) % vocab for i in range(DECODE_PROMPT)] for b in range(batch)]


def _step_times(run, model, repeats: int, sync, warm: bool = True) -> tuple[list[float], float, float]:
    """A decode step's seconds in each of ``repeats`` runs of 1 + S new tokens, from the end of the prefill's
    forward to the end of the last forward, over the S steps between (the loop's own work included), with the
    wall and CPU seconds the runs took. Never one run minus another: at large batches the prefill dwarfs the
    steps, and its noise would swamp them."""
    ends = []

    def mark(*_):
        if sync:
            sync()
        ends.append(time.perf_counter())
    handle = model.register_forward_hook(mark)
    try:
        if warm:
            run(1 + DECODE_STEPS)
        times, wall, cpu = [], time.perf_counter(), time.process_time()
        for _ in range(repeats):
            ends.clear()
            run(1 + DECODE_STEPS)
            times.append((ends[-1] - ends[0]) / (len(ends) - 1))
        return times, time.perf_counter() - wall, time.process_time() - cpu
    finally:
        handle.remove()


def _timing(times: list[float], wall: float, cpu: float, on_cpu: bool) -> dict:
    return bench_noise.figure(times, cpu / wall if on_cpu and bench_noise.measurable(wall) else None)


def _step_seconds(run, model, repeats: int, sync, on_cpu: bool) -> tuple[float, dict]:
    """A decode step's seconds (``_step_times``' median) and its figure."""
    timing = _timing(*_step_times(run, model, repeats, sync), on_cpu)
    return timing["median"], timing


def _steps_side_by_side(run, model, repeats: int, sync, on_cpu: bool) -> tuple[dict, dict]:
    """A decode step's figure with the model's products as ``grader.kernels`` chose them, and with every
    product plain, the two alternating run by run."""
    tuned, plain, walls, cpus = [], [], [0.0, 0.0], [0.0, 0.0]
    for r in range(repeats):
        for i, (out, context) in enumerate(((tuned, contextlib.nullcontext()), (plain, kernels.plain(model)))):
            with context:
                times, wall, cpu = _step_times(run, model, 1, sync, warm=r == 0)
            out += times
            walls[i], cpus[i] = walls[i] + wall, cpus[i] + cpu
    return _timing(tuned, walls[0], cpus[0], on_cpu), _timing(plain, walls[1], cpus[1], on_cpu)


def _decode_point(label: str, config: dict, batch: int, seconds: float, timing: dict, machine: dict,
                  kind: str = "decode") -> dict:
    """A decode step at the steps' mean context, counted by kata 18's reference."""
    k18, past = reference("18"), DECODE_PROMPT + DECODE_STEPS // 2
    return _point(kind, label, k18["forward_flops"](config, batch, 1, past),
                  k18["forward_bytes"](config, batch, 1, past), seconds, timing, machine)


def place_loop(model, config: dict, machine: dict, device: torch.device, repeats: int = 3,
               prefills=PREFILLS, batches=DECODE_BATCHES) -> list[dict]:
    """Kata 08's loop at each prefill length and decode batch, counted by kata 18's reference."""
    generate, k18 = reference("08")["generate"], reference("18")
    sync, on_cpu, vocab = _sync(device), device.type == "cpu", config["vocab_size"]
    points = []
    for P in prefills:  # max_new_tokens=1: one forward over the prompt, no decode step
        prompts = [[(7 * i + 3) % vocab for i in range(P)]]
        generate(model, prompts, 1)
        timing, _ = bench_noise.repeat(lambda: generate(model, prompts, 1), repeats, sync, on_cpu)
        points.append(_point("prefill", f"prefill {P}", k18["forward_flops"](config, 1, P, 0),
                             k18["forward_bytes"](config, 1, P, 0), timing["median"], timing, machine))
    pairs = kernels.projections(model)
    weights = [w for w, _ in pairs]
    copies = kernels.copies_for(weights, kernels.supported(weights)) if batches else {}
    for B in batches:
        prompts = _decode_prompts(B, vocab)
        timing, plain = _steps_side_by_side(lambda n: generate(model, prompts, n), model, repeats, sync, on_cpu)
        point = _decode_point(f"decode batch {B}", config, B, timing["median"], timing, machine)
        chosen = kernels.chosen(weights[0]) if weights else None
        kernel, (fused, groups) = chosen[kernels.nearest(B, chosen)] if chosen else "stored", kernels.fused(model)
        point.update(kernel=kernel, plain_seconds=plain["median"], plain_noisy=plain["noisy"],
                     plain_fraction=point["fraction"] * timing["median"] / plain["median"],
                     speedup=plain["median"] / timing["median"], fused=(fused if kernel != "stored" else 0, groups))
        if weights and device.type == "cpu":
            alone = kernels.measure(pairs, (B,), tuple(copies), repeats, copies)["seconds"][B]
            if point["fused"][0]:  # the step's products as it runs them
                fused = kernels.measure(kernels.stacked(model), (B,), ("stored", point["kernel"]), repeats)
                alone[f"{point['kernel']}, fused"] = fused["seconds"][B][point["kernel"]]
        else:  # the plain product only (another device: grader.kernels changes nothing there)
            inputs = {w.shape[1]: torch.randn(B, w.shape[1], device=device, dtype=w.dtype) for w in weights}
            alone = {"stored": bench_noise.repeat(lambda: [F.linear(inputs[w.shape[1]], w) for w in weights],
                                                  repeats, sync, on_cpu)[0]["median"]}
        point["matmuls"] = {k: {"seconds": t, "fraction": point["fraction"] * timing["median"] / t}
                            for k, t in alone.items()}
        own = alone.get(f"{point['kernel']}, fused", alone.get(point["kernel"], alone["stored"]))
        share = min(own / timing["median"], 1.0)  # (a noisy step can come out shorter than its matmuls)
        point.update(matmul_seconds=own, matmul_share=share, matmul_fraction=point["fraction"] / share)
        points.append(point)
    return points


def transformers_model(folder, device: torch.device):
    """Hugging Face's Llama on the checkpoint in ``folder``, or None without transformers."""
    try:
        import transformers  # optional: only the side-by-side of --real-model needs it
    except ImportError:
        return None
    return transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()


def place_transformers(hf, config: dict, machine: dict, device: torch.device, repeats: int = 3,
                       batches=DECODE_BATCHES) -> list[dict]:
    """Hugging Face ``generate()`` (``hf``, from ``transformers_model``) at the same decode batches,
    greedy, on the same prompts and the same roof."""
    sync, on_cpu, points = _sync(device), device.type == "cpu", []
    for B in batches:
        ids = torch.tensor(_decode_prompts(B, config["vocab_size"]), device=device)

        def run(n):
            return hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                               min_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)
        step, timing = _step_seconds(run, hf, repeats, sync, on_cpu)
        points.append(_decode_point(f"transformers batch {B}", config, B, step, timing, machine, "transformers"))
    return points


def _model(device: torch.device, real_model: bool):
    if real_model:
        loaded = models.load(models.SMOLLM2, device=device)
        return loaded.model.eval(), "SmolLM2-135M", loaded.folder
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**LOOP_CONFIG)).to(device).eval()
    kernels.tune(model)  # as a loaded model is (grader.models.load): the bench sets both side by side
    return model, "the grader.nn Llama (4 layers, width 256)", None


def run(device: torch.device, real_model: bool = False, quick: bool = False, progress=None) -> dict:
    """The machine's roof and the measured points; with ``real_model``, SmolLM2, and transformers'
    ``generate()`` beside the reference loop batch by batch when transformers is installed.
    ``progress.step(label, text)`` hears of each figure as it is measured (minutes on SmolLM2)."""
    started = time.perf_counter()
    say = progress.step if progress is not None else (lambda label, text: None)
    machine = measure_machine(device, repeats=3 if quick else 5)
    say("roof", f"{_si(machine['peak_flops'], 'FLOP/s')}, {_si(machine['bandwidth'], 'B/s')}")
    model, name, folder = _model(device, real_model)
    config = _config_dict(model.config, "float32")
    hf = transformers_model(folder, device) if folder is not None else None
    points = []
    with torch.no_grad():
        for P in PREFILLS[:3] if quick else PREFILLS:
            points += place_loop(model, config, machine, device, prefills=(P,), batches=())
            say(points[-1]["label"], f"{points[-1]['fraction']:.1%} of the roof")
        for B in DECODE_BATCHES:  # batch by batch, the two loops one after the other
            points += place_loop(model, config, machine, device, prefills=(), batches=(B,))
            if hf is not None:
                points += place_transformers(hf, config, machine, device, batches=(B,))
            for p in points[-2 if hf is not None else -1:]:
                say(p["label"], f"{p['fraction']:.1%} of the roof")
    return {"machine": machine, "model": name, "config": config, "points": points,
            "seconds": time.perf_counter() - started}


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.2f} {unit}"


def lines(result: dict) -> list[str]:
    """What ``kvkata bench --roofline`` prints: the peaks, then one line a measured point."""
    m = result["machine"]
    out = [f"roofline of this machine ({m['device']}, {m['threads']} thread(s), {m['dtype']}):"]
    for mm in m["matmul"]:
        out.append(f"  matmul {mm['n']}^3 ({mm.get('kernel', 'plain')}): {_si(mm['flops_per_s'], 'FLOP/s')}"
                   f"{bench_noise.mark(mm)}")
    out.append(f"  stream copy of {m['stream']['bytes'] // 2**20} MiB moved: {_si(m['stream']['bytes_per_s'], 'B/s')}"
               f"{bench_noise.mark(m['stream'])}")
    if "read" in m:
        out.append(f"  stream read of {m['read']['bytes'] // 2**20} MiB: {_si(m['read']['bytes_per_s'], 'B/s')}"
                   f"{bench_noise.mark(m['read'])}")
    ridge = m["peak_flops"] / m["bandwidth"]
    out.append(f"  peak {_si(m['peak_flops'], 'FLOP/s')}, bandwidth {_si(m['bandwidth'], 'B/s')}: "
               f"ridge {ridge:.1f} FLOP/byte")
    out.append(f"kata 08's reference loop on {result['model']}, counted by kata 18's reference"
               + (" (transformers' generate() beside it):" if any(p["kind"] == "transformers" for p in
                                                                 result["points"]) else ":"))
    for p in result["points"]:
        noisy = " [NOISY]" if p["noisy"] else ""
        out.append(f"  {p['label']:>16}: intensity {p['intensity']:8.1f} FLOP/B ({p['bound']}-bound), "
                   f"{_si(p['flops_per_s'], 'FLOP/s')}, {_si(p['bytes_per_s'], 'B/s')}, "
                   f"{p['fraction']:.1%} of the roof{noisy}")
        if "plain_seconds" in p:
            groups = p.get("fused", (0, 0))
            fused = f", {groups[0]} of {groups[1]} sibling groups as one product" if groups[1] else ""
            out.append(f"{'':>18}products by grader.kernels ({p['kernel']}{fused}): "
                       f"{p['seconds'] * 1e3:.1f} ms a step; "
                       f"all plain: {p['plain_seconds'] * 1e3:.1f} ms, {p['plain_fraction']:.1%} of the roof "
                       f"({p['speedup']:.2f}x){' [NOISY]' if p['plain_noisy'] else ''}")
        if "matmul_seconds" in p:
            out.append(f"{'':>18}its weight matmuls alone: {p['matmul_seconds'] * 1e3:.1f} of {p['seconds'] * 1e3:.1f} "
                       f"ms ({p['matmul_share']:.0%} of the step); a step that short would be "
                       f"{p['matmul_fraction']:.1%} of the roof")
        if "matmuls" in p:
            out.append(f"{'':>18}the matmuls alone by kernel: " + ", ".join(
                f"{k} {m['seconds'] * 1e3:.1f} ms ({m['fraction']:.1%})" for k, m in p["matmuls"].items()))
    out.append("Measured, never graded: another program on this machine moves every figure.")
    return out


def plot(result: dict, path: str) -> None:
    """The roofline with the measured points (drawn by ``grader.learner.pictures_models``), saved to ``path``."""
    fig = pictures_models.roofline_figure(result)
    fig.savefig(path, dpi=110)
