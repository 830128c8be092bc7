"""The notebooks are generated, up to date, and run: untouched they report every check as not
implemented without stopping; with the reference pasted in, every check passes."""
from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys

import nbformat
import pytest

from conftest import slow
from grader import checks, manifest, state
from grader.learner import notebooks, pictures

ROOT = manifest.REPO_ROOT
KATAS = [k for k in manifest.load().values() if notebooks.available(k)]
IDS = [k.id for k in KATAS]
CONCURRENT_KERNELS = 2


def _squash(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def test_notebooks_folder_is_up_to_date(tmp_path):
    written = notebooks.write(tmp_path)
    fresh = {p.name: p.read_bytes() for p in written}
    on_disk = {p.name: p.read_bytes() for p in (ROOT / "notebooks").glob("*.ipynb")}
    hint = "run: kvkata notebooks"
    assert sorted(on_disk) == sorted(fresh), hint
    for name, data in fresh.items():
        assert on_disk[name] == data, f"notebooks/{name} is out of date; {hint}"
    assert notebooks.outdated(tmp_path) == []
    assert notebooks.generate(tmp_path) == {p: p.read_bytes() for p in written}, "generating twice differed"


@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_notebook_layout(kata):
    nb = nbformat.reads(notebooks.render(notebooks.build(kata)).decode(), as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec == notebooks.KERNELSPEC
    first = nb.cells[0]
    assert first.cell_type == "markdown" and f"katas/{kata.id}" in first.source and "Generated" in first.source
    command = re.search(r"by `([^`]+)`", first.source).group(1)  # the command the README gives for it
    assert command == "kvkata notebooks" and f"`{command}`" in (ROOT / "README.md").read_text(), command
    assert len({c.id for c in nb.cells}) == len(nb.cells)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    tags = [c.metadata.get("tags", [None])[0] for c in nb.cells]
    assert tags.count("check") == 1
    assert tags.count("picture") == (1 if notebooks.picture_for(kata) else 0)
    assert tags.count("measured") == (1 if kata.id in notebooks.MEASURED else 0)
    stub_code = "\n".join(c.source for c in nb.cells if "stub" in c.metadata.get("tags", []))
    assert _squash(stub_code) == _squash((ROOT / kata.stub).read_text()), "stub cells lost or changed code"
    readme = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert set(_squash((ROOT / kata.readme).read_text())) <= set(_squash(readme)), "README text lost"


@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_stub_and_solution_split_into_the_same_pieces(kata):
    solution = (ROOT / kata.solution).read_text()
    chunks = notebooks.code_chunks(solution)
    assert _squash("\n".join(code for _, code in chunks)) == _squash(solution)
    merged = notebooks.with_solution(notebooks.code_chunks((ROOT / kata.stub).read_text()), chunks)
    assert [c for c in merged if c in chunks] == chunks, "the solved notebook must hold all the solution, in order"


def test_splitting_rules():
    source = '''"""Doc."""
import math

LIMIT = 3


# about f
@staticmethod
def f():
    return 1
X = 2
Y = 3

class C:
    pass
'''
    assert notebooks.code_chunks(source) == [
        ("", '"""Doc."""\nimport math\n\nLIMIT = 3'),
        ("f", "# about f\n@staticmethod\ndef f():\n    return 1"),
        ("X", "X = 2\nY = 3"),
        ("C", "class C:\n    pass"),
    ]
    stub = [("", "imports"), ("f", "stub f"), ("C", "stub C")]
    solution = [("", "imports+"), ("_h", "helper"), ("f", "f"), ("_g", "g"), ("C", "C"), ("_tail", "t")]
    assert notebooks.with_solution(stub, solution) == solution
    assert notebooks.markdown_sections("# T\nx\n```\n# not a heading\n```\n## A\ny") == [
        "# T\nx\n```\n# not a heading\n```", "## A\ny"]


@slow
def test_pictures_are_drawn_headless_from_the_references():
    import matplotlib

    matplotlib.use("Agg")
    small = {"plot_append_time": {"max_len": 512, "points": 4, "repeats": 2}}
    drawn = 0
    for kata_id, picture in notebooks.PICTURES.items():
        if notebooks.picture_for(manifest.get(kata_id)) is None:
            continue  # that kata's reference is not written yet
        fig = getattr(pictures, picture.function)(**small.get(picture.function, {}))
        assert fig.axes and all(ax.has_data() for ax in fig.axes), picture.function
        png = io.BytesIO()
        fig.savefig(png, format="png")
        assert png.getvalue().startswith(b"\x89PNG")
        matplotlib.pyplot.close(fig)
        drawn += 1
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND")}
    backend = subprocess.run([sys.executable, "-c", "from grader.learner import pictures; print(pictures._pyplot().get_backend())"],
                             cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert backend.lower() == "agg"


# -- executing the notebooks --------------------------------------------------------------
def _with_solution_appended(kata) -> nbformat.NotebookNode:
    """The untouched notebook, then the reference's code cells and the check cell again."""
    nb = notebooks.build(kata)
    solved = notebooks.build(kata, solution=True)
    for cell in solved.cells:
        if {"stub", "check"} & set(cell.metadata.get("tags", [])):
            cell.id = f"solved-{len(nb.cells)}"
            nb.cells.append(cell)
    return nb


async def _execute(nbs: dict, state_dir) -> dict:
    """Run the notebooks, a few kernels at a time (cwd notebooks/, as `jupyter lab notebooks/`),
    keeping the board they update in ``state_dir``; returns what stopped any of them (a timeout,
    a dead kernel) by kata id."""
    from nbclient import NotebookClient

    gate = asyncio.Semaphore(CONCURRENT_KERNELS)
    # two kernels on two cores: no thread oversubscription
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KVKATA_STATE": str(state_dir)}
    stopped = {}

    async def one(kata_id, nb):
        async with gate:
            client = NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                                    resources={"metadata": {"path": str(ROOT / "notebooks")}})
            try:
                await client.async_execute(env=env)
            except Exception as exc:  # reported by that kata's test, not by every test
                stopped[kata_id] = exc

    await asyncio.gather(*(one(kata_id, nb) for kata_id, nb in nbs.items()))
    return stopped


@pytest.fixture(scope="module")
def executed(request, tmp_path_factory):
    """Every notebook this session selected, executed once: {kata id: (notebook, what stopped it,
    the board's saved results afterwards)}."""
    wanted = sorted({item.callspec.params["kata"].id for item in request.session.items
                     if item.originalname == "test_notebook_runs_untouched_and_solved"})
    nbs = {kata_id: _with_solution_appended(manifest.get(kata_id)) for kata_id in wanted}
    state_dir = tmp_path_factory.mktemp("state")
    stopped = asyncio.run(_execute(nbs, state_dir))
    board = state.read_json(state_dir / state.NOTEBOOK_RESULTS, {})  # a notebook's results are kept apart
    assert not (state_dir / state.RESULTS).exists(), "a notebook wrote the results of the katas' files"
    return {kata_id: (nb, stopped.get(kata_id), board) for kata_id, nb in nbs.items()}


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@slow
@pytest.mark.parametrize("kata", KATAS, ids=IDS)
def test_notebook_runs_untouched_and_solved(kata, executed):
    nb, stopped, board = executed[kata.id]
    assert stopped is None, f"executing notebook {kata.id} stopped: {stopped!r}"
    errors = [f"cell {c.id}: {o.ename}: {o.evalue}" for c in nb.cells if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]
    assert not errors, "\n".join(errors)
    total = len(checks.for_kata(kata.id).all)
    untouched, solved = [_text(c) for c in nb.cells if "check" in c.metadata.get("tags", [])]
    marks = [line[0] for line in untouched.splitlines() if line[:1] in "✓✗·" and line[:1]]
    assert marks == ["·"] * total, untouched
    assert f"kata {kata.id}: 0/{total} checks pass" in untouched
    assert untouched.count("not implemented yet") == total
    assert f"kata {kata.id}: {total}/{total} checks pass" in solved, solved
    saved = board.get(kata.id, {})  # the check cell notes its run on the board, apart from the file's
    assert (saved.get("target"), saved.get("passed"), saved.get("total")) == ("notebook", total, total), saved
    for cell in nb.cells:
        if {"picture", "measured"} & set(cell.metadata.get("tags", [])):
            assert any("image/png" in o.get("data", {}) for o in cell.outputs), f"no picture from {cell.source!r}"
