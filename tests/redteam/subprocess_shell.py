# Starts a shell, which has no audit hook and no limits.
import subprocess

subprocess.Popen(["/bin/sh", "-c", "sleep 60"])
