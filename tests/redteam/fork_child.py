# Forks at import; the child would outlive the row.
import os
import time

if os.fork() == 0:
    time.sleep(60)
    os._exit(0)
