"""Notebooks generated from the katas.

``kvkata notebooks [--out DIR] [--check]`` (or ``python -m grader.learner.notebooks``) writes ``notebooks/NN_<slug>.ipynb`` for
every kata of the manifest whose README and stub exist: a notice, the README split at its
headings, the stub split into cells (the opening imports, then one cell per top-level function
or class), a check cell that grades the notebook's own names, hints and follow-up questions.
Generation is deterministic: regenerating gives byte-identical files.

A kata's picture (drawn by ``grader.learner.pictures`` from the reference solutions) is only put in its
notebook when the reference it needs exists.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import v4

from grader import manifest

OUT_DIR = manifest.REPO_ROOT / "notebooks"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
HEADING = re.compile(r"^#{1,6} ")
FENCE = re.compile(r"^\s*(```|~~~)")

NOTICE = """\
> **Generated** from `katas/{id}` (`README.md` and `{file}`) by `kvkata notebooks`.
> To change the kata, edit those files and regenerate, not this notebook.

Read the kata, fill in the code cells, then run the check cell at the end. It grades the functions
and classes defined in this notebook with the same hidden checks as `pytest katas/{id}`
(your file `katas/{id}/{file}` is graded separately). After a change, run the cells from the top again."""
MARKERS = ("by `kvkata notebooks`", "by `python -m grader.learner.notebooks`", "by `python -m grader.notebooks`")  # this generator's notice, now and before
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
    "09": Picture("plot_quantized_cache", {"09": ("quantize", "dequantize", "QuantizedKVCache")}, """\
**Picture: why keys go per channel, and what the bits save.** Left: one group of 4-bit keys with an
outlier channel. Per token, the outlier sets every token's step, and the ordinary channels' error
grows by an order of magnitude; per channel, each channel keeps its own step. Right: bytes held by
a cache shaped like an 8-billion-parameter Llama as it grows, fp16 against 8, 4 and 2 bits with a
residual of 32 tokens. Drawn with the reference solution, not with your code."""),
    "10": Picture("plot_prefix_cache", {"10": ("PrefixCache",)}, """\
**Picture: what the prefix cache finds.** Left: four prompts that start with one 8-token system
prompt, allocated in turn in blocks of 4; a cell names the physical block, orange where it was
reused. Request 2 repeats request 0, yet its last block is computed again (the last token's logits
are needed); request 3 is an exact multiple of the block size, so its third block is recomputed.
Right: prompt tokens prefilled for 32 requests sharing a 512-token prompt. Drawn with the reference
solution, not with your code."""),
    "11": Picture("plot_beam_blocks", {"11": ("beam_search",)}, """\
**Picture: what sharing the prompt saves a beam search.** Left: blocks in use at each forward of a
4-beam search over a 100-token prompt in blocks of 16, against one cache per beam holding its own
copy of the prompt. Right: the peak as the number of beams grows. Each beam adds only its copy of
the partly filled prompt block and the blocks of its own tokens. Drawn with the reference solution
on a tiny random model, not with your code."""),
    "12": Picture("plot_speculative", {"12": ("speculative_generate",)}, """\
**Picture: what a draft buys.** Left: tokens the target confirms per verification forward, for a
tiny target and drafts made from it by adding more and more noise to its weights, at k = 2, 4 and 8
(the dotted lines are the k + 1 of a perfect draft). Right: the expected speedup over plain decoding
when each proposal is accepted with probability α and a draft forward costs c = 0.05 of a target
forward. Measured with the reference solution, not with your code."""),
    "13": Picture("plot_schedule", {"13": ("Scheduler",)}, """\
**Picture: a schedule.** Eight requests (prompt + new tokens) arrive over the first steps. Each column
is one step: who waits, who is prefilled, who decodes, who is preempted when the blocks run out and
later recomputed. Below, the blocks in use against the ten that exist. Drawn with the reference
solution, not with your code."""),
}


# Measurements on a real model (SmolLM2), drawn from the results its bench saved (grader.learner.pictures_models).
MEASURED = {
    "07": ("plot_streaming", """\
**Measured: sinks on a real model.** SmolLM2-135M-Instruct reads the katas' own READMEs token by token
through kata 07's cache: every token kept (full), only the last 64 (window), or 4 sinks + the last 60
(sinks). Left: perplexity along the text; right: over the tokens after the first eviction. Saved by
`python -m grader.bench.k07 --json grader/results/k07_streaming.json`; run it with `--cache stub` to
measure with your own `SinkKVCache`."""),
    "09": ("plot_kivi", """\
**Measured: KIVI on a real model.** Keys and values SmolLM2-135M-Instruct caches while reading the
katas' READMEs. Left: the mean magnitude of each channel in the layer with the strongest key outliers;
right: the relative error of quantizing keys and values in groups of 32 tokens along each axis. Saved by
`python -m grader.bench.k09 --json grader/results/k09_kivi.json` (which also prints the perplexity
at each bit width; `--cache stub` uses your own `QuantizedKVCache`)."""),
    "18": ("plot_roofline", """\
**Measured: the two regimes on a real machine.** The roofline of a quiet 2-core CPU (one thread, float32),
with kata 08's reference loop on SmolLM2-135M placed on it, counted by kata 18's reference: prefills of 16
to 1,024 tokens land far right of the ridge, a decode step of one sequence far left of it (a CPU's ridge is
low, so batches of 8 and 32 already cross it; an H100's is near 295), transformers' `generate()` beside them, and hollow squares where each decode step would sit if it took
only its weight matmuls' time. Saved by `kvkata bench --roofline --real-model --threads 1 --json
grader/results/roofline.json`; run it on your own machine (`--plot roof.png` draws it)."""),
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
    if kata.id in MEASURED:
        function, caption = MEASURED[kata.id]
        code = f"from grader.learner.pictures_models import {function}\n\n{function}();"
        cells += [("markdown", caption, ""), ("code", code, "measured")]
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
    code = f"from grader.learner.pictures import {picture.function}\n\n{picture.function}();"
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
    return {p for p in out_dir.glob("[0-9][0-9]_*.ipynb") 
            if any(m in p.read_text(encoding="utf-8", errors="replace") for m in MARKERS)}


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


if __name__ == "__main__":
    sys.exit(main())
