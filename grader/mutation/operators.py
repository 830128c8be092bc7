"""The mutation operators: small, realistic edits of a reference, one at a time.

Each mutant replaces one span of the source (found through the AST's positions) with new text,
so the rest of the file — its formatting and line numbers — stays as it was. A mutant's id is
stable across edits elsewhere in the file: ``operator: the line's text`` (``#2`` … when the same
operator applies twice on one line), never a line number.

Standard operators: a comparison (``<`` ↔ ``<=``, ``==`` ↔ ``!=``, ``is`` ↔ ``is not``, ``in`` ↔
``not in``), arithmetic (``+`` ↔ ``-``, ``*`` ↔ ``/``, ``//`` → ``/``, ``%`` → ``//``), ``and`` ↔
``or``, a ``not`` dropped, ``True`` ↔ ``False``, a statement or a ``raise`` dropped, a number ± 1.
The field's: a dtype cast dropped (``.float()``, ``.double()``, ``.half()``, ``.to(...)``) or added
to a returned tensor (``.float()``), a ``dtype=`` argument dropped, ``.contiguous()``,
``.clone()`` or ``.detach()`` dropped, ``if x is not None`` → ``if x``, ``!=`` → ``<``, a slice
bound ± 1, and a size or limit (a constant of 8 or more) moved to a boundary value (0, 1, 64, 256).

Strings, f-strings, docstrings, annotations and the message of a ``raise`` are never mutated.
"""
from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

COMPARE = {ast.Lt: ["<="], ast.LtE: ["<"], ast.Gt: [">="], ast.GtE: [">"], ast.Eq: ["!="], ast.NotEq: ["==", "<"],
           ast.Is: ["is not"], ast.IsNot: ["is"], ast.In: ["not in"], ast.NotIn: ["in"]}
BINARY = {ast.Add: "-", ast.Sub: "+", ast.Mult: "/", ast.Div: "*", ast.FloorDiv: "/", ast.Mod: "//"}
SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
          ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
          ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%"}
CASTS = {"float", "double", "half", "bfloat16", "to"}
COPIES = {"contiguous", "clone", "detach"}
BOUNDARIES = (0, 1, 64, 256)


@dataclass(frozen=True)
class Mutant:
    id: str  # "operator: line text" (+ " #n"), stable across edits elsewhere in the file
    operator: str
    line: int
    source: str  # the whole mutated file


@dataclass(frozen=True)
class _Edit:
    operator: str
    node: ast.AST  # the span replaced
    text: str  # what replaces it


def _u(node: ast.AST) -> str:
    return ast.unparse(node)


