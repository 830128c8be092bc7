# A detached grandchild that waits for the report and rewrites it as a full score.
import os
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for _ in range(600):
            time.sleep(0.1)
            try:
                with open("@REPORT@", "a") as report:
                    report.write("detached_rewrites_report,01,14,14,pass,,,0.1,kernel\n")
            except OSError:
                pass
    os._exit(0)
