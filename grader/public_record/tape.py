"""The public record of a kata: what a handout's checks need from the reference, as data.

A handout has no reference solution and no mistake catalogue, yet its checks should run there
with the same messages and mistake names as in the full repository. ``kvkata assign`` therefore
runs every check once on the reference, with the public seed (not the seed of the instructor's
grading), and writes down (``record``):

- the inputs each ``forall`` and ``case`` call of each check ran, in order;
- per input, the value ``ctx.differential`` got from the reference, and every question the check
  put to the reference directly (a function call, a class built, a method called, an attribute
  read) with its answer, in the order asked;
- per known mistake, what each check's body did on each of those inputs (pass, or the failure
  and what the mistake's code produced), so a handout names mistakes without their code.

Everything is plain data (grader.engine.plain), saved as grader.public_record.tape_keys writes it
(``torch.save`` with equal tensors kept once, then xz) and read back with ``weights_only=True``.
A handout replays it with grader.public_record.public, which shares only
grader.public_record.tape_keys with this module: the recorder needs the references and the known
mistakes, which a handout does not have.
"""
from __future__ import annotations

import inspect
import time
from pathlib import Path

import torch

from grader import checks, manifest, mistakes, state
from grader.engine import diagnosis, targets
from grader.engine import report
from grader.engine.plain import NotPlain, describe_exception, observation, opaque, plain
from grader.public_record.tape_keys import PUBLIC_SEED, SUFFIX, VERSION, encode, entry_key, fingerprint
from grader.engine import Ctx, GraderBug, run_check
from grader.runtime import single_thread

RECORD_SECONDS = 10.0  # one body of a known mistake on one input (diagnosis allows the same)


class Recorder(Ctx):
    """Runs a kata's checks on the reference and writes down what a handout will need."""

    def __init__(self, reference: targets.Target, device="cpu", seed: int = PUBLIC_SEED):
        super().__init__(reference, reference, device, seed)
        self.raw_ref = self.ref
        self.ref = _RecordingRef(self)
        self.examples: dict[str, list] = {}  # "check/number" -> inputs in the order run
        self.entries: dict[str, dict] = {}
        self.names: dict[str, dict] = {}  # reference names the checks used directly, and what they are
        self.entry: dict | None = None
        self.objects = 0
        self.unplain: dict[str, str] = {}  # check -> why it cannot be replayed from data

    def forall(self, strategy, body, max_examples: int = 20) -> None:
        super().forall(strategy, self._recorded(self.calls + 1, body), max_examples)

    def case(self, example, body) -> None:
        super().case(example, self._recorded(self.calls + 1, body))

    def _recorded(self, number: int, body):
        def recorded(ctx, example):
            if ctx is not self:
                return body(ctx, example)
            listed = self.examples.setdefault(f"{self.running}/{number}", [])
            if all(repr(e) != repr(example) for e in listed):
                listed.append(self._plain_input(example))
            outer, self.entry = self.entry, {"expected": [], "ops": []}
            try:
                body(ctx, example)
                self.entries.setdefault(entry_key(str(self.running), number, example), self.entry)
            finally:
                self.entry = outer
        return recorded

    def _plain_input(self, example):
        try:
            return plain(example)
        except NotPlain as exc:
            self.unplain.setdefault(str(self.running), f"an input holds {exc}")
            return example

    def differential(self, example: dict, run, what: str = "") -> None:
        self.expected(example, run, what)  # the target here is the reference: nothing to compare
        self.exact(example, run, what)  # a handout needs it where the learner's result misses the floor

    def exact(self, example: dict, run, what: str = ""):
        """The float64 run (grader.engine.precision), written down beside the last expected value."""
        entry, self.entry = self.entry, None
        self.ref = self.raw_ref
        try:
            exact = Ctx.exact(self, example, run, what)
        finally:
            self.entry, self.ref = entry, _RecordingRef(self)
        if entry is not None:
            entry.setdefault("exact", []).extend([None] * (len(entry["expected"]) - 1 - len(entry.get("exact", []))))
            entry["exact"].append(None if exact is None else observation(exact))
        return exact

    def expected(self, example: dict, run, what: str = ""):
        """The reference's answer, written down for the handout (which replays it as ``expected``)."""
        entry, self.entry = self.entry, None  # the reference runs whole here: its inner calls are not questions
        try:
            expected = run(self.raw_ref, example)
            again = run(self.raw_ref, example)
        except BaseException as exc:
            raise GraderBug(f"the reference failed on {example!r}: {exc!r}") from exc
        finally:
            self.entry = entry
        seen = observation(expected)
        if opaque(seen):
            self.unplain.setdefault(str(self.running), f"the reference returned {opaque(seen)}")
        if report.compare(expected, again):
            raise GraderBug(f"the reference gives different results on the same input {example!r}: "
                            "its results cannot be recorded")
        if entry is not None:
            entry["expected"].append(seen)
        return expected

    def note(self, op: dict) -> None:
        if self.entry is not None:
            self.entry["ops"].append(op)


class _RecordingRef:
    """The reference's names as the checks see them while recording: every direct question noted."""

    def __init__(self, ctx: Recorder):
        self._ctx = ctx

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(self._ctx.raw_ref, name)
        if inspect.isclass(value) and issubclass(value, BaseException):
            bases = [c.__name__ for c in value.__mro__ if c.__module__ == "builtins"]
            self._ctx.names[name] = {"kind": "exception", "bases": bases}
            return value
        if inspect.isclass(value) or inspect.isfunction(value) or inspect.isbuiltin(value):
            self._ctx.names[name] = {"kind": "callable"}
            return _RecordingCallable(self._ctx, None, name, value)
        self._ctx.names[name] = {"kind": "value", "value": observation(value)}
        return value


