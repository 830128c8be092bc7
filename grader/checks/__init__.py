"""The hidden checks: one module per kata (``k03.py``) holding ``CHECKS``, a ``Checks`` list."""
from __future__ import annotations

import importlib

from grader.engine import Checks


def for_kata(kata_id: str) -> Checks:
    return importlib.import_module(f"grader.checks.k{kata_id}").CHECKS
