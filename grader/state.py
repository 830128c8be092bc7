"""The one folder of learner state (``.kvkata/`` at the repo root, ignored by git).

Every write is atomic (write a temporary file, then rename); a corrupt file is moved aside
with a warning instead of crashing whatever reads it.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from grader import manifest

RESULTS = "results.json"  # the latest grading of each kata's file, katas/NN/<file>
NOTEBOOK_RESULTS = "notebooks.json"  # the latest check cell of each kata's notebook, kept apart
SESSION = "session.json"  # the open interview session (grader.learner.sessions)


def state_dir(root: Path | None = None) -> Path:
    override = os.environ.get("KVKATA_STATE")
    return Path(override) if override else (root or manifest.REPO_ROOT) / ".kvkata"


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (never half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True).encode("utf-8"))


def read_json(path: Path, default):
    """The file's data, or ``default`` when it is missing; a corrupt file is moved aside."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return default
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(path, aside)
            print(f"kvkata: {path} was unreadable ({exc}); moved it to {aside}", file=sys.stderr)
        except OSError:
            print(f"kvkata: {path} is unreadable ({exc}); ignoring it", file=sys.stderr)
        return default


def open_session(root: Path | None = None) -> dict | None:
    """The open interview session's kata and file ({"kata", "file", ...}), or None; read only (the
    sessions' own code sets a malformed file aside)."""
    try:
        with open(state_dir(root) / SESSION, encoding="utf-8") as handle:
            session = json.load(handle)
    except (OSError, ValueError):
        return None
    return session if isinstance(session, dict) and {"kata", "file"} <= session.keys() else None


def load_results(root: Path | None = None, name: str = RESULTS) -> dict:
    return read_json(state_dir(root) / name, {})


def save_results(kata_results: dict, root: Path | None = None, name: str = RESULTS) -> None:
    """Merge the results of some katas into the saved ones (the latest run of a kata wins);
    ``name``: the file's results (RESULTS) or the notebooks' (NOTEBOOK_RESULTS)."""
    path = state_dir(root) / name
    merged = read_json(path, {})
    merged.update(kata_results)
    write_json(path, merged)
