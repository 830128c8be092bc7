"""The learner's side of ``kvkata grade``: one submission × kata, in a process of its own.

``python -m grader.classroom.cohort.worker SPEC.json`` — started by grader.classroom.cohort.sandbox, never by hand. It

1. limits the size of any file it writes, and core dumps;
2. imports torch, the kata's checks and the reference; then raises the kernel's walls where the
   grader found them (grader.classroom.cohort.confine: from here on it can read nothing of the
   repository but the grader's code, write nothing but its records and scratch folder, reach no
   network, process or file of anyone else), and warms the device up;
3. takes a snapshot of the grader's, torch's and the builtins' functions, and installs an audit
   hook (which cannot be removed): it writes only inside its sandbox, never reads solutions/, the
   mistake catalogue or other submissions, starts no process, signals no other process, uses no
   ctypes, tracing, heap walking or network;
4. writes ``out/ready.pt``: from here on, whatever goes wrong is the submission's doing. A worker
   that dies before it could not even start, and the parent reports that as the grader's error;
5. caps its address space at what it maps now plus the memory budget, so the budget limits what
   the learner's code allocates, not torch's own libraries (the CUDA build maps gigabytes at
   import); on a CUDA device the learner's device memory is capped at the budget too;
6. imports the learner's file (a copy in the sandbox) and runs every check with a RecordingCtx,
   writing one record a check into ``out/`` (plain data, see grader.engine.plain), with what the audit hook
   and the snapshot found.

Nothing here decides a grade: the parent replays the records against the reference (grader.classroom.cohort.replay).
"""
from __future__ import annotations

import itertools
import json
import operator
import os
import resource
import signal
import sys
import time
import types
from pathlib import Path

from grader.classroom.cohort import confine

FORBIDDEN = {
    "subprocess.Popen": "started a process", "os.system": "started a process", "os.exec": "started a process",
    "os.posix_spawn": "started a process", "os.spawn": "started a process", "os.fork": "started a process",
    "os.forkpty": "started a process", "pty.spawn": "started a process",
    "ctypes.dlopen": "used ctypes", "ctypes.dlsym": "used ctypes", "ctypes.dlsym/handle": "used ctypes",
    "ctypes.cdata": "used ctypes", "ctypes.cdata/buffer": "used ctypes",
    "sys.settrace": "installed a tracer", "sys.setprofile": "installed a profiler",
    "gc.get_objects": "walked the heap", "gc.get_referrers": "walked the heap", "gc.get_referents": "walked the heap",
    "socket.connect": "used the network", "socket.bind": "used the network", "socket.getaddrinfo": "used the network",
    "os.chdir": "changed the working folder", "os.fchdir": "changed the working folder",
}
PATH_EVENTS = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1, "os.utime": 1,
               "os.truncate": 1, "os.rename": 2, "os.link": 2, "os.symlink": 2, "shutil.rmtree": 1,
               "shutil.copyfile": 2, "shutil.copytree": 2, "shutil.move": 2}
_GONE = object()
RECORD_MARGIN = 1.0  # seconds kept, of a kata's time, to write the record of a check that ran out of time
CACHES = {"__slotnames__"}  # attributes Python itself caches on classes (copyreg, when pickling)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
WATCHED_MODULES = ("torch", "torch.nn", "torch.nn.functional", "torch.functional", "torch.serialization", "builtins",
                   "math", "operator", "numbers", "inspect", "traceback", "copy", "functools", "os", "os.path", "io",
                   "json", "signal", "hypothesis", "hypothesis.core", "hypothesis.control")


def limit_files(spec: dict) -> None:
    """File size and core dumps, soft and hard (the learner's code cannot raise them)."""
    if spec.get("file_mb"):
        size = int(spec["file_mb"]) * 2**20
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails instead of killing


