"""The Linux kernel's walls, called directly (ctypes, x86_64 and aarch64 syscall numbers): Landlock,
namespaces, capabilities and a seccomp filter. Policy (which paths, which walls) lives in
grader.classroom.cohort.confine; this module only speaks to the kernel, and every function raises
OSError when the kernel refuses, so the caller decides what a missing wall means.

Landlock (Linux >= 5.13) lets an unprivileged process restrict what it and its future children may
open, by path hierarchy; its ABI grows with the kernel, so the rights a kernel does not know are
dropped (ABI 2: reparenting, 3: truncation, 4: TCP bind and connect, 5: device ioctls, 6: scoping of
signals and abstract unix sockets to the domain). A restriction holds for the calling thread and
what it starts afterwards, so it is applied while the process has one thread.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import socket
import struct

_MACHINE = platform.machine()
# syscall numbers: x86_64, aarch64 (the generic table)
_NR = {"x86_64": {"landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
                  "seccomp": 317, "capset": 126, "fork": 57, "vfork": 58, "clone": 56, "clone3": 435,
                  "unshare": 272, "setns": 308, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
                  "mount": 165, "pidfd_getfd": 438},
       "aarch64": {"landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
                   "seccomp": 277, "capset": 91, "clone": 220, "clone3": 435, "unshare": 97, "setns": 268,
                   "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40,
                   "pidfd_getfd": 438}}.get(_MACHINE, {})
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}.get(_MACHINE)

FS = {"execute": 1 << 0, "write_file": 1 << 1, "read_file": 1 << 2, "read_dir": 1 << 3, "remove_dir": 1 << 4,
      "remove_file": 1 << 5, "make_char": 1 << 6, "make_dir": 1 << 7, "make_reg": 1 << 8, "make_sock": 1 << 9,
      "make_fifo": 1 << 10, "make_block": 1 << 11, "make_sym": 1 << 12, "refer": 1 << 13, "truncate": 1 << 14,
      "ioctl_dev": 1 << 15}
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
FILE_RIGHTS = FS["execute"] | FS["write_file"] | FS["read_file"] | FS["truncate"] | FS["ioctl_dev"]
NET_TCP = 1 | 2  # bind, connect (ABI 4)
SCOPES = 1 | 2  # abstract unix sockets, signals (ABI 6)
READ = FS["execute"] | FS["read_file"] | FS["read_dir"]
WRITE = (1 << 16) - 1 - FS["make_char"] - FS["make_block"] - FS["ioctl_dev"]  # everything but devices

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, CLONE_THREAD = 0x00020000, 0x10000000, 0x40000000, 0x00010000
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _call(name: str, *args) -> int:
    if name not in _NR:
        raise OSError(errno.ENOSYS, f"{name}: not known on {_MACHINE}")
    result = _libc.syscall(ctypes.c_long(_NR[name]), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")
    return result


def landlock_abi() -> int:
    """The Landlock ABI this kernel offers; 0 where it has none (too old, disabled, or not Linux)."""
    try:
        return _call("landlock_create_ruleset", None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except OSError:
        return 0


def no_new_privs() -> None:
    """PR_SET_NO_NEW_PRIVS: nothing executed from here on gains privileges (and Landlock and seccomp
    may be used without them)."""
    if _libc.prctl(38, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


class Ruleset:
    """A Landlock ruleset: what is handled (forbidden unless a rule allows it), then rules, then
    ``restrict()``. ``tcp``: handle TCP bind and connect (ABI >= 4) with no rule, so none is allowed."""

    def __init__(self, abi: int, tcp: bool):
        self.abi = abi
        self.fs = FS_BY_ABI[min(abi, 5)]
        fields = [self.fs]
        if abi >= 4:
            fields.append(NET_TCP if tcp else 0)
        if abi >= 6:
            fields.append(SCOPES)
        attr = struct.pack(f"={len(fields)}Q", *fields)
        self.fd = _call("landlock_create_ruleset", ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))

    def allow(self, path: str, rights: int) -> None:
        """Allow ``rights`` beneath ``path`` (on the file alone when it is not a folder)."""
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            if not os.path.isdir(path):
                rights &= FILE_RIGHTS
            rule = struct.pack("=Qi", rights & self.fs, fd)
            _call("landlock_add_rule", ctypes.c_int(self.fd), ctypes.c_int(1), ctypes.c_char_p(rule), ctypes.c_uint32(0))
        finally:
            os.close(fd)

    def restrict(self) -> None:
        try:
            _call("landlock_restrict_self", ctypes.c_int(self.fd), ctypes.c_uint32(0))
        finally:
            os.close(self.fd)


def unshare(flags: int) -> None:
    _call("unshare", ctypes.c_int(flags))


def own_user_namespace() -> None:
    """A new user namespace with a network (only a loopback, down) and a mount namespace of its own, in
    which this process keeps its ids (mapped to themselves). Must be called with one thread."""
    uid, gid = os.getuid(), os.getgid()
    unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
            f.write(text)


def loopback_up() -> None:
    """Bring ``lo`` up in this network namespace (SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s.fileno(), 0x8913, request))[1]
        fcntl.ioctl(s.fileno(), 0x8914, struct.pack("16sh22x", b"lo", flags | 1))


