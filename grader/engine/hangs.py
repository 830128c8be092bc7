"""After a check times out: which of the learner's functions hung, and the other checks of that
function told so at once instead of waiting for the time limit again.

The SPEC: "A check that hangs fails alone after a timeout, and the other checks of the function that
hung say so instead of waiting again". The function that hung is the innermost of the learner's
functions on the stack when the time ran out (a module-level function, or a method of a class the
learner's file defines); where none is on the stack, the function the check exercises (its ``uses``).
From then on that function, in the learner's namespace, raises ``NotRun`` as soon as it is called,
so a later check that calls it, directly or through another function, ends at once and says which
check hung there. Checks that never call it run as usual. ``restore`` puts the learner's functions back.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

NOT_RUN = ("not run: it calls `{name}`, which did not finish within the time limit in the check \"{check}\" "
           "(fix the loop, then grade again)")
HUNG_IN = " (it hung in `{name}`; the other checks that call it are not run)"


class NotRun(BaseException):
    """A check reached a function that hung in an earlier check. BaseException, so Hypothesis stops at once."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass
class Stopped:
    name: str  # "repeat_kv", "PagedKVCache.append"
    check: str  # the title of the check that timed out there
    undo: Callable[[], None]


def _functions(namespace: dict):
    """(owner, attribute, qualified name, function) of the module-level functions and of the methods
    of the classes defined in ``namespace``."""
    module = namespace.get("__name__")
    for name, value in list(namespace.items()):
        if inspect.isfunction(value):
            yield namespace, name, name, value
        elif isinstance(value, type) and value.__module__ == module:
            for attr, member in list(vars(value).items()):
                function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                if inspect.isfunction(function):
                    yield value, attr, f"{name}.{attr}", function


def hung_function(exc: BaseException, target, uses: str = ""):
    """(owner, attribute, qualified name) of the function that was running when ``exc`` (the timeout)
    was raised: the innermost learner frame that is a function of the namespace, else ``uses``."""
    codes = []
    tb = exc.__traceback__
    while tb is not None:
        if target.owns(tb.tb_frame.f_code.co_filename):
            codes.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    found = {id(f.__code__): (owner, attr, qualified) for owner, attr, qualified, f in _functions(target.namespace)}
    for code in reversed(codes):
        if id(code) in found:
            return found[id(code)]
    return next(((owner, attr, qualified) for owner, attr, qualified, _ in _functions(target.namespace)
                 if qualified == uses), None)


def stop(target, exc: BaseException, check_title: str, uses: str = "") -> str | None:
    """Make the function that hung raise NotRun from now on; its qualified name, or None if none is known."""
    hung = hung_function(exc, target, uses)
    if hung is None:
        return None
    owner, attr, qualified = hung
    message = NOT_RUN.format(name=qualified, check=check_title)

    def stopped(*args, **kwargs):
        raise NotRun(message)

    original = owner[attr] if isinstance(owner, dict) else vars(owner)[attr]
    replacement = type(original)(stopped) if isinstance(original, (staticmethod, classmethod)) else stopped
    if isinstance(owner, dict):
        owner[attr] = replacement

        def undo():
            owner[attr] = original
    else:
        setattr(owner, attr, replacement)

        def undo():
            setattr(owner, attr, original)
    target.stopped.append(Stopped(qualified, check_title, undo))
    return qualified


def restore(target) -> None:
    """Put back every function ``stop`` replaced in ``target``, newest first."""
    while target.stopped:
        target.stopped.pop().undo()
