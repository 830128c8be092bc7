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
from grader.classroom.cohort import cgroups, confine
from grader.classroom.cohort import launch
from grader.classroom.cohort.launch import (Forked, _environment, _namespace, _server_folders, needs_peers, start_server,
                                            stop_server, sweep, walls)

OUTPUT_CAP = 64 * 1024  # bytes of a worker's output kept for the report


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
    leftovers: int = 0  # processes still alive in its namespace or group when the worker ended, killed then
    out_of_memory: bool = False  # its control group reached its memory ceiling (grader.classroom.cohort.cgroups)


def find_file(root: Path, kata: manifest.Kata) -> Path | None:
    """The kata's file in a submission folder: ``katas/NN/<file>``, ``NN/<file>`` or ``<file>``."""
    for candidate in (root / kata.stub, root / kata.id / kata.file, root / kata.file):
        if candidate.is_file():
            return candidate
    return None


# -- the worker process ---------------------------------------------------------------------
def _uid(sandbox: Path) -> int:
    return confine.UNPRIVILEGED + int(sandbox.name) % 4000


def hand_over(sandbox: Path, uid: int) -> None:
    """A sandbox for a worker that becomes ``uid``: its own, beneath a folder others may only cross."""
    os.chmod(sandbox.parent, 0o711)
    for path in [sandbox, *sandbox.rglob("*")]:
        os.chown(path, uid, uid)


def records(kata: manifest.Kata, out: Path) -> None:
    """The worker's record files, made empty beforehand: under the kernel's walls it may write these and
    create nothing else there (an empty one reads as absent)."""
    from grader import checks

    names = ["ready.pt", "load.pt", "done.pt"] + [f"check-{i:03d}.pt" for i in range(len(checks.for_kata(kata.id).all))]
    for name in names + ["tamper.txt"]:
        (out / name).touch()


def _spec(job: Job, sandbox: Path, workdir: Path, roots: list[Path], settings: Settings) -> dict:
    root, walls = manifest.REPO_ROOT, settings.walls or {}
    return {"isolation": walls.get("isolation", confine.AUDIT_ONLY), "namespaces": walls.get("namespaces", False),
            "seccomp": walls.get("seccomp", False), "peers": needs_peers(job.kata), "package": str(manifest.PACKAGE_DIR),
            "repo": str(root), "workdir": str(workdir), "roots": [str(r) for r in roots], "reports": settings.reports,
            "hide": _server_folders(), "disk_mb": settings.file_mb, "uid": _uid(sandbox) if walls.get("drop") else None,
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


def run_worker(job: Job, index: int, workdir: Path, roots: list[Path], settings: Settings, live: set) -> Run:
    sandbox = (workdir / f"{index:04d}").resolve()
    for sub in ("submission", "out", "tmp"):
        (sandbox / sub).mkdir(parents=True)
    shutil.copyfile(job.file, sandbox / "submission" / job.kata.file)
    records(job.kata, sandbox / "out")
    spec = _spec(job, sandbox, workdir.resolve(), roots, settings)
    group = cgroups.Group(f"kvkata-{os.getpid()}-{index:04d}") if (settings.walls or {}).get("cgroups") else None
    if group is not None:
        spec["cgroup"] = group.spec()
    (sandbox / "spec.json").write_text(json.dumps(spec))
    if spec["uid"] is not None:
        hand_over(sandbox, spec["uid"])
    run = Run(job, sandbox)
    try:
        return _started(job, run, sandbox, settings, live, group)
    finally:
        if group is not None:
            group.remove()


def _started(job: Job, run: Run, sandbox: Path, settings: Settings, live: set, group) -> Run:
    if settings.warm:
        proc = Forked(sandbox / "spec.json", _environment(sandbox))
    else:
        proc = subprocess.Popen([sys.executable, "-m", launch.WORKER, str(sandbox / "spec.json")],
                                cwd=sandbox, env=_environment(sandbox), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    live.add(proc)
    reader = threading.Thread(target=_drain, args=(proc.stdout, run), daemon=True)
    reader.start()
    try:
        wait(proc, run, settings)
    finally:
        live.discard(proc)
        if group is not None:  # whatever is left in the group, wherever it went
            run.leftovers += group.kill()
            run.out_of_memory = group.out_of_memory()
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
