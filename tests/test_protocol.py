"""The state and aliasing programs tell code that keeps its results apart from its state from code that
does not: each is run on a correct implementation and on one that aliases, and compared as a check does."""
from __future__ import annotations

import torch

from grader.checks.support import protocol
from grader.engine import report


class Fresh:
    """Correct: every call builds a new result."""

    def __init__(self):
        self.buffer = torch.zeros(4)
        self.count = 0

    def step(self, x):
        self.count += 1
        self.buffer = self.buffer + x
        return self.buffer.clone(), [self.count]


class Aliased(Fresh):
    """Wrong: the returned tensor is the state itself, refilled in place by the next call."""

    def step(self, x):
        self.count += 1
        self.buffer.add_(x)
        return self.buffer, [self.count]


class Memo:
    """Wrong: the same list is returned (and kept) for the same argument."""

    def __init__(self):
        self.seen = {}

    def tokens(self, n):
        return self.seen.setdefault(n, list(range(n)))


class NoMemo:
    def tokens(self, n):
        return list(range(n))


SHARED = []


class Shared:
    """Wrong: every instance appends to one class-level list."""

    def push(self, x):
        SHARED.append(x)
        return list(SHARED)


class Own:
    def __init__(self):
        self.items = []

    def push(self, x):
        self.items.append(x)
        return list(self.items)


def _same(program, good, bad):
    expected = program(good, {})
    assert report.compare(expected, program(good, {})) is None
    return report.compare(expected, program(bad, {}))


def test_kept_catches_a_result_the_next_call_refills():
    def program(make, ex):
        obj = make()
        return protocol.kept(lambda api, e: obj.step(torch.ones(4)), lambda api, e: obj.step(torch.ones(4)))(None, ex)
    assert "after the next call ran" in _same(program, Fresh, Aliased)


def test_changed_by_caller_catches_a_memoized_result():
    def program(make, ex):
        obj = make()
        return protocol.changed_by_caller(lambda api, e: obj.tokens(3), lambda api, e: obj.tokens(3))(None, ex)
    assert "overwrote" in _same(program, NoMemo, Memo)


def test_interleaved_catches_state_shared_between_instances():
    def program(make, ex):
        SHARED.clear()
        return protocol.interleaved(lambda api, e, i: make(), lambda api, e, obj, i, n: obj.push(10 * i + n), 2)(None, ex)
    assert "instance" in _same(program, Own, Shared)


def test_twice_and_scribble_reach_nested_values():
    value = {"a": [1, 2, torch.ones(2)], "b": (torch.zeros(1, dtype=torch.long), torch.ones(1, dtype=torch.bool))}
    copy = protocol.snapshot(value)
    protocol.scribble(value)
    assert value["a"][:2] == [protocol.SCRIBBLED_ID] * 2 and torch.isnan(value["a"][2]).all()
    assert value["b"][0].item() == protocol.SCRIBBLED_ID and not value["b"][1].item()
    assert copy["a"][:2] == [1, 2] and torch.equal(copy["a"][2], torch.ones(2))
    counter = iter(range(10))
    assert "again" in report.compare(protocol.twice(lambda api, e: next(counter))(None, {}),
                                     protocol.twice(lambda api, e: 0)(None, {}))


def test_relabel_names_ids_by_first_appearance():
    """Two results that differ only in which ids were handed out relabel alike; a different sharing does not."""
    mine = {"table": [5, 2], "slots": torch.tensor([11, 4]), "count": 3}
    theirs = {"table": [0, 1], "slots": torch.tensor([1, 2]), "count": 3}
    assert protocol.relabel(mine, block_size=2) == protocol.relabel(theirs, block_size=2)
    assert protocol.relabel({"table": [0, 0]}) != protocol.relabel({"table": [0, 1]})
