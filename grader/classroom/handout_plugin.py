"""The pytest plugin of a handout (``kvkata assign`` wires it in instead of grader.plugin).

A handout has no reference solutions, and every hidden check compares with them, so nothing can
be graded here; this says so plainly instead of failing with a traceback.
"""
from __future__ import annotations

import pytest

MESSAGE = (
    "this is a handout: the hidden checks compare your code with reference solutions, which a "
    "handout does not contain, so nothing can be graded here. Hand in your katas/ folder (layout "
    "katas/NN/<file>.py) to your instructor, who grades it with `kvkata grade`. To see that a file "
    "at least imports, run it: python katas/01/append.py"
)


def pytest_configure(config: pytest.Config) -> None:
    raise pytest.UsageError(MESSAGE)
