# Reads the hidden checks and shows them in the message students see.
import torch

data = torch.from_file("@REPO@/grader/checks/k01.py", size=4000, dtype=torch.uint8)
raise RuntimeError("LEAKED " + bytes(data.tolist()).decode(errors="replace"))
