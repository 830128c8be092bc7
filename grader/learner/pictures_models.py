"""Pictures of measurements on a real model (SmolLM2-135M-Instruct), drawn from the results the
benches saved in ``grader/results/``: a notebook draws them in a second, without the model.

    python -m grader.bench.k07 --json grader/results/k07_streaming.json   # what plot_streaming draws
    python -m grader.bench.k09 --json grader/results/k09_kivi.json        # what plot_kivi draws
    kvkata bench --roofline --real-model --threads 1 --json grader/results/roofline.json   # plot_roofline
"""
from __future__ import annotations

import json
from pathlib import Path

from grader import manifest
from grader.learner.pictures import _pyplot

STREAMING_RESULTS = manifest.PACKAGE_DIR / "results" / "k07_streaming.json"  # written by python -m grader.bench.k07 --json
KIVI_RESULTS = manifest.PACKAGE_DIR / "results" / "k09_kivi.json"  # written by python -m grader.bench.k09 --json
ROOFLINE_RESULTS = manifest.PACKAGE_DIR / "results" / "roofline.json"  # written by kvkata bench --roofline --json


def _results(path: Path, command: str):
    if not path.is_file():
        print(f"No saved measurement at {path}: make it with `{command}`.")
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def _running(nll: list[float], width: int) -> list[float]:
    """Perplexity over the last ``width`` tokens at each token (exp of the running mean NLL)."""
    import math

    out, total = [], 0.0
    for i, x in enumerate(nll):
        total += x - (nll[i - width] if i >= width else 0.0)
        out.append(math.exp(total / min(i + 1, width)))
    return out


def plot_streaming(path: Path = STREAMING_RESULTS, width: int = 128):
    """Kata 07: perplexity along the text with the full cache, a plain window and sinks + window."""
    rows = _results(path, f"python -m grader.bench.k07 --json {path.name}")
    if rows is None:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2.2, 1]})
    colours = {"full": "#404040", "window": "#c00000", "sinks": "#2e75b6"}
    for r in rows:
        label = f"{r['cache']}: {r['n_sink']} sinks + window {r['window']}" if r["cache"] != "full" else "full cache"
        left.plot(range(1, len(r["nll"]) + 1), _running(r["nll"], width), label=label, color=colours.get(r["cache"]))
    evict = next(r["n_sink"] + r["window"] for r in rows if r["cache"] == "sinks")
    left.axvline(evict, color="grey", linestyle=":", linewidth=1)
    left.text(evict, left.get_ylim()[1] * 0.95, " first eviction", fontsize=8, va="top", color="grey")
    left.set(yscale="log", xlabel="token of the text (the katas' READMEs)", ylabel=f"perplexity, last {width} tokens",
             title="SmolLM2-135M reading the katas' READMEs token by token")
    left.legend(fontsize=8)
    names = [r["cache"] for r in rows]
    right.bar(names, [r["ppl_after_eviction"] for r in rows], color=[colours.get(n) for n in names])
    for i, r in enumerate(rows):
        right.text(i, r["ppl_after_eviction"], f"{r['ppl_after_eviction']:.1f}", ha="center", va="bottom", fontsize=9)
    right.set(yscale="log", ylabel="perplexity after the first eviction", title="After the first eviction")
    fig.tight_layout()
    return fig


def plot_kivi(path: Path = KIVI_RESULTS, layer: int | None = None):
    """Kata 09: key and value magnitude per channel in one layer, and quantization error by axis."""
    result = _results(path, f"python -m grader.bench.k09 --json {path.name}")
    if result is None:
        return None
    plt = _pyplot()
    layers = next(r["layers"] for r in result["errors"] if "layers" in r)
    if layer is None:  # the layer whose keys have the strongest outliers
        layer = max(layers, key=lambda i: layers[i]["keys"]["max_over_median"])
    shown = layers[str(layer)] if str(layer) in layers else layers[layer]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    channels = range(len(shown["keys"]["magnitude"]))
    left.bar(channels, shown["keys"]["magnitude"], color="#2e75b6", label="keys")
    left.bar(channels, shown["values"]["magnitude"], color="#f4b183", alpha=0.8, label="values")
    left.set(xlabel="channel", ylabel="mean |x| over heads and tokens",
             title=f"Layer {layer}: key outlier channels {shown['keys']['outliers']}")
    left.legend()
    rows = [r for r in result["errors"] if "n_bits" in r]
    series = (("keys_per_channel", "keys per channel (KIVI)", "#2e75b6", ""),
              ("keys_per_token", "keys per token", "#2e75b6", "//"),
              ("values_per_token", "values per token (KIVI)", "#f4b183", ""),
              ("values_per_channel", "values per channel", "#f4b183", "//"))
    width = 0.2
    for j, (key, label, colour, hatch) in enumerate(series):
        right.bar([i + j * width for i in range(len(rows))], [r[key] for r in rows], width, label=label,
                  color=colour, hatch=hatch, edgecolor="white")
    right.set(xticks=[i + 1.5 * width for i in range(len(rows))], xticklabels=[f"{r['n_bits']} bits" for r in rows],
              yscale="log", ylabel="relative error, mean over layers", title="Quantization error by axis")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_roofline(path: Path = ROOFLINE_RESULTS):
    """Kata 18: the roofline of the machine the saved run measured, with its prefill and decode points."""
    result = _results(path, f"kvkata bench --roofline --real-model --threads 1 --json {path.name}")
    return None if result is None else roofline_figure(result)


def roofline_figure(result: dict):
    """The roofline of ``result`` (``grader.bench.roofline.run``'s): prefill right of the ridge, decode
    left of it, transformers' ``generate()`` beside the loop, and where each decode step would sit
    with only its weight matmuls' time."""
    plt = _pyplot()
    m, points = result["machine"], result["points"]
    ridge = m["peak_flops"] / m["bandwidth"]
    lo = min([p["intensity"] for p in points] + [ridge]) / 4
    hi = max([p["intensity"] for p in points] + [ridge]) * 4
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [min(m["peak_flops"], x * m["bandwidth"]) for x in xs], color="black", label="roofline")
    ax.axvline(ridge, color="grey", linestyle=":", label=f"ridge {ridge:.1f} FLOP/B")
    for kind, marker in (("prefill", "o"), ("decode", "s"), ("transformers", "^")):
        chosen = [p for p in points if p["kind"] == kind]
        if chosen:
            ax.scatter([p["intensity"] for p in chosen], [p["flops_per_s"] for p in chosen], marker=marker,
                       label="transformers' generate()" if kind == "transformers" else kind)
        for p in chosen:
            ax.annotate(p["label"].split(" ", 1)[1], (p["intensity"], p["flops_per_s"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    ceiling = [p for p in points if "matmul_fraction" in p]
    if ceiling:  # where a step would sit if it took only its weight matmuls' time
        ax.scatter([p["intensity"] for p in ceiling], [p["matmul_fraction"] * p["roof_flops_per_s"] for p in ceiling],
                   marker="s", facecolors="none", edgecolors="grey", label="its weight matmuls alone")
    ax.set(xscale="log", yscale="log", xlabel="FLOPs per byte", ylabel="FLOP/s",
           title=f"Roofline: {result['model']} on {m['device']}, {m['threads']} thread(s)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
