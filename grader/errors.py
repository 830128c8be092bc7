"""The one error the ``kvkata`` command reports without a traceback."""
from __future__ import annotations


class UsageError(Exception):
    """A request kvkata cannot carry out as asked; the CLI prints the message and exits with 2."""
