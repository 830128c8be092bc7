# Looks for the warm server's socket and asks it for a process, from a thread under another file name.
import threading

CODE = '''
import glob, socket
for path in glob.glob("/tmp/pymp-*/listener-*") + glob.glob("/tmp/*/pymp-*/listener-*"):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    FOUND.append(path)
'''
FOUND = []
t = threading.Thread(target=exec, args=(compile(CODE, "/usr/lib/python3.11/socket.py", "exec"), {"FOUND": FOUND}))
t.start()
t.join()
if FOUND:
    raise RuntimeError(f"REACHED the forkserver at {FOUND}")
