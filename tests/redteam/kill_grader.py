# Signals the grader and the warm server, then traces its parent.
import ctypes
import os
import signal

for pid in (os.getppid(), int("@GRADER_PIDS@".split()[0] or 0)):
    try:
        os.kill(pid, signal.SIGSTOP)
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
if libc.ptrace(16, os.getppid(), 0, 0) == 0:  # PTRACE_ATTACH
    raise RuntimeError("ATTACHED to the parent")
