"""The learner's side of ``kvkata grade``: one submission × kata, in a process of its own.

``python -m grader.classroom.cohort.worker SPEC.json`` — started by grader.classroom.cohort.sandbox, never by hand. It

1. limits the size of any file it writes, and core dumps;
2. imports torch, the kata's checks and the reference; then raises the kernel's walls where the
   grader found them (grader.classroom.cohort.confine: from here on it can read nothing of the
   repository but the grader's code, write nothing but its records and scratch folder, reach no
   network, process or file of anyone else), and warms the device up;
3. takes a snapshot of the grader's, torch's and the builtins' functions, and installs an audit
   hook (grader.classroom.cohort.guard) (which cannot be removed): it writes only inside its sandbox, never reads solutions/, the
   mistake catalogue or other submissions, starts no process, signals no other process, uses no
   ctypes, tracing, heap walking or network;
4. writes ``out/ready.pt``: from here on, whatever goes wrong is the submission's doing. A worker
   that dies before it could not even start, and the parent reports that as the grader's error;
5. caps its address space at what it maps now plus the memory budget, so the budget limits what
   the learner's code allocates, not torch's own libraries (the CUDA build maps gigabytes at
   import); on a CUDA device the learner's device memory is capped at the budget too; where the grader
   made it a control group (grader.classroom.cohort.cgroups), it joined that group before step 2's walls,
   and the group's ceiling holds it and every process it starts together;
6. imports the learner's file (a copy in the sandbox) and runs every check with a RecordingCtx,
   writing one record a check into ``out/`` (plain data, see grader.engine.plain), with what the audit hook
   and the snapshot found.

Nothing here decides a grade: the parent replays the records against the reference (grader.classroom.cohort.replay).
"""
from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from pathlib import Path

from grader.classroom.cohort import cgroups, confine
from grader.classroom.cohort.guard import Guard

RECORD_MARGIN = 1.0  # seconds kept, of a kata's time, to write the record of a check that ran out of time
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
    cgroups.join(spec.get("cgroup"), int(spec.get("memory_mb") or 0) * 2**20)  # while it may still write there
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
