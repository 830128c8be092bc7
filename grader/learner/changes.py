"""Noticing that files were saved: inotify where it works, polling where it does not.

``Watcher(files).wait()`` blocks until the content of some of the files has changed and returns
those files. Content is compared, not timestamps, so an editor's several-step save (truncate,
write, rename) gives one change once it has settled, and a save that changes nothing gives none.

Notifications come from Linux's inotify (through ctypes, no dependency), watching the files'
folders so that saves by rename are seen too; a "closed after writing" or "renamed into place"
event of a watched file ends the save at once, other events wait for a moment of quiet. Polling
looks at the files' times and sizes every interval (cheap) and reads them only when those change.
Neither watchfiles nor watchdog is used: every learner's, handout's and autograder's install would
carry a dependency (watchfiles a compiled extension) for this one command, and neither removes the
probe, the polling fallback (WSL and network drives deliver no events to any library) or the
content comparison (editors save in several steps) that this module needs anyway; what they add,
native events on macOS and Windows, polling at a fifth of a second nearly matches. They are probed once at the start: where a probe
file's creation is not reported within a moment (some network and WSL drives), or where inotify
is missing (macOS, Windows), the watcher polls. Even with notifications it compares the files
every few seconds, a safety net for events that never come.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import sys
import time
from pathlib import Path

SETTLE = 0.05  # seconds to let an editor finish its save, when no "closed after writing" event says it has
SAFETY_NET = 3.0  # seconds between comparisons when notifications are on
PROBE_WAIT = 0.5  # seconds a probe's notification may take
IN_CLOSE_WRITE, IN_MOVED_TO = 0x8, 0x80  # a file written and closed, or renamed into place: a finished save
# inotify event bits: written and closed, moved in, created, deleted, moved out, modified
EVENTS = IN_CLOSE_WRITE | IN_MOVED_TO | 0x100 | 0x200 | 0x40 | 0x2
IN_NONBLOCK_CLOEXEC = os.O_NONBLOCK | os.O_CLOEXEC
EVENT_HEAD = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name


def _stat(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


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

    def wait(self, seconds: float) -> list[tuple[int, str]] | None:
        """(mask, file name) of the events that arrived within ``seconds``; None when none did."""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, seconds))
        if not ready:
            return None
        data = b""
        try:
            while chunk := os.read(self.fd, 1 << 16):
                data += chunk
        except BlockingIOError:
            pass
        events, at = [], 0
        while at + EVENT_HEAD.size <= len(data):
            _, mask, _, size = EVENT_HEAD.unpack_from(data, at)
            name = data[at + EVENT_HEAD.size:at + EVENT_HEAD.size + size].rstrip(b"\0")
            events.append((mask, os.fsdecode(name)))
            at += EVENT_HEAD.size + size
        return events

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
    if notifier.wait(PROBE_WAIT) is None:
        notifier.close()
        return None, "notifications do not arrive in this folder (a network or WSL drive?)"
    return notifier, "file notifications"


class Watcher:
    def __init__(self, files: list[Path], poll: bool = False, interval: float = 0.5):
        self.files, self.interval = list(files), interval
        self.names = {path.name for path in self.files}
        self.seen = {path: _content(path) for path in self.files}
        self.stats = {path: _stat(path) for path in self.files}
        folders = list(dict.fromkeys(path.parent for path in self.files if path.parent.is_dir()))
        self.notifier, why = (None, "--poll") if poll or not folders else notifications(folders)
        self.mode = why if self.notifier else f"polling every {interval:g} s: {why}"
        self.compare_at = time.monotonic() + self._every()
        self.full_at = time.monotonic() + SAFETY_NET  # contents compared at least this often, whatever the stats say

    def _every(self) -> float:
        return SAFETY_NET if self.notifier is not None else self.interval

    def _touched(self) -> bool:
        """Polling: whether any file's time, size or inode changed since the last look (cheap: no reads)."""
        now = {path: _stat(path) for path in self.files}
        touched, self.stats = now != self.stats, now
        return touched

    def fileno(self) -> int | None:
        """What to ``select`` on for notifications (then call ``wait(0)``); None when polling."""
        return None if self.notifier is None else self.notifier.fd

    def changed(self) -> list[Path]:
        now = {path: _content(path) for path in self.files}
        found = [path for path in self.files if now[path] != self.seen[path] and now[path] is not None]
        self.seen = now
        self.compare_at = time.monotonic() + self._every()
        self.full_at = time.monotonic() + SAFETY_NET
        return found

    def _settled(self, events: list[tuple[int, str]]) -> None:
        """Return once a save has finished: at once on a "closed after writing" or "renamed into place"
        event of a watched file, else when no further event comes for a moment."""
        while not any(mask & (IN_CLOSE_WRITE | IN_MOVED_TO) and name in self.names for mask, name in events):
            events = self.notifier.wait(SETTLE)
            if events is None:
                return

    def wait(self, timeout: float | None = None) -> list[Path]:
        """The files whose content changed: block until there are some, or at most ``timeout`` seconds
        (then possibly none). Contents are compared after notifications; when polling, whenever a
        file's time, size or inode changed (looked at every interval); and every few seconds whatever
        happened, as a safety net."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            now = time.monotonic()
            step = self.compare_at - now if deadline is None else min(self.compare_at, deadline) - now
            events = None
            if self.notifier is not None:
                events = self.notifier.wait(step)
                if events:
                    self._settled(events)
            elif step > 0:
                time.sleep(step)
            due = time.monotonic() >= self.compare_at
            found = self.changed() if events or (due and self._touched()) or time.monotonic() >= self.full_at else []
            if due and not found:
                self.compare_at = time.monotonic() + self._every()
            if found or (deadline is not None and time.monotonic() >= deadline):
                return found

    def close(self) -> None:
        if self.notifier is not None:
            self.notifier.close()
            self.notifier = None
