"""Where a kata's public record lives, and whether this copy can grade a kata: answered from the files
alone, without torch, so that ``kvkata`` (the board) starts at once."""
from __future__ import annotations

from pathlib import Path

from grader import manifest

RECORD_DIR = manifest.PACKAGE_DIR / "public"


def record_path(kata_id: str) -> Path:
    """The file of the kata's public record (present in a handout only)."""
    return RECORD_DIR / f"{kata_id}.pt"


def gradable(kata: manifest.Kata) -> bool:
    """Whether this copy can grade the kata: it has the reference, or (a handout) its public record."""
    return (manifest.REPO_ROOT / kata.solution).is_file() or record_path(kata.id).is_file()
