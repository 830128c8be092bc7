"""The one manifest: every kata, its level, minutes, files, tasks, hints and follow-up questions.

Everything that lists katas (the plugin, the board, notebooks, the README table, the
project's tests) reads them from here and nowhere else.
"""
from __future__ import annotations

import ast
import math
import operator
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
    values: tuple[float, ...] = ()  # the numbers the question asks for, in its order, checked automatically
    tolerance: float = 0.0  # relative tolerance for each of ``values``

    @property
    def value(self) -> float | None:
        """The first number the question asks for; None for a question answered in words."""
        return self.values[0] if self.values else None


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
    hint_tasks: tuple[tuple[int, ...], ...] = field(default=())  # per hint, the README tasks it speaks to
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

    def api_name(self, word: str) -> str | None:
        """The API name ``word`` stands for: itself, or a method's short name (``attention_mask`` for
        ``StaticKVCache.attention_mask``); None when no task asks for it."""
        if word in self.api_names:
            return word
        return next((name for name in self.api_names if name.endswith(f".{word}")), None)

    def task_number(self, name: str) -> int | None:
        """1-based number of the README task that asks for ``name``: the first task naming it, else
        (for ``Cls.method``) the first task naming ``Cls``."""
        for wanted in (name, name.split(".")[0]):
            for number, task in enumerate(self.tasks, start=1):
                if wanted in task:
                    return number
        return None


@lru_cache(maxsize=None)
def _raw(path: Path) -> dict:
    with open(path, "rb") as handle:
        return tomllib.load(handle)


@lru_cache(maxsize=None)
def levels(path: Path = MANIFEST_FILE) -> dict[int, str]:
    """Every level's name by its number, in order (the manifest's [levels])."""
    raw = _raw(path).get("levels", {})
    if not raw or not all(key.isdigit() and isinstance(name, str) and name for key, name in raw.items()):
        raise ValueError(f"{path}: [levels] must name each level by its number, as in 1 = \"foundations\"")
    return dict(sorted((int(key), name) for key, name in raw.items()))


@lru_cache(maxsize=None)
def load(path: Path = MANIFEST_FILE) -> dict[str, Kata]:
    """All katas by id, in manifest order."""
    raw = _raw(path)
    katas: dict[str, Kata] = {}
    for entry in raw.get("kata", []):
        followups = tuple(_followup(f, entry["id"]) for f in entry.get("followup", []))
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
            hint_tasks=_hint_tasks(entry),
            followups=followups,
        )
        if kata.id in katas:
            raise ValueError(f"{path}: kata id {kata.id!r} appears twice")
        if kata.level not in levels(path):
            raise ValueError(f"{path}: kata {kata.id}: level {kata.level} is not in [levels] ({', '.join(map(str, levels(path)))})")
        katas[kata.id] = kata
    return katas


def _hint_tasks(entry: dict) -> tuple[tuple[int, ...], ...]:
    """``hint_tasks``: one list of README task numbers per hint, the tasks that hint speaks to."""
    raw = entry.get("hint_tasks", [])
    where = f"kata {entry['id']}: hint_tasks"
    if raw and len(raw) != len(entry["hints"]):
        raise ValueError(f"{where}: expected one list per hint ({len(entry['hints'])}), got {len(raw)}")
    tasks = tuple(tuple(numbers) for numbers in raw)
    if any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(entry["tasks"])
           for numbers in tasks for n in numbers):
        raise ValueError(f"{where}: expected task numbers from 1 to {len(entry['tasks'])}, got {raw!r}")
    return tasks


def _followup(raw: dict, kata_id: str) -> FollowUp:
    """A follow-up question. With a ``given`` table, its numbers (and formulas over them, in order)
    fill the ``{name}`` fields of the question and the answer, and ``value`` may be a formula too:
    the question, the answer and the checked value then come from one computation."""
    question, answer, value = raw["q"], raw["a"], raw.get("value")
    values = list(value) if isinstance(value, list) else [] if value is None else [value]
    if "given" in raw:
        names: dict[str, float] = {}
        for name, given in raw["given"].items():
            names[name] = evaluate(given, names, f"kata {kata_id}: given.{name}")
        values = [evaluate(v, names, f"kata {kata_id}: value") if isinstance(v, str) else v for v in values]
        first = values[0] if values else None
        question, answer = question.format(**names, value=first), answer.format(**names, value=first)
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        raise ValueError(f"kata {kata_id}: value: expected a number or a list of numbers, got {value!r}")
    return FollowUp(question, answer, tuple(values), raw.get("tolerance", 0.0))


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.USub: operator.neg}
_FUNCTIONS = {"ceil": math.ceil, "floor": math.floor, "round": round, "min": min, "max": max}


def evaluate(formula, names: dict, where: str = "formula"):
    """A number, or an arithmetic formula over ``names`` (+ - * / // **, ceil, floor, round, min, max)."""
    if isinstance(formula, (int, float)) and not isinstance(formula, bool):
        return formula
    if not isinstance(formula, str):
        raise ValueError(f"{where}: expected a number or a formula, got {formula!r}")

    def walk(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.operand))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
            return _FUNCTIONS[node.func.id](*map(walk, node.args))
        raise ValueError(f"{where}: cannot evaluate {ast.unparse(node)!r} in {formula!r} (known names: "
                         f"{', '.join(names) or 'none'})")

    try:
        return walk(ast.parse(formula, mode="eval").body)
    except SyntaxError:
        raise ValueError(f"{where}: {formula!r} is not a formula") from None


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


def markdown_table() -> str:
    """The kata table of the README, generated from the manifest (a test keeps them in sync)."""
    rows = ["| kata | level | minutes | title | what you build |", "|---|---|---|---|---|"]
    for kata in load().values():
        rows.append(
            f"| [{kata.id}](katas/{kata.id}/README.md) | {kata.level} · {levels()[kata.level]} | {kata.minutes} "
            f"| {kata.title} | {kata.topic} |"
        )
    return "\n".join(rows)
