"""A snapshot of SGLang's RadixCache over random programs, for kata 22's reference to be checked against.

SGLang is a whole server: ``import sglang`` runs the server's imports, and so does its radix cache's
module through the package (pybase64, msgspec, orjson, triton, aiohttp, ...). Installed without its
dependencies, its behaviour is recorded once, in an environment of its own, and committed
(``k22_sglang.json``):

    python -m venv --system-site-packages /tmp/sglang-env
    /tmp/sglang-env/bin/pip install --no-deps sglang==0.5.23
    /tmp/sglang-env/bin/python tests/snapshots/k22_sglang.py          # rewrites k22_sglang.json

What is taken from SGLang unchanged: ``sglang/srt/mem_cache/radix_cache.py`` (RadixKey, TreeNode,
RadixCache: match_prefix, insert, _split_node, inc_lock_ref/dec_lock_ref, evict over
evictable_leaves), ``base_prefix_cache.py``, ``evict_policy.py`` (LRU: a node's ``last_access_time``),
``events.py`` and ``mem_cache/utils.py`` (get_eviction_strategy). What is not:

* ``sglang/__init__.py`` is not run (it starts the server's imports). Seven modules that the tree imports
  but a simulated tree (``RadixCache.create_simulated``, no metrics, no KV events) never calls are
  replaced by empty stand-ins whose names cannot be used: ``srt.disaggregation.kv_events`` (msgspec),
  ``srt.utils.common`` (pybase64; the tree takes ``ceil_align`` from it, used by checkpoints only),
  ``kernels.ops.kvcache.mla_buffer`` (MLA kernels), ``srt.mem_cache.allocator``,
  ``srt.mem_cache.memory_pool`` (type hints only), ``srt.runtime_context`` and
  ``srt.observability.metrics_collector`` (metrics only, off).
  A stand-in's name, if SGLang ever called or instantiated it, raises; none does.
* The clock. SGLang stamps a node's ``last_access_time`` with ``time.monotonic()``: once per match/insert
  call, read before the walk, for every node the walk reaches (a node it splits keeps that stamp as the
  lower part), and once more for each node the call creates (the upper part of a split, the new leaf),
  after the walk. ``radix_cache.time`` is replaced by a clock whose ``monotonic()`` returns 1, 2, 3, ...
  (one more per read): every read later than the one before, as a real monotonic clock is at the
  microseconds between these reads, and the same on every run. Only the order of the stamps is ever
  read (LRU compares ``last_access_time``), so the recording is the one the wall clock gives (checked:
  with ``time.monotonic`` itself the programs come out the same). Only nodes one walk reached share a
  stamp, and they lie on one path, never two leaves at once: the eviction heap never has to break a tie
  between two nodes (checked: with ``TreeNode.__lt__`` raising, the programs come out the same). The
  eviction logic is SGLang's, untouched; the kata's rule "equal ticks go by creation order" is what
  these reads give (a leaf that ``insert`` creates beside the lower part of the node it split is later).
* The allocator: an object with ``free_segment`` (all the tree asks of it) that records the slots it is
  given, so each ``evict`` yields its freed slots in the order SGLang frees them (leaf by leaf, each
  leaf's slots in token order). This order is defined, and the snapshot keeps it: the reference's
  ``evict`` returns its slots in that order too.

Page size 1, no extra key, no priority (all 0), eagle off. A program is a random sequence of steps over a
small alphabet of token ids (so prompts share prefixes and runs get split), each recorded as
``[kind, argument, result, [evictable_size, protected_size, number of nodes]]``:

    ["i", [tokens, first slot], cached]   insert(tokens, slots first, first+1, ...): tokens already cached
    ["m", [tokens, cap], slots]           match(tokens[:cap]) (cap None: all): the slots of the match
    ["l", k, null]                        lock the node that step k's match returned (k: a step index;
                                          mostly a node under the root, now and then the root)
    ["u", k, null]                        undo one lock of that node
    ["e", n, freed]                       evict(n): the slots freed, in SGLang's order

Every insert brings fresh slots. Locks go on nodes still in the tree; an unlock undoes a lock held.
Each program ends by undoing every lock held and evicting everything: the whole tree's eviction order.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import itertools
import json
import random
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).parent
SNAPSHOT = HERE / "k22_sglang.json"
INSTALL = "pip install --no-deps sglang==0.5.23  (in an environment of its own: its server's imports are not needed)"
VERSION = "0.5.23"
# (seed, steps, alphabet size, longest token list): 240 programs
PROGRAMS = [(seed, 120 + 10 * (seed % 5), (2, 3, 4, 6)[seed % 4], (3, 6, 10)[seed % 3]) for seed in range(240)]
EVERYTHING = 10 ** 6  # an evict(n) that empties the tree of what is unlocked
_STUBBED = ["sglang.srt.disaggregation.kv_events", "sglang.srt.utils.common", "sglang.kernels.ops.kvcache.mla_buffer",
            "sglang.srt.runtime_context", "sglang.srt.mem_cache.allocator", "sglang.srt.mem_cache.memory_pool",
            "sglang.srt.observability.metrics_collector"]


# -- importing SGLang's tree without its server ------------------------------------------------------------
class _PackageWithoutInit(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``sglang`` as a bare package: its submodules import, its ``__init__.py`` is not run."""

    def find_spec(self, name, path=None, target=None):
        if name != "sglang":
            return None
        for entry in sys.path:
            where = Path(entry or ".") / "sglang"
            if (where / "srt" / "mem_cache" / "radix_cache.py").is_file():
                spec = importlib.machinery.ModuleSpec(name, self, is_package=True)
                spec.submodule_search_locations = [str(where)]
                return spec
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        pass


