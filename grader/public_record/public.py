"""Public checks: a handout's checks, run on the learner's code from the kata's public record.

The record (grader.public_record.tape) holds, for the public seed, the inputs each check runs, what the
reference answered on them and what each known mistake did. ``PublicCtx`` runs the checks' own
code on the learner's code: ``forall`` walks the recorded inputs in their order (no shrinking: a
smaller input would have no recorded answer), ``differential`` compares with the recorded value,
and ``ctx.ref`` answers from the record, question by question. Mistakes are named by the same
rules as in the full repository (grader.engine.diagnosis), from what they were recorded doing.

A check whose answers could not be written down as data is not public: it is not run here, and
the header says how many ran.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache

import torch

from grader import manifest
from grader.engine.plain import exception_class, rebuild_exception
from grader.public_record.records import record_path
from grader.public_record.tape_keys import PUBLIC_SEED, entry_key, fingerprint
from grader.engine.core import UNSET, Ctx, Failure, GraderBug, Unrecorded, _site, run_body
from grader.engine.targets import Target

HEADER = ("public checks: {n} of {m}; your instructor's grading runs all {m}, on inputs you have not seen")
OFF_RECORD = ("your code's results led this check to ask the reference something its public record does not hold "
              "({why}): your code behaves differently from the reference before this point")
STALE = ("the public record of kata {kata} has no entry for this input; the handout's grader and its record "
         "do not match (not your fault: ask your instructor for a fresh handout)")


@dataclass(frozen=True)
class KnownMistake:
    """A catalogue entry as a handout knows it: the name and advice, not the code."""

    name: str
    why: str
    hint: str


@lru_cache(maxsize=None)
def load(kata_id: str) -> dict | None:
    """The kata's public record, or None where there is none (the full repository)."""
    path = record_path(kata_id)
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def active(kata_id: str) -> bool:
    """Whether this kata is graded from its public record (a handout) rather than its reference."""
    return load(kata_id) is not None and not (manifest.REPO_ROOT / manifest.get(kata_id).solution).is_file()


def checks_of(kata_id: str, all_checks: list) -> list:
    """The checks that run here: all of them in the full repository, the public ones in a handout."""
    if not active(kata_id):
        return list(all_checks)
    public = set(load(kata_id)["public"])
    return [c for c in all_checks if c.id in public]


def header(kata_id: str, total: int) -> str:
    return HEADER.format(n=len(load(kata_id)["public"]), m=total)


def known_mistakes(kata_id: str, tape: dict | None = None) -> tuple:
    """(mistake, None) pairs, as grader.mistakes.load gives (mistake, target) pairs."""
    tape = tape if tape is not None else load(kata_id)
    return tuple((KnownMistake(m["name"], m["why"], m["hint"]), None) for m in tape["mistakes"])


