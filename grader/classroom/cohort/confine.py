"""What a worker may touch once it runs a submission, enforced by the kernel (grader.classroom.cohort.kernel).

Applied in the worker right after the fork, while it has one thread, after the grader has read what it
needs and before the submission is imported:

- a user namespace of its own, with a network namespace (a fresh loopback, brought up only for a kata
  whose checks join two processes over it) and a mount namespace, in which the sandbox's scratch folder
  is a tmpfs of a fixed size (the disk quota) and the warm server's socket folder is covered;
- Landlock: read and execute on the interpreter, the installed packages, the system libraries and the
  grader's own code (not solutions/, not the mistake catalogue, not the sandboxes, the submissions or
  anything else of the repository); read of the submitted file; write of the worker's record files
  and its scratch folder; /proc of itself only; TCP bind and connect refused (but for a peer kata,
  whose loopback is its own); signals and abstract unix sockets only within its own domain;
- no capability left, and a seccomp filter: no new process (threads only) unless the kata's checks
  start their pair, no namespace, mount, ptrace or cross-process memory access.

``probe()`` tells the grader, before any worker starts, which of these this kernel offers.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from grader.classroom.cohort import kernel

KERNEL, AUDIT_ONLY = "kernel", "audit hook only"
SYSTEM = ["/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/usr/share/zoneinfo", "/etc/ld.so.cache",
          "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/hosts", "/etc/host.conf",
          "/etc/gai.conf", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/sys/devices/system/cpu"]
NETWORK = ["/sys/class/net", "/sys/bus/pci/devices", "/sys/devices"]  # gloo looks its interface up there
DEVICES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random"]


class NotConfined(RuntimeError):
    """A wall the grader counted on could not be raised in this worker."""


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def grant(ruleset, path: str, rights: int, excluded: list[str]) -> None:
    """Allow ``rights`` beneath ``path`` except beneath any ``excluded`` path (Landlock only adds, so a
    folder holding an excluded one is granted child by child)."""
    path = os.path.realpath(path)
    if not os.path.exists(path) or any(_inside(path, e) for e in excluded):
        return
    if not any(_inside(e, path) for e in excluded):
        ruleset.allow(path, rights)
        return
    try:
        children = os.listdir(path)
    except OSError:
        return
    for child in children:
        grant(ruleset, os.path.join(path, child), rights, excluded)


def _mapped_folders() -> set[str]:
    """Folders of the files this process maps now (its shared libraries, wherever they were installed)."""
    found = set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    found.add(os.path.dirname(parts[5].strip().removesuffix(" (deleted)")))
    except OSError:
        pass
    return found


def readable(spec: dict) -> list[str]:
    """What the worker reads and executes: the interpreter, its packages, the libraries it maps."""
    roots = {sys.base_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    roots |= {p for p in sys.path if p and os.path.isdir(p)}
    roots |= _mapped_folders()
    return sorted(roots | set(SYSTEM) | set(NETWORK if spec.get("peers") else [])) + [spec["package"]]


def excluded(spec: dict) -> list[str]:
    """Never granted, whatever holds it: the repository (but the grader package), the hidden checks (the
    warm server imported them), the solutions and mistakes wherever a copy is installed, the sandboxes,
    the submissions and the reports."""
    found = [spec["repo"], os.path.join(spec["package"], "mistakes"), os.path.join(spec["package"], "checks"),
             spec["workdir"], *spec["roots"], *spec.get("reports", [])]
    for entry in sys.path:
        if entry and os.path.isdir(entry):
            found += [os.path.join(entry, "grader", sub) for sub in ("mistakes", "checks")]
            found.append(os.path.join(entry, "solutions"))
    return [os.path.realpath(p) for p in found]


def landlock(spec: dict, abi: int) -> None:
    rules = kernel.Ruleset(abi, tcp=not spec.get("peers"))
    sandbox, denied = spec["sandbox"], excluded(spec)
    package_denied = [d for d in denied if not _inside(spec["package"], d)]
    for path in readable(spec):
        grant(rules, path, kernel.READ, package_denied if path == spec["package"] else denied)
    for path in DEVICES:
        grant(rules, path, kernel.READ | kernel.FS["write_file"], [])
    rules.allow(f"/proc/{os.getpid()}", kernel.READ)
    rules.allow(os.path.join(sandbox, "submission"), kernel.READ)
    rules.allow(os.path.join(sandbox, "tmp"), kernel.WRITE)
    for record in Path(sandbox, "out").iterdir():
        rules.allow(str(record), kernel.FS["write_file"] | kernel.FS["read_file"] | kernel.FS["truncate"])
    rules.restrict()


def namespaces(spec: dict) -> None:
    kernel.own_user_namespace()
    if spec.get("peers"):
        kernel.loopback_up()
    kernel.mount_tmpfs(os.path.join(spec["sandbox"], "tmp"), int(spec.get("disk_mb") or 64) * 2**20)
    for folder in spec.get("hide", []):
        if os.path.isdir(folder):
            kernel.mount_tmpfs(folder, 4096)


UNPRIVILEGED = 61000  # a worker run by root becomes this uid plus its index: no file of anyone, none of another worker's


def reachable_by_others(path: str) -> bool:
    """Whether a user who owns nothing may read ``path``: every folder above it searchable by others, and
    the path itself readable (and searchable, for a folder) by them."""
    path = os.path.realpath(path)
    try:
        parts = Path(path).parents
        if any(not os.stat(folder).st_mode & 0o001 for folder in parts):
            return False
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return bool(mode & 0o004) and (not os.path.isdir(path) or bool(mode & 0o001))


def can_drop(package: str) -> bool:
    """Whether a worker of root's may become an unprivileged user and still read what it runs."""
    needed = [sys.executable, sys.prefix, sys.base_prefix, package] + [p for p in sys.path if "site-packages" in p]
    return os.geteuid() == 0 and all(reachable_by_others(p) for p in needed if p and os.path.exists(p))


