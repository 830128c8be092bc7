"""Kata 22, written from its README: no linked tree at all. Every node is a record keyed by the whole
token path from the root to its end (a split leaves the lower part's path unchanged, so a path is a
stable handle); parents, children and leaves are found by scanning; eviction rescans the leaves each
round; the pool keeps its free slots in a set."""
from __future__ import annotations

import itertools


class OutOfSlotsError(RuntimeError):
    pass


def _tokens(tokens):
    if not isinstance(tokens, list) or not tokens:
        raise ValueError("tokens must be a non-empty list")
    return tuple(tokens)


class RadixCache:
    def __init__(self):
        self._nodes = {}  # path tuple -> {"slots", "stamp", "born", "lock"}
        self._time = 0
        self._born = itertools.count()

    def _parent(self, path):
        best = ()
        for other in self._nodes:
            if len(best) < len(other) < len(path) and path[:len(other)] == other:
                best = other
        return best

    def _child(self, path, token):
        for other in self._nodes:
            if len(other) > len(path) and other[:len(path)] == path and other[len(path)] == token \
                    and self._parent(other) == path:
                return other
        return None

    def _descend(self, tokens, stamp):
        here, i = (), 0
        while i < len(tokens):
            child = self._child(here, tokens[i])
            if child is None:
                break
            rec = self._nodes[child]
            rec["stamp"] = stamp
            run = child[len(here):]
            k = 0
            while k < len(run) and i + k < len(tokens) and run[k] == tokens[i + k]:
                k += 1
            if k < len(run):
                upper = here + run[:k]
                self._nodes[upper] = {"slots": rec["slots"][:k], "stamp": stamp, "born": next(self._born),
                                      "lock": rec["lock"]}
                rec["slots"] = rec["slots"][k:]
                child = upper
            here, i = child, i + k
        return here, i

    def match(self, tokens, max_len=None):
        tokens = _tokens(tokens)
        if max_len is not None:
            if type(max_len) is not int or max_len < 0:
                raise ValueError("max_len must be None or an int >= 0")
            tokens = tokens[:max_len]
        self._time += 1
        end, _ = self._descend(tokens, self._time)
        slots = []
        for path in sorted((p for p in self._nodes if len(p) <= len(end) and end[:len(p)] == p), key=len):
            slots += self._nodes[path]["slots"]
        return slots, end

    def insert(self, tokens, slots):
        tokens = _tokens(tokens)
        if not isinstance(slots, list) or len(slots) != len(tokens):
            raise ValueError("slots must be a list with one slot per token")
        self._time += 1
        end, i = self._descend(tokens, self._time)
        if i < len(tokens):
            self._nodes[tokens] = {"slots": list(slots[i:]), "stamp": self._time, "born": next(self._born),
                                   "lock": 0}
        return i

    def _path_to(self, node):
        return [p for p in self._nodes if len(p) <= len(node) and node[:len(p)] == p]

    def lock(self, node):
        for path in self._path_to(node):
            self._nodes[path]["lock"] += 1

    def unlock(self, node):
        if node and self._nodes[node]["lock"] == 0:
            raise ValueError("node is not locked")
        for path in self._path_to(node):
            self._nodes[path]["lock"] -= 1

    def _is_leaf(self, path):
        return not any(len(o) > len(path) and o[:len(path)] == path for o in self._nodes)

    def evict(self, n_tokens):
        freed = []
        while len(freed) < n_tokens:
            leaves = [p for p, r in self._nodes.items() if r["lock"] == 0 and self._is_leaf(p)]
            if not leaves:
                break
            victim = min(leaves, key=lambda p: (self._nodes[p]["stamp"], self._nodes[p]["born"]))
            freed += self._nodes.pop(victim)["slots"]
        return freed

    def _count(self, locked):
        return sum(len(r["slots"]) for r in self._nodes.values() if (r["lock"] > 0) == locked)

    @property
    def evictable_size(self):
        return self._count(False)

    @property
    def protected_size(self):
        return self._count(True)

    @property
    def total_size(self):
        return sum(len(r["slots"]) for r in self._nodes.values())

    @property
    def num_nodes(self):
        return len(self._nodes)


class PrefixPool:
    def __init__(self, num_slots):
        if type(num_slots) is not int or num_slots < 1:
            raise ValueError("num_slots must be an int >= 1")
        self.cache = RadixCache()
        self._free = set(range(num_slots))
        self._running = {}  # req_id -> (tokens, slots, reused, node)

    @property
    def num_free(self):
        return len(self._free)

    def _get(self, req_id):
        if req_id not in self._running:
            raise ValueError(f"req_id {req_id!r} is not running")
        return self._running[req_id]

    def _grab(self, n):
        if n > len(self._free) + self.cache.evictable_size:
            raise OutOfSlotsError("not enough slots")
        if n > len(self._free):
            self._free.update(self.cache.evict(n - len(self._free)))
        taken = sorted(self._free)[:n]
        self._free.difference_update(taken)
        return taken

    def begin(self, req_id, tokens):
        if req_id in self._running:
            raise ValueError(f"req_id {req_id!r} is already running")
        if not isinstance(tokens, list) or not tokens:
            raise ValueError("tokens must be a non-empty list")
        reused, node = self.cache.match(tokens, len(tokens) - 1)
        self.cache.lock(node)
        try:
            own = self._grab(len(tokens) - len(reused))
        except OutOfSlotsError:
            self.cache.unlock(node)
            raise
        self._running[req_id] = (list(tokens), reused + own, len(reused), node)
        return len(reused)

    def extend(self, req_id, token):
        tokens, slots, _, _ = self._get(req_id)
        slots += self._grab(1)
        tokens.append(token)

    def finish(self, req_id):
        tokens, slots, reused, node = self._get(req_id)
        had = self.cache.insert(tokens, slots)
        self._free.update(slots[reused:had])
        self.cache.unlock(node)
        del self._running[req_id]

    def slots(self, req_id):
        return list(self._get(req_id)[1])