class _RecordingCallable:
    def __init__(self, ctx: Recorder, on: int | None, name: str, fn):
        self._ctx, self._on, self._name, self._fn = ctx, on, name, fn

    def __call__(self, *args, **kwargs):
        real_args = [_unwrap(a) for a in args]
        real_kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
        op = {"op": "call", "on": self._on, "name": self._name, "args": fingerprint([list(args), kwargs])}
        try:
            result = self._fn(*real_args, **real_kwargs)
        except Exception as exc:
            op["raised"] = describe_exception(exc, self._ctx.reference)
            self._ctx.note(op)
            raise
        return _answer(self._ctx, op, result)


class _RecordingObject:
    """An object the reference built: its attributes and methods are questions too."""

    def __init__(self, ctx: Recorder, handle: int, obj):
        self._tape_handle, self._ctx, self._obj = handle, ctx, obj

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(self._obj, name)
        if callable(value) and not isinstance(value, torch.Tensor):
            self._ctx.note({"op": "get", "on": self._tape_handle, "name": name, "method": True})
            return _RecordingCallable(self._ctx, self._tape_handle, name, value)
        return _answer(self._ctx, {"op": "get", "on": self._tape_handle, "name": name}, value)


def _unwrap(value):
    return value._obj if isinstance(value, _RecordingObject) else value


def _answer(ctx: Recorder, op: dict, value):
    """Note ``op`` with ``value`` as its answer; an object that is not data gets a handle."""
    try:
        op["result"] = plain(value)
    except NotPlain:
        ctx.objects += 1
        op["object"] = ctx.objects
        ctx.note(op)
        return _RecordingObject(ctx, ctx.objects, value)
    ctx.note(op)
    return value


# -- the record of a kata ---------------------------------------------------------------------------
_MADE: dict[tuple, dict] = {}  # one process makes a kata's record once (the same sources, the same record)


def record(kata_id: str, device="cpu", seed: int = PUBLIC_SEED, progress=None) -> dict:
    """Run the kata's checks on the reference and its known mistakes; the public record as data."""
    key = (kata_id, str(device), seed)
    if key not in _MADE:
        _MADE[key] = _record(kata_id, device, seed, progress)
    return _MADE[key]


def _record(kata_id: str, device, seed: int, progress) -> dict:


    single_thread()
    kata = manifest.get(kata_id)
    reference = targets.reference(kata)
    recorder = Recorder(reference, device, seed)
    public, withheld = [], {}
    for check in checks.for_kata(kata.id).all:
        result = run_check(check, recorder, (), None)
        if not result.passed:
            withheld[check.id] = f"the reference does not pass it with the public seed: {result.message[:300]}"
        elif check.id in recorder.unplain:
            withheld[check.id] = recorder.unplain[check.id]
        else:
            public.append(check.id)
    catalogue = mistakes.load(kata.id)
    outcomes = {}
    for index, (mistake, target) in enumerate(catalogue):
        if progress:
            progress(f"kata {kata.id}: recording known mistake {index + 1}/{len(catalogue)} ({mistake.name})")
        outcomes[mistake.name] = _outcomes(kata, recorder, target, public)
    return {"version": VERSION, "kata": kata.id, "seed": seed, "made": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "checks": [c.id for c in checks.for_kata(kata.id).all], "public": public, "withheld": withheld,
            "examples": {k: v for k, v in recorder.examples.items() if k.split("/")[0] in public},
            "entries": {k: v for k, v in recorder.entries.items() if k.split("/")[0] in public},
            "names": recorder.names,
            "mistakes": [{"name": m.name, "why": m.why, "hint": m.hint} for m, _ in catalogue],
            "outcomes": outcomes}


def _outcomes(kata, recorder: Recorder, target, public: list[str]) -> dict:
    """What a known mistake's code did in each body of each public check, on each recorded input."""
    ctx = Ctx(target, recorder.reference, recorder.device, recorder.seed)
    found = {}
    for check in checks.for_kata(kata.id).all:
        if check.id not in public:
            continue
        ctx.running = check.id
        for site in diagnosis.sites(check, ctx):
            for example in recorder.examples.get(f"{check.id}/{site.number}", []):
                did = diagnosis.outcome(ctx, site.body, example, RECORD_SECONDS)
                found[entry_key(check.id, site.number, example)] = _plain_outcome(did)
    return found


def _plain_outcome(did):
    if did is None:
        return None
    if did[0] == "fail":
        return ["fail", observation(did[1]) if did[1] is not diagnosis.UNSET else {"unset": True}, str(did[2])]
    return [str(part) for part in did]


def share(tape: dict) -> dict:
    """How much of the kata the public record covers: public checks of all, and the known mistakes
    that fail at least one public check on the recorded inputs."""
    caught = sum(any(found is not None and found[0] != "pass" for found in outcomes.values())
                 for outcomes in tape["outcomes"].values())
    return {"public": len(tape["public"]), "checks": len(tape["checks"]), "caught": caught,
            "mistakes": len(tape["mistakes"])}


def save(folder: Path, tape: dict) -> Path:
    """Write the kata's record into ``folder`` (a handout's grader/public) as its file; the file's path."""
    path = folder / f"{tape['kata']}{SUFFIX}"
    state.write_atomic(path, encode(tape))
    return path
