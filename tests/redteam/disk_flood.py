# Writes as much as it can into its scratch folder, file after file.
import os
import tempfile

block = b"x" * 2**20
written = 0
try:
    for n in range(64):
        with open(os.path.join(tempfile.gettempdir(), f"flood{n}"), "wb") as f:
            for _ in range(32):
                f.write(block)
                written += len(block)
except OSError as exc:
    raise RuntimeError(f"wrote {written >> 20} MiB, then {exc}")
raise RuntimeError(f"wrote {written >> 20} MiB")
