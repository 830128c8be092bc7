# Breaks a classmate: truncates their file and kills the grading processes it can find (the
# classmates' workers, the judges, the grader).
import os
import signal

try:
    os.truncate("@CLASSMATE@", 0)
except OSError:
    pass
for pid in [int(p) for p in "@GRADER_PIDS@".split() if p] + list(range(os.getpid() - 40, os.getpid() + 40)):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if b"multiprocessing" not in cmdline.read() and pid != int("@GRADER_PIDS@".split()[0] or 0):
                continue
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass
os.kill(os.getppid(), signal.SIGKILL)
