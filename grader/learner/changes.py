"""Noticing that files were saved: inotify where it works, polling where it does not.

``Watcher(files).wait()`` blocks until the content of some of the files has changed and returns
those files. Content is compared, not timestamps, so an editor's several-step save (truncate,
write, rename) gives one change once it has settled, and a save that changes nothing gives none.

Notifications come from Linux's inotify (through ctypes, no dependency), watching the files'
folders so that saves by rename are seen too. They are probed once at the start: where a probe
file's creation is not reported within a moment (some network and WSL drives), or where inotify
is missing (macOS, Windows), the watcher polls. Even with notifications it compares the files
every few seconds, a safety net for events that never come.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import sys
import time
from pathlib import Path

SETTLE = 0.05  # seconds to let an editor finish its save before reading the file
SAFETY_NET = 3.0  # seconds between comparisons when notifications are on
PROBE_WAIT = 0.5  # seconds a probe's notification may take
# inotify event bits: written and closed, moved in, created, deleted, moved out, modified
EVENTS = 0x8 | 0x80 | 0x100 | 0x200 | 0x40 | 0x2
IN_NONBLOCK_CLOEXEC = os.O_NONBLOCK | os.O_CLOEXEC


def _content(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


class Inotify:
    """Linux inotify on some folders; ``wait(seconds)`` is True when something happened there."""

    def __init__(self, folders: list[Path]):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self.fd = libc.inotify_init1(IN_NONBLOCK_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        for folder in folders:
            if libc.inotify_add_watch(self.fd, os.fsencode(folder), EVENTS) < 0:
                os.close(self.fd)
                raise OSError(ctypes.get_errno(), f"cannot watch {folder}")

    def wait(self, seconds: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], seconds)
        if not ready:
            return False
        try:
            while os.read(self.fd, 1 << 16):
                pass
        except BlockingIOError:
            pass
        return True

    def close(self) -> None:
        os.close(self.fd)


def notifications(folders: list[Path]) -> tuple[Inotify | None, str]:
    """Working notifications on ``folders`` and a word on them, or None and why polling is used."""
    if not sys.platform.startswith("linux"):
        return None, "no inotify on this system"
    try:
        notifier = Inotify(folders)
    except (OSError, AttributeError) as exc:
        return None, f"inotify is not available ({exc})"
    probe = folders[0] / f".kvkata-watch-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        notifier.close()
        return None, f"cannot write a probe file in {folders[0]} ({exc})"
    if not notifier.wait(PROBE_WAIT):
        notifier.close()
        return None, "notifications do not arrive in this folder (a network or WSL drive?)"
    return notifier, "file notifications"


class Watcher:
    def __init__(self, files: list[Path], poll: bool = False, interval: float = 0.5):
        self.files, self.interval = list(files), interval
        self.seen = {path: _content(path) for path in self.files}
        folders = list(dict.fromkeys(path.parent for path in self.files if path.parent.is_dir()))
        self.notifier, why = (None, "--poll") if poll or not folders else notifications(folders)
        self.mode = why if self.notifier else f"polling every {interval:g} s: {why}"

    def changed(self) -> list[Path]:
        now = {path: _content(path) for path in self.files}
        found = [path for path in self.files if now[path] != self.seen[path] and now[path] is not None]
        self.seen = now
        return found

    def wait(self) -> list[Path]:
        """Block until some files' content changed; those files."""
        while True:
            if self.notifier is not None:
                if self.notifier.wait(SAFETY_NET):
                    time.sleep(SETTLE)
                    while self.notifier.wait(SETTLE):  # still being written: let it settle
                        pass
            else:
                time.sleep(self.interval)
            found = self.changed()
            if found:
                return found

    def close(self) -> None:
        if self.notifier is not None:
            self.notifier.close()
            self.notifier = None
