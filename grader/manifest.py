"""The one manifest: every kata, its level, minutes, files, tasks, hints and follow-up questions.

Everything that lists katas (the plugin, the board, notebooks, the README table, the
project's tests) reads them from here and nowhere else.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
MANIFEST_FILE = PACKAGE_DIR / "manifest.toml"


@dataclass(frozen=True)
class FollowUp:
    question: str
    answer: str
    value: float | None = None  # a numeric answer that can be checked automatically
    tolerance: float = 0.0  # relative tolerance for ``value``


@dataclass(frozen=True)
class Kata:
    id: str
    slug: str
    title: str
    level: int
    minutes: int
    file: str
    topic: str
    tasks: tuple[tuple[str, ...], ...]  # per numbered task of the README, the API names it asks for
    hints: tuple[str, ...]
    followups: tuple[FollowUp, ...] = field(default=())

    @property
    def stub(self) -> str:
        """Path of the stub, relative to the repo root."""
        return f"katas/{self.id}/{self.file}"

    @property
    def solution(self) -> str:
        return f"solutions/{self.id}/{self.file}"

    @property
    def readme(self) -> str:
        return f"katas/{self.id}/README.md"

    @property
    def notebook(self) -> str:
        return f"notebooks/{self.id}_{self.slug}.ipynb"

    @property
    def api_names(self) -> tuple[str, ...]:
        """Every API name the tasks ask for, each once, in task order."""
        return tuple(dict.fromkeys(name for task in self.tasks for name in task))

    def task_number(self, name: str) -> int | None:
        """1-based number of the README task that asks for ``name``: the first task naming it, else
        (for ``Cls.method``) the first task naming ``Cls``."""
        for wanted in (name, name.split(".")[0]):
            for number, task in enumerate(self.tasks, start=1):
                if wanted in task:
                    return number
        return None


@lru_cache(maxsize=None)
def load(path: Path = MANIFEST_FILE) -> dict[str, Kata]:
    """All katas by id, in manifest order."""
    with open(path, "rb") as handle:
        raw = tomllib.load(handle)
    katas: dict[str, Kata] = {}
    for entry in raw.get("kata", []):
        followups = tuple(
            FollowUp(f["q"], f["a"], f.get("value"), f.get("tolerance", 0.0)) for f in entry.get("followup", [])
        )
        kata = Kata(
            id=entry["id"],
            slug=entry["slug"],
            title=entry["title"],
            level=int(entry["level"]),
            minutes=int(entry["minutes"]),
            file=entry["file"],
            topic=entry["topic"],
            tasks=tuple(_task(t, entry["id"]) for t in entry["tasks"]),
            hints=tuple(entry["hints"]),
            followups=followups,
        )
        if kata.id in katas:
            raise ValueError(f"{path}: kata id {kata.id!r} appears twice")
        katas[kata.id] = kata
    return katas


def _task(task, kata_id: str) -> tuple[str, ...]:
    """One task of the manifest: a list of API names (a single name is accepted too)."""
    names = (task,) if isinstance(task, str) else tuple(task)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"kata {kata_id}: tasks: expected lists of API names, got {task!r}")
    return names


def get(kata_id: str) -> Kata:
    """The kata with this id ("3" and "03" both work); ValueError listing the valid ids otherwise."""
    katas = load()
    key = str(kata_id).strip()
    if key.isdigit():
        key = f"{int(key):02d}"
    if key not in katas:
        raise ValueError(f"unknown kata {kata_id!r}; valid ids: {', '.join(katas)}")
    return katas[key]


def levels() -> dict[int, str]:
    return {1: "foundations", 2: "serving memory", 3: "systems", 4: "beyond"}


def markdown_table() -> str:
    """The kata table of the README, generated from the manifest (a test keeps them in sync)."""
    rows = ["| kata | level | minutes | title | what you build |", "|---|---|---|---|---|"]
    for kata in load().values():
        rows.append(
            f"| [{kata.id}](katas/{kata.id}/README.md) | {kata.level} · {levels()[kata.level]} | {kata.minutes} "
            f"| {kata.title} | {kata.topic} |"
        )
    return "\n".join(rows)
