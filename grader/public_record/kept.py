"""Public records made once and kept by what decided them.

Recording a kata (every check on the reference and on every known mistake, then compressing the record) takes
seconds to minutes, and its result can only change when the kata's reference, checks or catalogue, a grader
module they import, or the recorder changes (grader.sources). With ``KVKATA_RECORD_CACHE=DIR``, each record
made is kept in DIR under a hash of exactly those files, and a later handout of the same kata (another level,
a re-issued assignment, the project's own tests) copies it instead of recording again. Without the variable
every record is made afresh.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from grader import state
from grader.public_record import tape
from grader.public_record.records import SUFFIX
from grader.public_record.tape_keys import PUBLIC_SEED
from grader.sources import Reader, digest, kata_closure, read

CACHE = "KVKATA_RECORD_CACHE"
RECORDER = ("grader/public_record/tape.py", "grader/public_record/tape_keys.py", "grader/public_record/records.py",
            "grader/public_record/kept.py")


def key(kata_id: str, read: Reader = read) -> str:
    """What decides the kata's public record, as a hash."""
    return digest(sorted(set(kata_closure(kata_id, read)) | set(RECORDER)), read, extra=f"seed {PUBLIC_SEED}")


def record_into(dest: Path, kata_id: str, progress=None) -> tuple[dict, bool]:
    """Write the kata's record into ``dest`` (a handout's grader/public); what it covers (tape.share) and
    whether it was copied from the cache rather than made."""
    folder = os.environ.get(CACHE)
    kept = Path(folder) / f"{kata_id}-{key(kata_id)}" if folder else None
    if kept is not None and (kept / "share.json").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kept / f"{kata_id}{SUFFIX}", dest / f"{kata_id}{SUFFIX}")
        return json.loads((kept / "share.json").read_text(encoding="utf-8")), True
    data = tape.record(kata_id, progress=progress)
    path = tape.save(dest, data)
    share = tape.share(data)
    if kept is not None:  # the record first, then share.json, which says the entry is whole
        state.write_atomic(kept / path.name, path.read_bytes())
        state.write_atomic(kept / "share.json", json.dumps(share).encode("utf-8"))
    return share, False
