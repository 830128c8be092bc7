"""Notebooks generated from the katas, and the pictures they show.

``python -m grader.notebooks [--out DIR] [--check]`` writes ``notebooks/NN_<slug>.ipynb`` for
every kata of the manifest whose README and stub exist: a notice, the README split at its
headings, the stub split into cells (the opening imports, then one cell per top-level function
or class), a check cell that grades the notebook's own names, hints and follow-up questions.
Generation is deterministic: regenerating gives byte-identical files.

The plot functions draw from the reference solutions (never from the learner's code) and work
headless; a kata's picture is only put in its notebook when the reference it needs exists.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import nbformat
from nbformat import v4

from grader import manifest, targets

OUT_DIR = manifest.REPO_ROOT / "notebooks"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
HEADING = re.compile(r"^#{1,6} ")
FENCE = re.compile(r"^\s*(```|~~~)")

NOTICE = """\
> **Generated** from `katas/{id}` (`README.md` and `{file}`) by `python -m grader.notebooks`.
> To change the kata, edit those files and regenerate, not this notebook.

Read the kata, fill in the code cells, then run the check cell at the end. It grades the functions
and classes defined in this notebook with the same hidden checks as `pytest katas/{id}`
(your file `katas/{id}/{file}` is graded separately). After a change, run the cells from the top again."""
MARKER = "by `python -m grader.notebooks`"
YOUR_CODE = """\
## Your code

The cells below are `katas/{id}/{file}`, one piece per cell. Replace each
`raise NotImplementedError(...)` with your implementation."""
CHECK_TEXT = """\
## Check your work

This cell runs the hidden checks of kata {id} on what the notebook defines and prints one line per
check. It never stops the notebook: an untouched notebook reports every check as not implemented yet."""
CHECK_CODE = 'from grader.grade import report_namespace\n\nresults = report_namespace("{id}", globals())'


@dataclass(frozen=True)
class Picture:
    function: str
    needs: dict[str, tuple[str, ...]]  # kata id -> names its reference must define
    caption: str


PICTURES = {
    "04": Picture("plot_memory", {"04": ("kv_cache_bytes", "crossover_tokens")}, """\
**Picture: the cache against the weights.** Cache size of a model shaped like an 8-billion-parameter
Llama (32 layers, head width 128, fp16) as the cached tokens (batch × context length) grow, with 32
KV heads (MHA), 8 (GQA) and 1 (MQA). The dashed line is the weights, 16 GB: where a line crosses it,
the cache outweighs the model. Drawn with the reference solution, not with your code."""),
    "05": Picture("plot_append_time", {"01": ("DynamicKVCache",), "05": ("StaticKVCache",)}, """\
**Picture: the cost of one decode step.** Time to append one token to a cache that already holds
S tokens. Concatenation (kata 01) copies the whole cache on every step, so its time grows with S; a
preallocated buffer writes one slot, so its time stays flat. Measured here, with the reference solutions."""),
    "06": Picture("plot_block_table", {"06": ("PagedKVCache",)}, """\
**Picture: block tables and what sharing saves.** Left: four requests that share a 10-token prompt,
in blocks of 4 tokens, after each wrote 5 tokens of its own. A row is one request's block table; a
cell names the physical block it points to. Right: blocks used as more requests share one prompt.
Drawn with the reference solution, not with your code."""),
    "07": Picture("plot_sinks", {"07": ("kept_positions",)}, """\
**Picture: what each new token can attend to.** Row t is the step that adds token t; the coloured
cells are the tokens still cached then: the first few (the sinks) and the most recent window. Grey
cells were evicted. Drawn with the reference solution, not with your code."""),
}


# -- splitting the sources ------------------------------------------------------------------
def markdown_sections(text: str) -> list[str]:
    """Split markdown at its headings (never inside a fenced code block)."""
    sections: list[list[str]] = [[]]
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if not fenced and HEADING.match(line) and any(s.strip() for s in sections[-1]):
            sections.append([])
        sections[-1].append(line)
    return [s for s in ("\n".join(lines).strip() for lines in sections) if s]


def code_chunks(source: str) -> list[tuple[str, str]]:
    """Split a module into (key, code): the opening statements (key ""), then each top-level
    function or class alone, other statements grouped between them (keyed by their first name)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    starts: list[tuple[int, str]] = []
    previous_def = False
    for node in tree.body:
        is_def = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if is_def or previous_def:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
            while first > 0 and lines[first - 1].lstrip().startswith("#"):
                first -= 1  # comments right above belong to what they describe
            starts.append((first, _key(node)))
        previous_def = is_def
    bounds = [(0, "")] + starts if not starts or starts[0][0] > 0 else starts
    chunks = []
    for (begin, key), (end, _) in zip(bounds, bounds[1:] + [(len(lines), "")]):
        code = "\n".join(lines[begin:end]).strip("\n").rstrip()
        if code:
            chunks.append((key, code))
    return chunks


