"""The known-mistake catalogues: one module per kata (``k03.py``), each a list of ``Mistake``.

A mistake is the reference with one bug, written as text edits of the reference file, so the
catalogue can never drift from the reference silently: an edit that no longer applies is an
error the project's tests report.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache

from grader import manifest
from grader.engine import targets


@dataclass(frozen=True)
class Mistake:
    name: str  # short, as a learner would say it: "tiled repeat instead of interleave"
    why: str  # one line: what goes wrong
    hint: str  # one line: where to look
    edits: tuple[tuple[str, str], ...]  # (text in the reference, replacement); each must occur once

    def apply(self, source: str) -> str:
        for old, new in self.edits:
            count = source.count(old)
            if count != 1:
                raise ValueError(f"mistake {self.name!r}: {old!r} occurs {count} times in the reference, expected once")
            source = source.replace(old, new)
        return source


def catalogue(kata_id: str) -> list[Mistake]:
    try:
        module = importlib.import_module(f"grader.mistakes.k{kata_id}")
    except ModuleNotFoundError:
        return []
    return list(module.MISTAKES)


@lru_cache(maxsize=None)
def load(kata_id: str) -> tuple[tuple[Mistake, targets.Target], ...]:
    """Each mistake with the module built from it."""
    kata = manifest.get(kata_id)
    source = (manifest.REPO_ROOT / kata.solution).read_text(encoding="utf-8")
    built = []
    for mistake in catalogue(kata_id):
        filename = f"<mistake {kata_id}: {mistake.name}>"
        built.append((mistake, targets.from_source(mistake.apply(source), filename, f"mistake {mistake.name!r}")))
    return tuple(built)
