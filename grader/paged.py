"""The shared paged KV cache: ``PagedKVCache`` and ``OutOfBlocksError`` with kata 06's API.

Level-4 katas build on it (beam search forks sequences from one prefilled prompt; a scheduler
hands its blocks out). Its one home is kata 06's reference, ``solutions/06/paged.py``; this module
loads it from there, so there is no second copy to drift. Where there is no reference:

- a handout that assigns kata 06 builds on the student's own ``katas/06/paged.py`` (finish kata 06
  before the katas that use it);
- a handout of level-4 katas only gets a copy of the reference, written by ``kvkata assign`` next
  to this module (``paged_reference.py``), and its README says so.

Katas import the cache from here, never from another kata's folder.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

KATA = "06"
FILE = "paged.py"
COPY = "paged_reference.py"  # the copy a level-4-only handout carries
_HERE = Path(__file__).resolve().parent
MODULE = "grader._paged_source"  # the loaded file, under one name whichever it is


def source_file(root: Path = _HERE.parent) -> Path:
    """Where the cache comes from: the reference, else a handout's copy of it, else the student's
    kata 06. ``ImportError`` (naming the places looked at) when there is none."""
    places = [root / "solutions" / KATA / FILE, _HERE / COPY, root / "katas" / KATA / FILE]
    for place in places:
        if place.is_file():
            return place
    raise ImportError("grader.paged: no paged cache to load; looked for " + ", ".join(map(str, places)))


def _load():
    path = source_file()
    spec = importlib.util.spec_from_file_location(MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(MODULE, None)
        raise
    return module


def _names(module, names: tuple[str, ...]) -> list:
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        raise ImportError(f"grader.paged: {module.__file__} defines no {', '.join(missing)} (kata 06's API)")
    return [getattr(module, n) for n in names]


__all__ = ["PagedKVCache", "OutOfBlocksError", "BlockAllocator"]
PagedKVCache, OutOfBlocksError, BlockAllocator = _names(sys.modules.get(MODULE) or _load(), tuple(__all__))
