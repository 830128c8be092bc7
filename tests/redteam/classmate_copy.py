# Copies a classmate's submitted file (through a C-level read) and runs it as its own.
import torch

data = torch.from_file("@CLASSMATE@", size=200_000, dtype=torch.uint8)
exec(bytes(data.tolist()).split(b"\0")[0].decode())