def _key(node: ast.stmt) -> str:
    if hasattr(node, "name"):
        return node.name
    names = [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    return names[0] if names else f"line {node.lineno}"


def with_solution(stub: list[tuple[str, str]], solution: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The stub's chunks with each replaced by the solution's chunk of the same name; chunks only
    the solution has (its helpers) go in just before the next chunk that follows them there."""
    by_key = {key: index for index, (key, _) in enumerate(solution)}
    out, done = [], 0
    for key, code in stub:
        if key in by_key and by_key[key] >= done:
            out.extend(solution[done:by_key[key] + 1])
            done = by_key[key] + 1
        else:
            out.append((key, code))
    return out + solution[done:]


# -- building notebooks -----------------------------------------------------------------------
def available(kata: manifest.Kata) -> bool:
    root = manifest.REPO_ROOT
    return (root / kata.readme).is_file() and (root / kata.stub).is_file()


def picture_for(kata: manifest.Kata) -> Picture | None:
    """The kata's picture, when every reference it draws from exists and defines what it needs."""
    picture = PICTURES.get(kata.id)
    if picture is None:
        return None
    for kata_id, names in picture.needs.items():
        path = manifest.REPO_ROOT / manifest.get(kata_id).solution
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError):
            return None
        defined = {getattr(n, "name", None) for n in tree.body}
        if not set(names) <= defined:
            return None
    return picture


def build(kata: manifest.Kata, solution: bool = False) -> nbformat.NotebookNode:
    """The notebook of ``kata``; with ``solution=True`` its code cells hold the reference instead."""
    root = manifest.REPO_ROOT
    cells: list[tuple[str, str, str]] = [("markdown", NOTICE.format(id=kata.id, file=kata.file), "")]
    readme = markdown_sections((root / kata.readme).read_text(encoding="utf-8"))
    picture = picture_for(kata)
    for section in readme:
        cells.append(("markdown", section, ""))
        if picture and section.splitlines()[0].lower().lstrip("# ").startswith("the idea"):
            cells += _picture_cells(picture)
            picture = None
    if picture:
        cells += _picture_cells(picture)
    cells.append(("markdown", YOUR_CODE.format(id=kata.id, file=kata.file), ""))
    chunks = code_chunks((root / kata.stub).read_text(encoding="utf-8"))
    if solution:
        chunks = with_solution(chunks, code_chunks((root / kata.solution).read_text(encoding="utf-8")))
    cells += [("code", code, "stub") for _, code in chunks]
    cells.append(("markdown", CHECK_TEXT.format(id=kata.id), ""))
    cells.append(("code", CHECK_CODE.format(id=kata.id), "check"))
    cells += [("markdown", text, "") for text in _hints_and_questions(kata)]

    nb = v4.new_notebook(metadata={"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}})
    nb.nbformat, nb.nbformat_minor = 4, 5  # pinned: a newer nbformat must not change the bytes
    for index, (kind, source, tag) in enumerate(cells):
        digest = hashlib.sha1(f"{kata.id}\n{index}\n{kind}\n{source}".encode()).hexdigest()[:8]
        make = v4.new_code_cell if kind == "code" else v4.new_markdown_cell
        cell = make(source=source, id=f"k{kata.id}-{index:02d}-{digest}")
        if tag:
            cell.metadata["tags"] = [tag]
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def _picture_cells(picture: Picture) -> list[tuple[str, str, str]]:
    code = f"from grader.notebooks import {picture.function}\n\n{picture.function}();"
    return [("markdown", picture.caption, ""), ("code", code, "picture")]


def _hints_and_questions(kata: manifest.Kata) -> list[str]:
    def fold(title: str, text: str) -> str:
        return f"<details><summary>{title}</summary>\n\n{text}\n\n</details>"

    texts = []
    hints = [h for h in kata.hints if not h.startswith("TODO")]
    if hints:
        texts.append("## Hints\n\nOpen one at a time, only when stuck.\n\n"
                     + "\n\n".join(fold(f"Hint {i}", h) for i, h in enumerate(hints, 1)))
    if kata.followups:
        texts.append("## Questions an interviewer may ask next\n\n"
                     + "\n\n".join(f"{i}. {f.question}\n\n{fold('Answer', f.answer)}"
                                   for i, f in enumerate(kata.followups, 1)))
    return texts


def render(nb: nbformat.NotebookNode) -> bytes:
    return (nbformat.writes(nb, version=4).rstrip("\n") + "\n").encode("utf-8")


def generate(out_dir: Path = OUT_DIR) -> dict[Path, bytes]:
    """Every kata's notebook as it should be on disk: {path: bytes}."""
    out_dir = Path(out_dir)
    return {out_dir / Path(k.notebook).name: render(build(k)) for k in manifest.load().values() if available(k)}


def write(out_dir: Path = OUT_DIR) -> list[Path]:
    """Write every notebook; remove generated ones whose kata is gone. Returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted = generate(out_dir)
    for stale in _ours(out_dir) - set(wanted):
        stale.unlink()
    for path, data in wanted.items():
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
    return sorted(wanted)


def outdated(out_dir: Path = OUT_DIR) -> list[str]:
    """What ``write`` would change, one line each (empty when the folder is up to date)."""
    out_dir = Path(out_dir)
    wanted = generate(out_dir)
    problems = [f"{p}: missing" for p in sorted(wanted) if not p.is_file()]
    problems += [f"{p}: differs" for p in sorted(wanted) if p.is_file() and p.read_bytes() != wanted[p]]
    problems += [f"{p}: no kata generates it" for p in sorted(_ours(out_dir) - set(wanted))]
    return problems


def _ours(out_dir: Path) -> set[Path]:
    """Notebooks in ``out_dir`` that this generator wrote (never anyone else's files)."""
    return {p for p in out_dir.glob("[0-9][0-9]_*.ipynb") if MARKER in p.read_text(encoding="utf-8", errors="replace")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvkata notebooks", description="Generate the kata notebooks.")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="folder to write (default: notebooks/ in the repository)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the folder is out of date")
    args = parser.parse_args(argv)
    if args.check:
        problems = outdated(args.out)
        print("\n".join(problems) if problems else f"{args.out}: notebooks up to date")
        return 1 if problems else 0
    for path in write(args.out):
        print(f"wrote {path}")
    return 0


# -- pictures -------------------------------------------------------------------------------
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


if __name__ == "__main__":
    sys.exit(main())
