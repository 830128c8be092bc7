"""What a worker watches in its own process, beneath the kernel's walls (grader.classroom.cohort.confine):
an audit hook that refuses, and explains to an honest learner, what grading forbids (writing outside the
sandbox, reading the references, processes, ctypes, heap walking, the network), and a snapshot of the
functions grading relies on, compared after the learner's code ran (replaced, added, or their code
swapped). What it catches makes the row 'tampered'; the kernel is what refuses.
"""
from __future__ import annotations

import itertools
import operator
import os
import sys
import types
from pathlib import Path

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
CACHES = {"__slotnames__"}  # attributes Python itself caches on classes (copyreg, when pickling)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
WATCHED_MODULES = ("torch", "torch.nn", "torch.nn.functional", "torch.functional", "torch.serialization", "builtins",
                   "math", "operator", "numbers", "inspect", "traceback", "copy", "functools", "os", "os.path", "io",
                   "json", "signal", "hypothesis", "hypothesis.core", "hypothesis.control")


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
