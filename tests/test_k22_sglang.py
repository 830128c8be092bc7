"""Kata 22's reference against SGLang's RadixCache: a committed snapshot of what SGLang 0.5.23 does over
random programs of inserts, matches, locks, unlocks and evictions (tests/snapshots/k22_sglang.py made
it, in an environment of its own, as SGLang's package pulls in its server), replayed here on the
reference without SGLang; and, where SGLang is installed, the snapshot against SGLang itself."""
from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest

from grader import manifest
from grader.engine import targets

SPEC = importlib.util.spec_from_file_location("k22_sglang", manifest.REPO_ROOT / "tests/snapshots/k22_sglang.py")
snapshot = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(snapshot)
PROGRAMS = snapshot.load()["programs"]
REF = targets.reference(manifest.get("22")).namespace
CHUNKS = 10
CHUNK = -(-len(PROGRAMS) // CHUNKS)


def replay(cache_class, program: dict) -> None:
    """Run one recorded program on ``cache_class()``; every result and size must be SGLang's."""
    cache, nodes = cache_class(), {}  # step index of a match -> the node it returned
    for index, (kind, argument, theirs, sizes) in enumerate(program["steps"]):
        where = f"program seed={program['seed']}, step {index} {[kind, argument]}"
        if kind == "i":
            tokens, first = argument
            ours = cache.insert(tokens, list(range(first, first + len(tokens))))
        elif kind == "m":
            tokens, cap = argument
            ours, nodes[index] = cache.match(tokens, cap)
        elif kind == "l":
            ours = cache.lock(nodes[argument])
        elif kind == "u":
            ours = cache.unlock(nodes[argument])
        else:
            assert kind == "e", where
            ours = cache.evict(argument)
        assert ours == theirs, f"{where}: the reference gives {ours}, SGLang {theirs}"
        ours_sizes = [cache.evictable_size, cache.protected_size, cache.num_nodes]
        assert ours_sizes == sizes, f"{where}: [evictable, protected, nodes] {ours_sizes}, SGLang {sizes}"


@pytest.mark.parametrize("chunk", range(CHUNKS),
                         ids=[f"programs{i * CHUNK}-{min(len(PROGRAMS), (i + 1) * CHUNK) - 1}" for i in range(CHUNKS)])
def test_the_reference_does_what_sglang_does(chunk):
    for program in PROGRAMS[chunk * CHUNK:(chunk + 1) * CHUNK]:
        replay(REF["RadixCache"], program)


def test_the_snapshot_is_what_sglang_gives():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip(f"sglang is not installed: {snapshot.INSTALL}")
    installed = importlib.metadata.version("sglang")
    if installed != snapshot.VERSION:
        pytest.skip(f"the snapshot is of sglang {snapshot.VERSION}, found {installed}: {snapshot.INSTALL}")
    fresh = snapshot.make()
    assert len(fresh["programs"]) == len(PROGRAMS)
    for new, old in zip(fresh["programs"], PROGRAMS):
        assert new == old, f"program seed={old['seed']} differs from the snapshot"
