# Forks children that each hold memory (a budget per process would let each take the whole budget).
import os
import time

import torch

for _ in range(3):
    if os.fork() == 0:
        hog = torch.ones(800 * 2**20, dtype=torch.uint8)
        time.sleep(60)
        os._exit(0)