def mount_tmpfs(path: str, size_bytes: int) -> None:
    """A tmpfs of at most ``size_bytes`` on ``path`` (in this process' own mount namespace)."""
    options = f"size={max(size_bytes, 4096)},mode=700".encode()
    if _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", ctypes.c_ulong(2 | 4 | 8), options) != 0:  # nosuid nodev noexec
        code = ctypes.get_errno()
        raise OSError(code, f"mount tmpfs on {path}: {os.strerror(code)}")


def drop_capabilities() -> None:
    """No capability left, in any namespace (capset to nothing)."""
    header = struct.pack("=Ii", 0x20080522, 0)
    data = bytes(24)
    _call("capset", ctypes.c_char_p(header), ctypes.c_char_p(data))


def _filter(processes: bool) -> list[tuple[int, int, int, int]]:
    """A BPF program: (code, jt, jf, k) instructions."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    program = [(ld, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH), (ret, 0, 0, kill), (ld, 0, 0, 0),
               (jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    denied = ["unshare", "setns", "ptrace", "process_vm_readv", "process_vm_writev", "mount", "pidfd_getfd"]
    if not processes:
        denied += ["fork", "vfork"]
    for name in denied:
        if name in _NR:
            program += [(jeq, 0, 1, _NR[name]), (ret, 0, 0, eperm)]
    program += [(jeq, 0, 1, _NR["clone3"]), (ret, 0, 0, enosys)]  # threads fall back to clone, checked below
    if not processes:  # clone: a thread only; the argument's low 32 bits hold the flags
        program += [(jeq, 0, 4, _NR["clone"]), (ld, 0, 0, 16), (jset, 0, 1, CLONE_THREAD), (ret, 0, 0, allow),
                    (ret, 0, 0, eperm)]
    return program + [(ret, 0, 0, allow)]


def seccomp(processes: bool) -> None:
    """Refuse, for every thread of this process and what it starts: namespaces, mounts, ptrace and
    reading other processes' memory; unless ``processes``, any new process (threads only)."""
    if _AUDIT_ARCH is None:
        raise OSError(errno.ENOSYS, f"seccomp filter: not written for {_MACHINE}")
    program = _filter(processes)
    filters = (ctypes.c_uint64 * len(program))(*[struct.unpack("=Q", struct.pack("=HBBI", *i))[0] for i in program])
    fprog = struct.pack("=HxxxxxxQ", len(program), ctypes.addressof(filters))
    _call("seccomp", ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_char_p(fprog))  # SET_MODE_FILTER, TSYNC