def mapped_bytes() -> int | None:
    """The address space this process maps now (Linux: VmSize), or None where it cannot be read."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def limit_memory(spec: dict, device) -> None:
    """Cap the address space at what is mapped now plus the budget (soft and hard, so the learner's
    code cannot raise it); on CUDA, cap the caching allocator at the budget as well."""
    budget = int(spec.get("memory_mb") or 0) * 2**20
    if not budget:
        return
    if device.type == "cuda":
        import torch

        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), device)
    mapped = mapped_bytes()
    if mapped is not None:
        resource.setrlimit(resource.RLIMIT_AS, (mapped + budget, mapped + budget))


# -- the snapshot ---------------------------------------------------------------------------
def snapshot() -> list[tuple[str, object, tuple, tuple, frozenset | None]]:
    """(owner name, owner, attributes, their values, and for a class the names it has, else None) of
    every function, class and module the grading relies on."""
    import torch

    owners = [(n, m) for n, m in list(sys.modules.items()) if n == "grader" or n.startswith("grader.")]
    owners += [(n, sys.modules[n]) for n in WATCHED_MODULES if n in sys.modules]
    classes = {torch.Tensor, torch._C.TensorBase, torch.nn.Module, torch.nn.Linear, torch.nn.Parameter}
    groups = []
    for name, owner in owners:
        kept = {}
        for attr, value in list(vars(owner).items()):
            if callable(value) or isinstance(value, types.ModuleType):
                kept[attr] = value
            if isinstance(value, type) and str(getattr(value, "__module__", "")).startswith(("grader", "torch")):
                classes.add(value)
            if attr == "CHECKS" and hasattr(value, "all"):
                groups.append((f"{name}.CHECKS", value, ("all",), (value.all,), None))
                groups += [(f"{name}.{c.id}", c, ("func",), (c.func,), None) for c in value.all]
        groups.append((name, owner, tuple(kept), tuple(kept.values()), None))
    for cls in classes:
        kept = dict(vars(cls))
        groups.append((cls.__qualname__, cls, tuple(kept), tuple(kept.values()), frozenset(kept)))
    return groups


def changed(groups, vars=vars, all=all, map=map, zip=zip, is_=operator.is_,
            gone=itertools.repeat(_GONE)) -> list[str]:
    """What differs from the snapshot: replaced or removed functions, attributes added to classes (an
    owner is compared at C speed, spelled out only when changed; helpers bound now, patched never)."""
    found = []
    for name, owner, attrs, values, names in groups:
        now = vars(owner)
        if names is not None and now.keys() != names:
            added = {a for a in set(now) - names if a not in CACHES and not a.startswith("_abc_")}
            found += [f"added {name}.{a}" for a in sorted(added)]
        if not all(map(is_, map(now.get, attrs, gone), values)):
            found += [f"replaced {name}.{attr}" for attr, value in zip(attrs, values)
                      if now.get(attr, _GONE) is not value]
    return found


def code_snapshot(groups) -> tuple[list, list, list]:
    """(functions, their code, their defaults) of every function in the snapshot: swapping a function's
    ``__code__`` or defaults leaves its identity, so the snapshot alone would not see it."""
    functions = [v for _, _, _, values, _ in groups for v in values if isinstance(v, types.FunctionType)]
    functions = list({id(f): f for f in functions}.values())
    return functions, [f.__code__ for f in functions], [(f.__defaults__, f.__kwdefaults__) for f in functions]


def code_changed(saved, is_=operator.is_, code=operator.attrgetter("__code__"), map=map, all=all) -> list[str]:
    functions, codes, defaults = saved
    if all(map(is_, map(code, functions), codes)) and \
            all(f.__defaults__ is d[0] and f.__kwdefaults__ is d[1] for f, d in zip(functions, defaults)):
        return []
    return [f"replaced the code of {f.__module__}.{f.__qualname__}" for f, c, d in zip(functions, codes, defaults)
            if f.__code__ is not c or f.__defaults__ is not d[0] or f.__kwdefaults__ is not d[1]]


# -- the audit hook -------------------------------------------------------------------------
def _on_stack(filename: str, getframe=sys._getframe):
    """A test: is code from ``filename`` anywhere on the calling stack?"""
    def test() -> bool:
        frame = getframe(2)
        while frame is not None:
            if frame.f_code.co_filename == filename:
                return True
            frame = frame.f_back
        return False
    return test


def _paths(cwd: str, join=os.path.join, norm=os.path.normpath, fspath=os.fspath, sep=os.sep):
    """(resolve, inside): absolute paths as the hook sees them, and containment."""
    def resolve(path):
        if isinstance(path, int) or path is None:
            return None
        path = fspath(path)
        return norm(join(cwd, path.decode(errors="replace") if isinstance(path, bytes) else path))

    def inside(path, roots) -> bool:
        return path is not None and any(path == r or path.startswith(r + sep) for r in roots)
    return resolve, inside


def audit_hook(spec: dict, guard: "Guard"):
    """The hook: paths are judged whoever touches them (only the worker's own saving may write its
    records); the other events only when the learner's code is on the stack (Hypothesis, for one,
    calls gc.get_referrers). Helpers are bound now, so patching them later changes nothing."""
    resolve, inside = _paths(os.getcwd())
    learner_on_stack, own = _on_stack(spec["label"]), (os.getpid(), os.getpgid(0))
    allowed, records = (spec["sandbox"], "/dev/null"), (os.path.join(spec["sandbox"], "out"),)

    def refuse(why: str, tamper: bool):
        if tamper:
            guard.caught(why)
        raise PermissionError(f"kvkata grading: not allowed here: {why}")

    def write(path):
        if inside(path, records) and not guard.saving:
            refuse(f"wrote the grader's records ({path})", True)
        if path is not None and not inside(path, allowed):
            refuse(f"wrote {path}", inside(path, spec["guarded"]))

    def hook(event, args):
        if event == "open":
            path, mode, flags = resolve(args[0]), args[1], args[2]
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & WRITE_FLAGS):
                write(path)
            elif inside(path, spec["secret"]) and not inside(path, allowed):
                refuse(f"read {path}", True)
        elif event in PATH_EVENTS:
            for arg in args[:PATH_EVENTS[event]]:
                write(resolve(arg))
        elif event in FORBIDDEN and learner_on_stack():
            refuse(f"{FORBIDDEN[event]} ({event})", True)
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill") and args and args[0] not in own:
            refuse(f"sent a signal to process {args[0]} ({event})", True)
    return hook


class Guard:
    """What the learner's process may do (the audit hook), and what it was caught doing."""

    def __init__(self, spec: dict):
        self.found: list[str] = []
        self.saving = False
        self.entries = snapshot()
        self.codes = code_snapshot(self.entries)
        # what it caught is also written at once, so an exit right after a refusal still shows it
        self.log = os.open(os.path.join(spec["out"], "tamper.txt"), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        sys.addaudithook(audit_hook(spec, self))

    def caught(self, why: str) -> None:
        self.found.append(why)
        try:
            os.write(self.log, (why.replace("\n", " ") + "\n").encode("utf-8", errors="replace"))
        except OSError:
            pass

    def report(self) -> list[str]:
        return sorted(set(self.found + changed(self.entries) + code_changed(self.codes)))

    def save(self, path: Path, data: dict) -> None:
        """Write a record (plain data) with what was found so far; only this may write records. In
        place: the record files exist beforehand, and the kernel's walls let the worker write those only."""
        import torch

        data["tamper"] = self.report()
        self.saving = True
        try:
            torch.save(data, path)
        finally:
            self.saving = False


# -- running --------------------------------------------------------------------------------
def hidden_reference(kata):
    """The reference, loaded before the learner's code and then dropped from sys.modules and
    linecache, where the learner's code could have picked it up."""
    import linecache

    from grader.engine import targets

    reference = targets.reference(kata)
    for name in [n for n in sys.modules if n.startswith("kvkata_target_")]:
        del sys.modules[name]
    linecache.cache.pop(reference.filename, None)
    return reference


def warm_up(device) -> None:
    """Run the kinds of ops checks use once, so lazy loading happens before the audit hook."""
    import torch

    x = torch.randn(4, 4, device=device, dtype=torch.float64)
    torch.softmax(x @ x.T, dim=-1).float().sum().item()
    torch.nn.Linear(4, 4, bias=False).to(device)(x.float()).sum().item()


def check_limit(spec: dict, began: float) -> float:
    """Seconds the next check may run: its own limit, within what is left of the kata's (less a moment
    to write its record)."""
    left = spec["timeout"] - (time.monotonic() - began) - RECORD_MARGIN
    return max(0.1, min(spec.get("check_timeout") or spec["timeout"], left))


def run_checks(spec: dict, target, reference, device, kata_checks, guard: Guard, began: float) -> None:
    from grader.engine import run_check
    from grader.classroom.cohort.record import RecordingCtx

    out = Path(spec["out"])
    for index, check in enumerate(kata_checks):
        ctx = RecordingCtx(target, reference, device, spec["seed"])
        try:
            result = run_check(check, ctx, (), check_limit(spec, began))
            status, message = result.status, result.message
        except BaseException as exc:  # e.g. the learner's code raised KeyboardInterrupt
            status, message = "fail", f"while this check ran, your code raised {type(exc).__name__}: {exc}"
        guard.save(out / f"check-{index:03d}.pt",
                   {"check": check.id, "status": status, "message": message, "executions": ctx.executions})


def grade(spec: dict) -> int:
    """Everything after the start: the grader's preparations, then the learner's file and the checks."""
    limit_files(spec)
    import torch

    from grader import checks, manifest
    from grader.engine import CheckTimeout, report, targets, time_limit

    torch.set_num_threads(int(spec.get("threads", 1)))
    kata = manifest.get(spec["kata"])
    device = torch.device(spec["device"])
    reference = hidden_reference(kata)
    kata_checks = list(checks.for_kata(kata.id).all)
    confine.confine(spec)
    warm_up(device)
    guard = Guard(spec)
    out, label = Path(spec["out"]), spec["label"]
    guard.save(out / "ready.pt", {})
    began = time.monotonic()
    limit_memory(spec, device)
    try:
        source = Path(spec["file"]).read_text(encoding="utf-8", errors="replace")
        limit = check_limit(spec, began)
        with time_limit(limit):
            target = targets.from_source(source, label, label)
    except BaseException as exc:  # a syntax error, or an import that raised, looped or even called sys.exit
        if isinstance(exc, CheckTimeout):
            reason = report.IMPORT_TIMED_OUT.format(label=label, seconds=limit)
        else:
            reason = str(exc) if isinstance(exc, targets.TargetLoadError) else \
                f"importing {label} raised {type(exc).__name__}: {exc}"
        guard.save(out / "load.pt", {"error": reason})
        return 0
    run_checks(spec, target, reference, device, kata_checks, guard, began)
    guard.save(out / "done.pt", {})
    return 0


def _read_spec(path: str) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _leave(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no atexit handler or finalizer of the learner's runs after the records


def forked(spec_path: str) -> None:
    """A worker forked from grader.classroom.cohort.sandbox's warm server, already in its sandbox: grade, then leave
    as the fresh process would."""
    code = 1
    try:
        code = grade(_read_spec(spec_path))
    except BaseException:
        import traceback

        traceback.print_exc()
    _leave(code)


if __name__ == "__main__":
    _leave(grade(_read_spec(sys.argv[1])))