def _stand_in(module_name: str) -> types.ModuleType:
    """A module whose every name is a class that raises when made or called: imports pass, use fails."""
    module = types.ModuleType(module_name)

    def name(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def refuse(*args, **kwargs):
            raise RuntimeError(f"{module_name}.{attr} is a stand-in (tests/snapshots/k22_sglang.py)")
        return type(attr, (), {"__new__": refuse, "__init_subclass__": classmethod(lambda cls, **kw: None)})

    module.__getattr__ = name
    return module


def _sglang():
    """SGLang's radix_cache and base_prefix_cache modules, imported as the docstring says."""
    if "sglang" not in sys.modules:
        finder = _PackageWithoutInit()
        sys.meta_path.insert(0, finder)
        try:
            for module_name in _STUBBED:
                sys.modules.setdefault(module_name, _stand_in(module_name))
            import sglang  # noqa: F401  (the bare package)
        finally:
            sys.meta_path.remove(finder)
    from sglang.srt.mem_cache import base_prefix_cache, radix_cache
    return radix_cache, base_prefix_cache


class _Clock:
    """What ``radix_cache`` reads as ``time``: a monotonic() that is one later at every read."""

    def __init__(self):
        self._reads = itertools.count(1)

    def monotonic(self) -> float:
        return float(next(self._reads))

    perf_counter = staticmethod(time.perf_counter)  # eviction metrics (off)


class _Allocator:
    """All a simulated tree asks of an allocator: free_segment. Keeps what it is given, in order."""

    device = "cpu"

    def __init__(self):
        self.freed: list[int] = []

    def free_segment(self, indices, start_pos=0):
        self.freed += [int(i) for i in indices.tolist()]


# -- programs ------------------------------------------------------------------------------------------------
def _attached(tree, node) -> bool:
    """Whether ``node`` is still in the tree (an evicted node keeps its parent pointer)."""
    while node is not tree.root_node:
        parent = node.parent
        if parent is None or node not in parent.children.values():
            return False
        node = parent
    return True


def _count_nodes(tree) -> int:
    count, stack = 0, list(tree.root_node.children.values())
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(node.children.values())
    return count


def _tokens(rng: random.Random, seen: list[list[int]], alphabet: int, longest: int) -> list[int]:
    """A random token list; half the time it starts with part of one seen before."""
    fresh = [rng.randrange(alphabet) for _ in range(rng.randint(1, longest))]
    if seen and rng.random() < 0.5:
        old = rng.choice(seen)
        head = old[:rng.randint(1, len(old))]
        return (head + fresh)[:max(len(head), rng.randint(1, longest + 2))]
    return fresh


def _program(seed: int, steps: int, alphabet: int, longest: int) -> list:
    """One program, run on SGLang as it is generated (its choices read SGLang's tree: which nodes are in it)."""
    from array import array

    import torch

    radix_cache, base = _sglang()
    radix_cache.time = _Clock()  # the module's ``time``: TreeNode and the walks read it (docstring)
    allocator = _Allocator()
    tree = radix_cache.RadixCache.create_simulated(mock_allocator=allocator)
    assert tree.eviction_policy == "lru"
    rng = random.Random(seed)
    seen: list[list[int]] = []
    matched: dict[int, object] = {}  # step index -> the node its match returned
    held: list[int] = []  # one entry per lock held: the step index of the locked node
    next_slot = 0
    program = []

    def record(kind, argument, result):
        program.append([kind, argument, result, [tree.evictable_size(), tree.protected_size(), _count_nodes(tree)]])

    def evict(n):
        allocator.freed = []
        tree.evict(base.EvictParams(num_tokens=n))
        record("e", n, allocator.freed)

    def unlock(k):
        held.remove(k)
        tree.dec_lock_ref(matched[k])
        record("u", k, None)

    for _ in range(steps):
        roll = rng.random()
        lockable = [k for k, node in matched.items() if node is not tree.root_node and _attached(tree, node)]
        if rng.random() < 0.1:  # now and then a lock of the root (a match of nothing): it locks nothing
            lockable = [k for k, node in matched.items() if node is tree.root_node] or lockable
        if roll < 0.3:
            tokens = _tokens(rng, seen, alphabet, longest)
            seen.append(tokens)
            slots = torch.arange(next_slot, next_slot + len(tokens), dtype=torch.int64)
            result = tree.insert(base.InsertParams(key=radix_cache.RadixKey(array("q", tokens)), value=slots))
            record("i", [tokens, next_slot], int(result.prefix_len))
            next_slot += len(tokens)
        elif roll < 0.62:
            tokens = _tokens(rng, seen, alphabet, longest)
            cap = None if rng.random() < 0.5 else rng.randint(0, len(tokens))
            key = radix_cache.RadixKey(array("q", tokens if cap is None else tokens[:cap]))
            result = tree.match_prefix(base.MatchPrefixParams(key=key))
            node = result.last_device_node
            slots = [int(s) for s in tree.path_device_indices(node).tolist()]
            assert len(slots) == result.device_prefix_len
            matched[len(program)] = node
            record("m", [tokens, cap], slots)
        elif roll < 0.75 and lockable:
            k = rng.choice(lockable)
            held.append(k)
            tree.inc_lock_ref(matched[k])
            record("l", k, None)
        elif roll < 0.85 and held:
            unlock(rng.choice(held))
        else:
            evict(EVERYTHING if rng.random() < 0.05 else rng.randint(0, 2 * longest))
    while held:
        unlock(held[-1])
    evict(EVERYTHING)
    return program


def make() -> dict:
    from importlib.metadata import version

    import torch

    programs = [{"seed": seed, "alphabet": alphabet, "steps": _program(seed, steps, alphabet, longest)}
                for seed, steps, alphabet, longest in PROGRAMS]
    return {"sglang": version("sglang"), "torch": torch.__version__, "programs": programs}


def load() -> dict:
    return json.loads(SNAPSHOT.read_text())


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(make(), separators=(",", ":")) + "\n")
    print(f"wrote {SNAPSHOT}")
