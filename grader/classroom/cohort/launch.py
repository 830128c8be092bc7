"""How workers are started and ended: the warm server (multiprocessing's forkserver, started with a clean
environment and stopped when grading ends), a worker forked from it (``Forked``), what the kernel offers
each worker (``walls``, probed once), and the sweep of whatever a worker left in its own namespace.
"""
from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader import manifest
from grader.classroom.cohort import cgroups, confine

WORKER = "grader.classroom.cohort.worker"  # the module each worker runs


def _environment(sandbox: Path) -> dict:
    """All a worker's environment: nothing of the instructor's but the paths to the interpreter's libraries."""
    paths = [str(manifest.PACKAGE_DIR.parent)] + [p for p in sys.path if p and os.path.isdir(p)]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TMPDIR": str(sandbox / "tmp"), "HOME": str(sandbox / "tmp"),
           "LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME") if k in os.environ})
    return env


_PROBED: list[dict] = []  # this process' probe of the kernel (confine.probe), made once


def walls() -> dict:
    """What the kernel offers every worker, probed once; said once on stderr where it is not everything."""
    if not _PROBED:
        _PROBED.append(confine.probe())
        found = _PROBED[0]
        found["drop"] = confine.can_drop(str(manifest.PACKAGE_DIR))
        found["cgroups"] = cgroups.probe()
        if not found["cgroups"]:
            print("kvkata: no control group of its own for each worker (a writable cgroup v1 memory and pids "
                  "hierarchy): the memory budget holds each process of a worker alone", file=sys.stderr)
        if os.geteuid() == 0 and not found["drop"]:
            print("kvkata: running as root, and the interpreter or its packages are not readable by other users: "
                  "the workers keep root's uid (the kernel's walls still hold)", file=sys.stderr)
        if found["isolation"] != confine.KERNEL:
            print(f"kvkata: isolation: {confine.AUDIT_ONLY} — {found['missing']}: each submission runs with an "
                  "audit hook and resource limits only, which a determined submission can get around", file=sys.stderr)
        elif found["missing"]:
            print(f"kvkata: isolation: {confine.KERNEL}, without {found['missing']}", file=sys.stderr)
    return _PROBED[0]


def needs_peers(kata: manifest.Kata) -> bool:
    """Whether the kata's checks start two processes joined over loopback (grader.checks.support.gloo)."""
    folder = manifest.PACKAGE_DIR / "checks"
    return any("support.gloo" in f.read_text(encoding="utf-8") or "import gloo" in f.read_text(encoding="utf-8")
               for f in folder.glob(f"k{kata.id}*.py"))


def _server_folders() -> list[str]:
    """The folder of the warm server's socket, which a worker must not reach."""
    from multiprocessing import forkserver

    address = getattr(forkserver._forkserver, "_forkserver_address", None)
    return [os.path.dirname(address)] if isinstance(address, str) and os.path.isabs(address) else []


class Forked:
    """A worker forked from the warm server, with the face of subprocess.Popen that ``wait`` uses."""

    def __init__(self, spec_path: Path, environment: dict):
        context = multiprocessing.get_context("forkserver")
        readable, writable = context.Pipe(duplex=False)
        # daemon: a worker still alive when this process exits is killed, never waited for
        self.process = context.Process(target=_forked_worker, args=(WORKER, str(spec_path), writable, environment),
                                       daemon=True)
        self.stdout = os.fdopen(os.dup(readable.fileno()), "rb", buffering=0)  # the worker's stdout and stderr
        readable.close()
        try:
            self.process.start()
        finally:
            writable.close()
        self.pid = self.process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(WORKER, timeout)
        return self.process.exitcode


def _forked_worker(worker: str, spec_path: str, output, environment: dict) -> None:
    """In the forked child: become what a fresh ``python -m grader.classroom.cohort.worker`` would be (its
    own session, output, folder and environment), then grade."""
    os.setsid()  # its own process group, which the parent kills at the time limit
    os.dup2(output.fileno(), 1)
    os.dup2(output.fileno(), 2)
    output.close()
    os.environ.clear()
    os.environ.update(environment)
    tempfile.tempdir = None  # the server's was found before TMPDIR pointed into this sandbox
    os.chdir(Path(spec_path).parent)
    importlib.import_module(worker).forked(spec_path)


def start_server(katas: list[manifest.Kata]) -> None:
    """Start the warm server (once per process): torch, the grader and the kata's checks imported,
    with the environment a fresh worker would have had from its start and nothing of this process'
    (a worker's /proc/self/environ is the server's)."""
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(
        [WORKER, "grader.classroom.cohort.record", *[f"grader.checks.k{k.id}" for k in katas], "grader.paged",
         "grader.classroom.cohort.server"])
    fixed = {"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    clean = {k: v for k, v in _environment(Path(tempfile.gettempdir())).items() if k not in ("HOME", "TMPDIR")}
    with _only_environ({**clean, **fixed}):
        forkserver.ensure_running()


def stop_server() -> None:
    """Stop the warm server, so that it never outlives the grading that started it."""
    from multiprocessing import forkserver

    with contextlib.suppress(Exception):
        forkserver._forkserver._stop()


@contextlib.contextmanager
def _only_environ(values: dict):
    """This process' environment is ``values`` alone for the time of the block."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _namespace(pid: int) -> str:
    """The worker's network namespace, where it has one of its own (else "")."""
    try:
        space = os.readlink(f"/proc/{pid}/ns/net")
        return "" if space == os.readlink("/proc/self/ns/net") else space
    except OSError:
        return ""


def sweep(space: str) -> int:
    """Kill every process left in a worker's own network namespace (a child it detached, or one of a
    pair that outlived its row); how many there were. Nothing leaves the namespace: the worker's
    seccomp filter refuses setns and unshare."""
    if not space:
        return 0
    killed = 0
    for _ in range(20):  # until none is left (a dying process may still fork once)
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry}/ns/net") == space:
                        found.append(int(entry))
        if not found:
            return killed
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        killed += len(found)
        time.sleep(0.02)
    return killed