def _skipped(tree: ast.Module) -> set[int]:
    """ids of nodes never mutated: docstrings, annotations, the messages of raises, f-strings."""
    skip: set[int] = set()

    def mark(node):
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            mark(body[0])
        if isinstance(node, (ast.arg, ast.AnnAssign)):
            mark(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mark(node.returns)
        if isinstance(node, ast.Raise):
            mark(node.exc)
            mark(node.cause)
        if isinstance(node, (ast.JoinedStr, ast.ImportFrom, ast.Import)):
            mark(node)
    return skip


def _compare_edits(node: ast.Compare) -> list[_Edit]:
    edits = []
    for i, op in enumerate(node.ops):
        for new in COMPARE.get(type(op), []):
            parts = [_u(node.left)]
            for j, (o, right) in enumerate(zip(node.ops, node.comparators)):
                parts += [new if j == i else SYMBOL[type(o)], _u(right)]
            name = "`!=` → `<`" if new == "<" and isinstance(op, ast.NotEq) else f"`{SYMBOL[type(op)]}` → `{new}`"
            edits.append(_Edit(name, node, " ".join(parts)))
    return edits


def _number_edits(node: ast.Constant) -> list[_Edit]:
    value = node.value
    if isinstance(value, bool):
        return [_Edit(f"`{value}` → `{not value}`", node, repr(not value))]
    if not isinstance(value, (int, float)):
        return []
    news = [value + 1, value - 1] if isinstance(value, int) else [value * 2, value / 2]
    if isinstance(value, int) and value >= 8:  # a size or a limit: try the boundaries too
        news += [b for b in BOUNDARIES if b not in news and b != value]
    return [_Edit(f"constant {value!r} → {new!r}", node, repr(new)) for new in news]


def _call_edits(node: ast.Call) -> list[_Edit]:
    edits = []
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in CASTS | COPIES:
        kind = "dtype cast" if func.attr in CASTS else "copy"
        edits.append(_Edit(f"{kind} `.{func.attr}()` dropped", node, _u(func.value)))
    for i, kw in enumerate(node.keywords):
        if kw.arg == "dtype":
            kept = ast.Call(func, node.args, node.keywords[:i] + node.keywords[i + 1:])
            edits.append(_Edit("`dtype=` dropped", node, _u(kept)))
    return edits


def _statement_edits(node: ast.stmt) -> list[_Edit]:
    if isinstance(node, ast.Raise):
        return [_Edit("`raise` dropped", node, "pass")]
    if isinstance(node, ast.Expr) and not isinstance(node.value, ast.Constant):
        return [_Edit("statement dropped", node, "pass")]
    if isinstance(node, (ast.AugAssign, ast.Assign)) and \
            any(isinstance(t, (ast.Attribute, ast.Subscript)) for t in getattr(node, "targets", [getattr(node, "target", None)])):
        return [_Edit("store dropped", node, "pass")]
    if isinstance(node, ast.Return) and node.value is not None:
        values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
        tensors = (ast.Name, ast.Call, ast.Attribute, ast.Subscript, ast.BinOp)
        return [_Edit("dtype cast `.float()` added", v, f"{_u(v)}.float()") for v in values if isinstance(v, tensors)]
    return []


def _edits(node: ast.AST) -> list[_Edit]:
    if isinstance(node, ast.Compare):
        return _compare_edits(node)
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        new = ast.BinOp(node.left, ast.parse(f"1 {BINARY[type(node.op)]} 1", mode="eval").body.op, node.right)
        return [_Edit(f"`{SYMBOL[type(node.op)]}` → `{BINARY[type(node.op)]}`", node, _u(new))]
    if isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        name = "`and` → `or`" if isinstance(node.op, ast.And) else "`or` → `and`"
        return [_Edit(name, node, _u(ast.BoolOp(other, node.values)))]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return [_Edit("`not` dropped", node, _u(node.operand))]
    if isinstance(node, ast.Constant):
        return _number_edits(node)
    if isinstance(node, ast.Call):
        return _call_edits(node)
    if isinstance(node, (ast.If, ast.While, ast.IfExp)) and isinstance(node.test, ast.Compare) \
            and len(node.test.ops) == 1 and isinstance(node.test.comparators[0], ast.Constant) \
            and node.test.comparators[0].value is None:
        left = _u(node.test.left)
        new = left if isinstance(node.test.ops[0], ast.IsNot) else f"not {left}"
        return [_Edit(f"`is {'not ' if new == left else ''}None` → truthiness", node.test, new)]
    if isinstance(node, ast.Slice):
        return [_Edit(f"slice {side} {sign}1", bound, f"{_u(bound)} {sign} 1")
                for side, bound in (("start", node.lower), ("stop", node.upper)) if bound is not None
                for sign in "+-"]
    if isinstance(node, ast.stmt):
        return _statement_edits(node)
    return []


def _offsets(source: bytes) -> list[int]:
    starts, at = [0], 0
    for line in source.splitlines(True):
        at += len(line)
        starts.append(at)
    return starts


def _apply(source: bytes, starts: list[int], edit: _Edit) -> str:
    n = edit.node
    begin = starts[n.lineno - 1] + n.col_offset
    end = starts[n.end_lineno - 1] + n.end_col_offset
    text = edit.text if isinstance(n, ast.stmt) else f"({edit.text})"
    return (source[:begin] + text.encode() + source[end:]).decode()


class _top_level:
    """The module's top-level statements, to tell whether a mutated module parses to the original.

    An edit changes the text of one top-level statement only, so the mutant equals the original
    exactly when it has as many top-level statements and that one dumps the same (``ast.dump``
    leaves out positions, so the shifted statements after it compare equal as they are). One
    statement's dump instead of the module's: the mutants of a reference in a tenth of the time.
    """

    def __init__(self, tree: ast.Module):
        self.body = tree.body
        self.dumps = [ast.dump(s) for s in tree.body]
        self.first = [min([s.lineno] + [d.lineno for d in getattr(s, "decorator_list", [])]) for s in tree.body]

    def unchanged(self, mutated: ast.Module, line: int) -> bool:
        if len(mutated.body) != len(self.body):
            return False
        i = max(j for j, first in enumerate(self.first) if first <= line)
        return ast.dump(mutated.body[i]) == self.dumps[i]


def mutants(source: str) -> list[Mutant]:
    """Every mutant of ``source`` that parses and differs from it, in source order."""
    return list(_mutants(source))


@functools.lru_cache(maxsize=32)  # one process asks for the same reference's mutants again (tests, runs)
def _mutants(source: str) -> tuple[Mutant, ...]:
    tree = ast.parse(source)
    skip, raw, lines = _skipped(tree), source.encode(), source.splitlines()
    starts, top = _offsets(raw), _top_level(tree)
    found, seen = [], {}
    nodes = sorted((n for n in ast.walk(tree) if hasattr(n, "lineno") or isinstance(n, ast.Slice)),
                   key=lambda n: (n.lineno, n.col_offset))
    for node in nodes:
        if id(node) in skip:
            continue
        for edit in _edits(node):
            text = _apply(raw, starts, edit)
            try:
                if top.unchanged(ast.parse(text), edit.node.lineno):
                    continue
            except SyntaxError:
                continue
            line = lines[edit.node.lineno - 1].strip()
            base = f"{edit.operator}: {line}"
            seen[base] = seen.get(base, 0) + 1
            ident = base if seen[base] == 1 else f"{base} #{seen[base]}"
            found.append(Mutant(ident, edit.operator, edit.node.lineno, text))
    return tuple(found)
