"""Grading many submissions, each isolated: the engine of ``kvkata grade``.

Each submission × kata runs in a worker process of its own (grader.classroom.cohort.worker) with a time
limit, a memory limit, the kernel's walls (grader.classroom.cohort.confine; where the kernel has none,
an audit hook only, said once on stderr and on every row) and an audit hook, in parallel, in a sandbox
folder holding a copy of the submitted file. Workers are forked from a warm server that has imported torch and the grader once
(multiprocessing's forkserver), so a worker costs a fork instead of a Python start and a torch
import; each one still gets its own process, session, folder, limits and audit hook, all applied
after the fork. Where there is no forkserver (Windows), each worker is a fresh interpreter. The
worker only records what the learner's code did; processes that never run learner code replay the
records against the reference (grader.classroom.cohort.replay) and make the rows: judge processes forked
from the same warm server while the workers go on, or this one (grader.classroom.cohort.judging).
A worker that hangs, crashes, exits, floods its output or tampers with the grader gets an honest
failing row; no worker can change another row or stop the run.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from grader import manifest
from grader.classroom.cohort import confine

OUTPUT_CAP = 64 * 1024  # bytes of a worker's output kept for the report
WORKER = "grader.classroom.cohort.worker"  # the module each worker runs


@dataclass
class Settings:
    device: str = "cpu"
    seed: int = 0
    timeout: float = 60.0  # seconds a submission × kata may run, from the moment the grader has started
    check_timeout: float | None = None  # seconds one check (or the file's import) may run; None: half of timeout
    startup: float = 300.0  # seconds the grader may take to start in a worker (importing torch, warming up)
    memory_mb: int | None = 4096  # what the learner's code may allocate, beyond the grader's own; None: no limit
    file_mb: int = 64  # the largest file a worker may write
    jobs: int = 1
    warm: bool = "forkserver" in multiprocessing.get_all_start_methods()  # fork workers from a warm server
    judges: int | None = None  # judge processes when warm (grader.classroom.cohort.judging); None: one per job; 0: judge here
    remember: bool = True  # judges remember the reference's outputs and Hypothesis' runs (grader.classroom.cohort.memo)
    walls: dict | None = None  # the kernel's walls every worker raises (confine.probe); None: probe when grading
    reports: list[str] = field(default_factory=list)  # report files, which no worker may reach


def check_limit(settings: Settings) -> float:
    """Seconds one check may run: a check that hangs then fails alone and the kata's other checks still
    run in the time left (a function that hung stops the checks that call it at once, grader.engine.hangs)."""
    return settings.check_timeout or settings.timeout / 2


@dataclass
class Job:
    submission: str  # how rows name it
    root: Path  # the submission folder
    kata: manifest.Kata
    file: Path | None  # the submitted file; None when the submission has none for this kata


@dataclass
class Run:
    job: Job
    sandbox: Path
    returncode: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    output: bytes = b""
    output_bytes: int = 0
    started: bool = False  # the grader started in the worker (out/ready.pt), so the learner's code may have run
    startup_timed_out: bool = False
    leftovers: int = 0  # processes still alive in its namespace when the worker ended, killed then


def find_file(root: Path, kata: manifest.Kata) -> Path | None:
    """The kata's file in a submission folder: ``katas/NN/<file>``, ``NN/<file>`` or ``<file>``."""
    for candidate in (root / kata.stub, root / kata.id / kata.file, root / kata.file):
        if candidate.is_file():
            return candidate
    return None


# -- the worker process ---------------------------------------------------------------------
_PROBED: list[dict] = []  # this process' probe of the kernel (confine.probe), made once


def walls() -> dict:
    """What the kernel offers every worker, probed once; said once on stderr where it is not everything."""
    if not _PROBED:
        _PROBED.append(confine.probe())
        found = _PROBED[0]
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


def records(kata: manifest.Kata, out: Path) -> None:
    """The worker's record files, made empty beforehand: under the kernel's walls it may write these and
    create nothing else there (an empty one reads as absent)."""
    from grader import checks

    names = ["ready.pt", "load.pt", "done.pt"] + [f"check-{i:03d}.pt" for i in range(len(checks.for_kata(kata.id).all))]
    for name in names + ["tamper.txt"]:
        (out / name).touch()


def _environment(sandbox: Path) -> dict:
    """All a worker's environment: nothing of the instructor's but the paths to the interpreter's libraries."""
    paths = [str(manifest.PACKAGE_DIR.parent)] + [p for p in sys.path if p and os.path.isdir(p)]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TMPDIR": str(sandbox / "tmp"), "HOME": str(sandbox / "tmp"),
           "LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME") if k in os.environ})
    return env


def _spec(job: Job, sandbox: Path, workdir: Path, roots: list[Path], settings: Settings) -> dict:
    root, walls = manifest.REPO_ROOT, settings.walls or {}
    return {"isolation": walls.get("isolation", confine.AUDIT_ONLY), "namespaces": walls.get("namespaces", False),
            "seccomp": walls.get("seccomp", False), "peers": needs_peers(job.kata), "package": str(manifest.PACKAGE_DIR),
            "repo": str(root), "workdir": str(workdir), "roots": [str(r) for r in roots], "reports": settings.reports,
            "hide": _server_folders(), "disk_mb": settings.file_mb,
            "kata": job.kata.id, "file": str(sandbox / "submission" / job.kata.file), "label": job.kata.stub,
            "out": str(sandbox / "out"), "sandbox": str(sandbox), "device": settings.device, "seed": settings.seed,
            "timeout": settings.timeout, "check_timeout": check_limit(settings), "memory_mb": settings.memory_mb,
            "file_mb": settings.file_mb, "threads": 1,
            "guarded": [str(root), str(manifest.PACKAGE_DIR), str(workdir)] + [str(r) for r in roots] + settings.reports,
            "secret": [str(root / "solutions"), str(manifest.PACKAGE_DIR / "mistakes"), str(workdir)] + [str(r) for r in roots]}


