"""One ceiling for a worker and every process it starts: a control group of its own.

A worker's address-space limit (RLIMIT_AS) holds each process alone: kata 16's checks fork a pair of
processes from the worker, and each inherits the whole limit, so three processes could hold three budgets.
Where this process may make control groups (cgroup v1's ``memory`` and ``pids`` hierarchies, writable: the
grader runs as root, or in a container that hands it its own groups), each worker gets a group in both,
made by the grader before the worker starts, that the worker joins as its first act, before the learner's
code is imported, and whose memory ceiling it sets from what it holds then plus the budget (the worker
cannot write the group's files once the kernel's walls are up). The group's memory counts every page its
processes touch for themselves (pages shared with the warm server stay the server's until written); its
process count counts threads too. After the worker ends, whatever is left in the group is killed, wherever
it went, and the group is removed. Elsewhere (cgroup v2 without a delegated subtree, no cgroups at all)
nothing of this applies and ``probe`` says so.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

HIERARCHIES = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")
PIDS = 512  # processes and threads a worker and its children may have at once (gloo and torch start threads)


def _own(controller: str) -> Path | None:
    """This process' group in a cgroup v1 hierarchy, where that hierarchy is mounted."""
    try:
        lines = Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            folder = HIERARCHIES / controller / path.lstrip("/")
            return folder if folder.is_dir() else None  # never a group above its own: that would leave its limits
    return None


def probe() -> bool:
    """Whether this process can make a group in both hierarchies, set its limits and remove it."""
    try:
        group = Group(f"kvkata-probe-{os.getpid()}")
    except OSError:
        return False
    group.remove()
    return True


class Group:
    """A worker's group in each of CONTROLLERS, named ``name`` under this process' own groups."""

    def __init__(self, name: str):
        folders = {c: _own(c) for c in CONTROLLERS}
        if not all(folders.values()):
            raise OSError("no cgroup v1 memory and pids hierarchies here")
        self.folders = {c: folder / name for c, folder in folders.items()}
        made = []
        try:
            for folder in self.folders.values():
                folder.mkdir()
                made.append(folder)
            (self.folders["pids"] / "pids.max").write_text(str(PIDS))
        except OSError:
            for folder in made:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise

    def spec(self) -> dict:
        """What the worker needs to join: the files it writes its pid and its memory ceiling into."""
        return {"procs": [str(f / "cgroup.procs") for f in self.folders.values()],
                "memory_limit": str(self.folders["memory"] / "memory.limit_in_bytes")}

    def pids(self) -> list[int]:
        found: set[int] = set()
        for folder in self.folders.values():
            with contextlib.suppress(OSError, ValueError):
                found |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
        return sorted(found)

    def out_of_memory(self) -> bool:
        """Whether the group reached its memory ceiling (the kernel then refused a page or killed a process)."""
        with contextlib.suppress(OSError, ValueError):
            return int((self.folders["memory"] / "memory.failcnt").read_text()) > 0
        return False

    def kill(self) -> int:
        """Kill every process left in the group; how many there were."""
        killed = 0
        for _ in range(50):  # until none is left (a dying process may still fork once)
            left = self.pids()
            if not left:
                break
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            killed = max(killed, len(left))
            time.sleep(0.02)
        return killed

    def remove(self) -> None:
        """Remove the group once it is empty (a killed process leaves it within moments)."""
        for folder in self.folders.values():
            for _ in range(100):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


def join(spec: dict | None, budget_bytes: int) -> None:
    """In the worker, before any learner code: enter the group and set its memory ceiling to what this
    process holds now plus the budget (a worker without a group, or with no budget, is left as it is)."""
    if not spec:
        return
    for procs in spec["procs"]:
        Path(procs).write_text("0")  # 0: the process that writes
    if budget_bytes:
        Path(spec["memory_limit"]).write_text(str(_resident() + budget_bytes))


def _resident() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