def drop(uid: int) -> None:
    """Become ``uid`` (group too, no supplementary group): run as root, the worker keeps no privilege."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def confine(spec: dict) -> list[str]:
    """Raise every wall ``spec["isolation"]`` promises (the grader's probe found them); NotConfined if one fails."""
    if spec.get("isolation") != KERNEL:
        return []
    if threads() != 1:
        raise NotConfined(f"the worker has {threads()} threads before its confinement; it needs one")
    raised = []
    try:
        if spec.get("uid") is not None and os.geteuid() == 0:
            drop(int(spec["uid"]))
            raised.append(f"uid {spec['uid']}")
        if spec.get("namespaces"):
            namespaces(spec)
            raised.append("namespaces")
        os.chdir(os.path.join(spec["sandbox"], "tmp"))  # the one writable folder (the tmpfs, where mounted)
        kernel.no_new_privs()
        landlock(spec, kernel.landlock_abi())
        raised.append("landlock")
        if spec.get("namespaces"):
            kernel.drop_capabilities()
        if spec.get("seccomp"):
            kernel.seccomp(processes=bool(spec.get("peers")))
            raised.append("seccomp")
    except OSError as exc:
        raise NotConfined(f"{exc} (after {', '.join(raised) or 'nothing'})") from exc
    return raised


def _try(wall) -> bool:
    """Whether ``wall`` can be raised, tried in a forked child that then leaves."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            wall()
            code = 0
        except BaseException:
            pass
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def probe() -> dict:
    """What this kernel offers a worker: {"isolation": KERNEL or AUDIT_ONLY, "landlock": ABI,
    "namespaces": bool, "seccomp": bool, "missing": what is not there, in words}."""
    if not sys.platform.startswith("linux"):
        return {"isolation": AUDIT_ONLY, "landlock": 0, "namespaces": False, "seccomp": False,
                "missing": f"no kernel isolation on {sys.platform}"}
    abi = kernel.landlock_abi()
    spaces = _try(lambda: (kernel.own_user_namespace(), kernel.loopback_up()))
    filtered = _try(lambda: (kernel.no_new_privs(), kernel.seccomp(processes=False)))
    missing = [what for what, ok in (("Landlock (Linux >= 5.13)", abi > 0),
                                     ("unprivileged user and network namespaces", spaces),
                                     ("seccomp filters", filtered)) if not ok]
    if 0 < abi < 6:
        missing.append(f"Landlock ABI 6 (signals and abstract sockets; this kernel has ABI {abi})")
    return {"isolation": KERNEL if abi > 0 else AUDIT_ONLY, "landlock": abi, "namespaces": spaces,
            "seccomp": filtered, "missing": "; ".join(missing)}