def _to(value, device: torch.device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [_to(v, device) for v in value]
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


class PublicCtx(Ctx):
    """Runs a kata's checks on the learner's code against the kata's public record."""

    def __init__(self, target: Target, kata_id: str, device, tape: dict | None = None):
        super().__init__(target, Target("the public record", f"<public record {kata_id}>", {}), device, PUBLIC_SEED)
        self.kata_id = kata_id
        self.tape = tape if tape is not None else load(kata_id)
        self.ref = _RecordedRef(self)
        self.cursor: _Cursor | None = None

    def with_target(self, target: Target, site=None) -> "PublicCtx":
        return PublicCtx(target, self.kata_id, self.device, self.tape)

    # -- inputs: the recorded ones, in order ----------------------------------------------------
    def forall(self, strategy, body, max_examples: int = 20) -> None:
        self.calls += 1
        number = self.calls
        seen = self.seen.setdefault(number, [])
        taped = self._taped(str(self.running), number, body)
        with _site(number):
            for example in self.examples_of(str(self.running), number):
                try:
                    run_body(self, taped, example)
                except Failure as failure:
                    seen.append((example, failure))
                    raise
                seen.append((example, None))

    def case(self, example, body) -> None:
        super().case(example, self._taped(str(self.running), self.calls + 1, body))

    def examples_of(self, check: str, number: int) -> list:
        return copy.deepcopy(self.tape["examples"].get(f"{check}/{number}", []))

    def learner_body(self, number: int, body, check: str):
        return self._taped(check, number, body)

    def _taped(self, check: str, number: int, body):
        def taped(ctx, example):
            if ctx is not self:
                return body(ctx, example)
            entry = self.tape["entries"].get(entry_key(check, number, example))
            if entry is None:
                if check == self.running:
                    raise GraderBug(STALE.format(kata=self.kata_id))
                raise Unrecorded()
            outer, self.cursor = self.cursor, _Cursor(entry, self)
            try:
                body(ctx, example)
            finally:
                self.cursor = outer
        return taped

    # -- the reference's answers --------------------------------------------------------------
    def expected(self, example: dict, run, what: str = ""):
        """The reference's answer, from the record (``differential`` compares the learner's with it)."""
        expected = self.cursor.expected() if self.cursor is not None else None
        if expected is None:
            raise GraderBug(STALE.format(kata=self.kata_id))
        return expected

    def exact(self, example: dict, run, what: str = ""):
        """The float64 run beside the expected value just handed out, from the record (None where there is none)."""
        return self.cursor.exact() if self.cursor is not None else None

    def status_of(self, mistake: str, check: str):
        """A known mistake's verdict on a public check, from what it was recorded doing on the check's inputs."""
        found = [did for key, did in self.tape["outcomes"].get(mistake, {}).items() if key.startswith(f"{check}/")]
        if any(did is not None and did[0] != "pass" for did in found):
            return "fail"
        return "pass" if found and all(did is not None for did in found) else None

    def outcome_of(self, mistake: str, check: str, number: int, example):
        """What a known mistake did in that body on that input (as grader.engine.diagnosis.outcome says), or None."""
        found = self.tape["outcomes"].get(mistake, {}).get(entry_key(check, number, example))
        if found is None:
            return None
        if found[0] == "fail":
            observed = UNSET if found[1] == {"unset": True} else _to(copy.deepcopy(found[1]), self.device)
            return ("fail", observed, found[2])
        return tuple(found)


class _Cursor:
    """The recorded answers of one body run, handed out in the order they were asked."""

    def __init__(self, entry: dict, ctx: PublicCtx):
        self.entry, self.ctx = entry, ctx
        self.ops = entry.get("ops") or []
        self.next_op = self.next_expected = 0

    def expected(self):
        values = self.entry.get("expected") or []
        if self.next_expected >= len(values):
            return None
        self.next_expected += 1
        return _to(copy.deepcopy(values[self.next_expected - 1]), self.ctx.device)

    def exact(self):
        """The float64 result recorded beside the last expected value, or None."""
        values = self.entry.get("exact") or []
        index = self.next_expected - 1
        if not 0 <= index < len(values) or values[index] is None:
            return None
        return _to(copy.deepcopy(values[index]), self.ctx.device)

    def take(self, op: str, on, name: str, args=None) -> dict:
        """The next recorded question, which must be this one. A question asked again (a failing
        check describing what it expected) gets the answer it last had."""
        wanted = {"op": op, "on": on, "name": name}
        if args is not None:
            wanted["args"] = args

        def matches(found: dict) -> bool:
            return all(found.get(k) == v for k, v in wanted.items())

        if self.next_op < len(self.ops) and matches(self.ops[self.next_op]):
            self.next_op += 1
            return self.ops[self.next_op - 1]
        for found in reversed(self.ops[:self.next_op]):
            if matches(found) and "raised" not in found:
                return found
        what = f"{name}(…)" if op == "call" else name
        raise Failure(OFF_RECORD.format(why=f"question {self.next_op + 1}: {what}"), UNSET)


class _RecordedRef:
    """``ctx.ref`` in a handout: the names the checks used, answering from the record."""

    def __init__(self, ctx: PublicCtx):
        self._ctx = ctx

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        known = self._ctx.tape["names"].get(name)
        if known is None:
            raise GraderBug(STALE.format(kata=self._ctx.kata_id))
        if known["kind"] == "exception":
            return exception_class(name, known["bases"])
        if known["kind"] == "value":
            return copy.deepcopy(known["value"])
        return _RecordedCallable(self._ctx, None, name)


class _RecordedCallable:
    def __init__(self, ctx: PublicCtx, on, name: str):
        self._ctx, self._on, self.__name__ = ctx, on, name

    def __call__(self, *args, **kwargs):
        cursor = self._ctx.cursor
        if cursor is None:
            raise GraderBug(STALE.format(kata=self._ctx.kata_id))
        found = cursor.take("call", self._on, self.__name__, fingerprint([list(args), kwargs]))
        return _reply(self._ctx, found)


class _RecordedObject:
    def __init__(self, ctx: PublicCtx, handle: int):
        self._tape_handle, self._ctx = handle, ctx

    def __getattr__(self, name: str):
        if name.startswith("__") or name.startswith("_tape"):
            raise AttributeError(name)
        found = self._ctx.cursor.take("get", self._tape_handle, name)
        if found.get("method"):
            return _RecordedCallable(self._ctx, self._tape_handle, name)
        return _reply(self._ctx, found)


def _reply(ctx: PublicCtx, found: dict):
    if "raised" in found:
        raise rebuild_exception(found["raised"])  # the class ``ctx.ref.<name>`` gives, for a kata's own error
    if "object" in found:
        return _RecordedObject(ctx, found["object"])
    return _to(copy.deepcopy(found.get("result")), ctx.device)
