# Allocates and touches memory from several threads at once (one budget for the whole submission).
import threading

import torch

HELD = []


def hog():
    try:
        HELD.append(torch.ones(400 * 2**20, dtype=torch.uint8))
    except RuntimeError:
        pass


threads = [threading.Thread(target=hog) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
raise RuntimeError(f"held {sum(h.numel() for h in HELD) >> 20} MiB")