def _drain(stream, run: Run) -> None:
    """Read a worker's output to the end, keeping the first OUTPUT_CAP bytes."""
    kept = []
    while chunk := stream.read(65536):
        run.output_bytes += len(chunk)
        if sum(map(len, kept)) < OUTPUT_CAP:
            kept.append(chunk)
    run.output = b"".join(kept)[:OUTPUT_CAP]


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


def run_worker(job: Job, index: int, workdir: Path, roots: list[Path], settings: Settings, live: set) -> Run:
    sandbox = (workdir / f"{index:04d}").resolve()
    for sub in ("submission", "out", "tmp"):
        (sandbox / sub).mkdir(parents=True)
    shutil.copyfile(job.file, sandbox / "submission" / job.kata.file)
    records(job.kata, sandbox / "out")
    (sandbox / "spec.json").write_text(json.dumps(_spec(job, sandbox, workdir.resolve(), roots, settings)))
    run = Run(job, sandbox)
    if settings.warm:
        proc = Forked(sandbox / "spec.json", _environment(sandbox))
    else:
        proc = subprocess.Popen([sys.executable, "-m", WORKER, str(sandbox / "spec.json")],
                                cwd=sandbox, env=_environment(sandbox), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    live.add(proc)
    reader = threading.Thread(target=_drain, args=(proc.stdout, run), daemon=True)
    reader.start()
    try:
        wait(proc, run, settings)
    finally:
        live.discard(proc)
    reader.join(timeout=10)
    return run


def wait(proc: subprocess.Popen, run: Run, settings: Settings) -> None:
    """Wait for the worker: first for the grader to start (out/ready.pt written), then, from that moment,
    for the learner's time limit; kill it at whichever limit it reaches, then whatever it left behind."""
    ready, begun = run.sandbox / "out" / "ready.pt", time.monotonic()
    while not _written(ready) and proc.poll() is None and time.monotonic() - begun < settings.startup:
        time.sleep(0.02)
    run.started = _written(ready)
    space = _namespace(proc.pid)
    started = time.monotonic()
    try:
        run.returncode = proc.wait(timeout=settings.timeout if run.started else 0.01)
    except subprocess.TimeoutExpired:
        run.timed_out, run.startup_timed_out = run.started, not run.started
        kill(proc)
        run.returncode = proc.wait()
    run.seconds = time.monotonic() - (started if run.started else begun)
    run.leftovers = sweep(space)


def _written(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


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


def kill(proc) -> None:
    """Kill a worker and anything in its process group (the worker itself too, should it not have
    made its own group yet)."""
    for send in (os.killpg, os.kill):
        try:
            send(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# -- rows -----------------------------------------------------------------------------------
def grade_all(jobs: list[Job], settings: Settings, progress=None) -> list[dict]:
    """One row per job, in the order of ``jobs``; workers run ``settings.jobs`` at a time, and
    each is judged as it finishes (grader.classroom.cohort.judging)."""
    from grader.classroom.cohort import judge, judging

    roots = sorted({j.root.resolve() for j in jobs})
    if settings.walls is None:
        settings.walls = walls()
    if settings.warm:
        start_server(list({j.kata.id: j.kata for j in jobs}.values()))
    workdir = Path(tempfile.mkdtemp(prefix="kvkata-grade-"))
    rows: dict[int, dict] = {}
    live: set = set()
    try:
        with ThreadPoolExecutor(max_workers=max(1, settings.jobs)) as pool, judging.Judges(settings) as judges:
            for i, job in enumerate(jobs):
                if job.file is None:
                    rows[i] = judge.missing_row(job)
                    _tell(progress, len(rows), len(jobs), rows[i])
                else:
                    pool.submit(run_worker, job, i, workdir, roots, settings, live).add_done_callback(judges.ran(i))
            try:
                while len(rows) < len(jobs):
                    i, row = judges.next_row(jobs)
                    rows[i] = row
                    _tell(progress, len(rows), len(jobs), row)
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                for proc in list(live):
                    kill(proc)
                raise
    finally:
        if settings.warm:
            stop_server()
        if os.environ.get("KVKATA_KEEP_SANDBOXES"):  # for debugging the grader: keep what the workers wrote
            print(f"kvkata: sandboxes kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    for row in rows.values():
        row["isolation"] = settings.walls["isolation"]
    return [rows[i] for i in range(len(jobs))]


def _tell(progress, done: int, total: int, row: dict) -> None:
    if progress:
        width = len(str(total))
        progress(f"[{done:>{width}}/{total}] {row['submission']} · kata {row['kata']}: {row['status']} "
                 f"{row['passed']}/{row['total']} ({row['seconds']:.1f} s)" + (f" — {row['note']}" if row['note'] else ""))
