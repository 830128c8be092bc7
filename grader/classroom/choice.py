"""What an instructor picks for a handout, an autograder or a grading run: the katas (a level, a
level alone, or single katas by id) and the points each kata is worth.

    --level 2 [--only]            the katas of level 2 and below (level 2 alone)
    --kata 03 --kata 05           those katas only (single-kata homework)
    --points 10                   every kata 10 points
    --points 01=10,02=20          those katas 10 and 20; a kata not named keeps its default
    --points 5,01=10              every kata 5, kata 01 10

A kata's default is one point per check. Each check of a kata is worth the kata's points divided
by its checks, so a kata of 23 checks weighs what a kata of 12 does when both are given 10.
"""
from __future__ import annotations

import math

from grader import checks, manifest
from grader.errors import UsageError


def katas(level: int | None, only: bool = False, ids: list[str] | None = None) -> list[manifest.Kata]:
    """The chosen katas in the manifest's order; a clear error for a level or id that names none."""
    known = manifest.load()
    if ids:
        if level is not None or only:
            raise UsageError("choose the katas by --kata or by --level, not both")
        wanted = {_kata_id(i, known) for i in ids}
        return [k for k in known.values() if k.id in wanted]
    if level is None:
        raise UsageError("which katas? give --level N (with --only for that level alone) or --kata NN")
    chosen = [k for k in known.values() if (k.level == level if only else k.level <= level)]
    if not chosen:
        levels = sorted({k.level for k in known.values()})
        raise UsageError(f"--level {level}: no kata has that level; levels: {', '.join(map(str, levels))}")
    return chosen


def _kata_id(text: str, known: dict) -> str:
    kata_id = text.strip().zfill(2)
    if kata_id not in known:
        raise UsageError(f"--kata {text}: no such kata; katas: {', '.join(known)}")
    return kata_id


def check_count(kata: manifest.Kata) -> int:
    return len(checks.for_kata(kata.id).all)


def points(spec: str | None, chosen: list[manifest.Kata]) -> dict[str, float]:
    """Each chosen kata's points from ``--points`` (see the module's docstring); one a check by default."""
    given = dict(default=None)
    for part in (p.strip() for p in (spec or "").split(",") if p.strip()):
        name, _, value = part.rpartition("=")
        key = _kata_id(name, manifest.load()) if name else "default"
        if key != "default" and key not in {k.id for k in chosen}:
            raise UsageError(f"--points {part}: kata {key} is not among the chosen katas "
                             f"({', '.join(k.id for k in chosen)})")
        given[key] = _number(value, part)
    return {k.id: given.get(k.id, given["default"] if given["default"] is not None else float(check_count(k)))
            for k in chosen}


def _number(text: str, part: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--points {part}: {text!r} is not a number of points") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"--points {part}: points must be a positive number")
    return value


def per_check(kata_points: float, total_checks: int) -> float:
    """What one check of a kata is worth."""
    return kata_points / total_checks if total_checks else 0.0


def describe(points_of: dict[str, float]) -> str:
    """``01: 10, 02: 10 (total 20)`` — whole numbers without a decimal point."""
    shown = ", ".join(f"{k}: {number(v)}" for k, v in points_of.items())
    return f"{shown} (total {number(sum(points_of.values()))})"


def number(value: float) -> str:
    return f"{value:g}" if value != int(value) else str(int(value))
