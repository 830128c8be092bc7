"""The conformance tables: which check enforces which promise of the SPEC and of a kata's README.

One table per kata, ``grader/checks/promises/kNN.toml``, next to the checks. This module reads a
table and lists what a kata's stub makes public (names and arguments), so the project's tests can
show any promise without a check, and any public name or argument without a promise.
"""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from grader import manifest

PROMISES_DIR = manifest.PACKAGE_DIR / "checks" / "promises"
KINDS = ("returns", "dtype", "device", "bad-input", "state", "exact", "error-type")
SOURCES = ("SPEC", "README")
# The inputs beyond the drawn ones that real code meets (issue-tracker review kinds, one word each). Every
# table says, for each, which checks exercise it in this kata, or why it does not apply here.
WIDE = {
    "large": "sizes beyond the drawn range: a few hundred tokens, 16+ heads, larger batches",
    "half": "bfloat16 and float16 inputs, the result keeping the half type",
    "extremes": "numerical extremes: large-magnitude activations, near-ties in a choice",
    "aliasing": "state and aliasing: a returned value the caller changes, the same call twice, two instances "
                "interleaved, a returned object kept while the next call runs",
    "strided": "non-contiguous inputs, as a .transpose(1, 2) after a projection makes them",
    "special": "special values: token id 0, multi-digit ids, the first and last valid value of an argument",
    "sequences": "rules reachable only through a particular sequence of operations",
    "both-directions": "bad secondary arguments in both directions: too small and too large, wrong type, "
                       "each boundary value accepted",
}


def table_path(kata_id: str) -> Path:
    return PROMISES_DIR / f"k{kata_id}.toml"


def load(kata_id: str) -> list[dict]:
    """The promises of one kata, as written in its table (a missing table is FileNotFoundError)."""
    with open(table_path(kata_id), "rb") as handle:
        return list(tomllib.load(handle).get("promise", []))


def load_wide(kata_id: str) -> list[dict]:
    """The table's ``[[wide]]`` entries: for each kind of WIDE, the checks that exercise it, or an exempt reason."""
    with open(table_path(kata_id), "rb") as handle:
        return list(tomllib.load(handle).get("wide", []))


def _methods(node: ast.ClassDef):
    """Public methods of a class, dunders such as ``__init__`` and ``__len__`` included, properties too."""
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and (not item.name.startswith("_") or item.name.startswith("__")):
            yield item


def _is_property(node: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)


def public_api(path: Path) -> dict[str, str]:
    """Public top-level names with their signatures (methods too, as Class.method)."""
    tree = ast.parse(Path(path).read_text())
    api = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            api[node.name] = ast.unparse(node.args)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            api[node.name] = ",".join(ast.unparse(b) for b in node.bases)
            for item in _methods(node):
                api[f"{node.name}.{item.name}"] = ast.unparse(item.args)
    return api


def _arg_names(args: ast.arguments, method: bool) -> list[str]:
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return names[1:] if method and names[:1] in (["self"], ["cls"]) else names


def public_arguments(path: Path) -> dict[str, list[str]]:
    """Every public name (function, class, Class.method, property) with its arguments, ``self`` left out.

    A class lists no arguments of its own: they belong to ``Class.__init__``.
    """
    tree = ast.parse(Path(path).read_text())
    names: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            names[node.name] = _arg_names(node.args, method=False)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            names[node.name] = []
            for item in _methods(node):
                names[f"{node.name}.{item.name}"] = [] if _is_property(item) else _arg_names(item.args, method=True)
    return names


def _touches_tensors(node: ast.FunctionDef) -> bool:
    """Whether a signature takes or returns tensors: a Tensor annotation, or a ``dtype``/``device`` argument."""
    signature = ast.unparse(node.args) + (ast.unparse(node.returns) if node.returns is not None else "")
    return "Tensor" in signature or any(a.arg in ("dtype", "device") for a in (*node.args.args, *node.args.kwonlyargs))


def tensor_names(path: Path) -> set[str]:
    """Public names that return or hold tensors: functions and methods by their signatures, classes that
    are ``nn.Module``s or have such a method."""
    tree = ast.parse(Path(path).read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and _touches_tensors(node):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            touching = {f"{node.name}.{m.name}" for m in _methods(node) if _touches_tensors(m)}
            if touching or any("Module" in ast.unparse(b) for b in node.bases):
                names |= touching | {node.name}
    return names
