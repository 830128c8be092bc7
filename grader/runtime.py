"""How this process grades: the torch device, and one CPU thread."""
from __future__ import annotations

import torch


def pick_device(name: str = "auto") -> torch.device:
    """``auto`` is CUDA when present, else CPU; ``cuda`` without a GPU is a clear error."""
    if name not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device: expected one of auto, cpu, cuda; got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was asked for but torch sees no CUDA device")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def single_thread() -> None:
    """Grade on one CPU thread: the checks' tensors are tiny, and waking a thread pool for each
    small op costs milliseconds on a busy machine."""
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
