"""Kata 22, written from its README: a linked tree whose children are a plain list searched in turn,
walked recursively; sizes recomputed by a traversal when read; eviction keeps a candidate list sorted
by (tick, serial) and inserts newly childless parents with bisect; the pool's free slots are a sorted
list kept with bisect.insort."""
from __future__ import annotations

import bisect


class OutOfSlotsError(RuntimeError):
    pass


class _N:
    serials = 0

    def __init__(self, up, run, slots, tick):
        _N.serials += 1
        self.up, self.run, self.slots, self.kids = up, run, slots, []
        self.locks, self.tick, self.serial = 0, tick, _N.serials

    def key(self):
        return (self.tick, self.serial)


def _check_tokens(tokens):
    if type(tokens) is not list or len(tokens) < 1:
        raise ValueError(f"tokens must be a non-empty list, got {tokens!r}")


class RadixCache:
    def __init__(self):
        self._root = _N(None, [], [], 0)
        self._ticks = 0

    def _go(self, node, tokens, i, tick):
        """Recursive walk: returns (the deepest node reached, tokens consumed)."""
        if i == len(tokens):
            return node, i
        kid = next((c for c in node.kids if c.run[0] == tokens[i]), None)
        if kid is None:
            return node, i
        kid.tick = tick
        k = 0
        while k < len(kid.run) and i + k < len(tokens) and kid.run[k] == tokens[i + k]:
            k += 1
        if k < len(kid.run):
            top = _N(node, kid.run[:k], kid.slots[:k], tick)
            top.locks = kid.locks
            node.kids[node.kids.index(kid)] = top
            top.kids.append(kid)
            kid.up, kid.run, kid.slots = top, kid.run[k:], kid.slots[k:]
            return top, i + k
        return self._go(kid, tokens, i + k, tick)

    def match(self, tokens, max_len=None):
        _check_tokens(tokens)
        if max_len is not None and (type(max_len) is not int or max_len < 0):
            raise ValueError(f"max_len must be None or a non-negative int, got {max_len!r}")
        want = tokens if max_len is None else tokens[:max_len]
        self._ticks += 1
        end, _ = self._go(self._root, want, 0, self._ticks)
        parts, n = [], end
        while n is not None:
            parts.append(n.slots)
            n = n.up
        return [s for part in reversed(parts) for s in part], end

    def insert(self, tokens, slots):
        _check_tokens(tokens)
        if type(slots) is not list or len(slots) != len(tokens):
            raise ValueError("slots must be a list as long as tokens")
        self._ticks += 1
        end, i = self._go(self._root, tokens, 0, self._ticks)
        if i < len(tokens):
            end.kids.append(_N(end, list(tokens[i:]), list(slots[i:]), self._ticks))
        return i

    def lock(self, node):
        while node is not self._root:
            node.locks += 1
            node = node.up

    def unlock(self, node):
        if node is not self._root and node.locks < 1:
            raise ValueError("unlock: node is not locked")
        while node is not self._root:
            node.locks -= 1
            node = node.up

    def _all(self, node=None):
        node = node or self._root
        for kid in node.kids:
            yield kid
            yield from self._all(kid)

    def evict(self, n_tokens):
        cands = sorted((n for n in self._all() if not n.kids and not n.locks), key=_N.key)
        out = []
        while cands and len(out) < n_tokens:
            leaf = cands.pop(0)
            leaf.up.kids.remove(leaf)
            out.extend(leaf.slots)
            up = leaf.up
            if up is not self._root and not up.kids and not up.locks:
                keys = [c.key() for c in cands]
                cands.insert(bisect.bisect(keys, up.key()), up)
        return out

    @property
    def evictable_size(self):
        return sum(len(n.run) for n in self._all() if not n.locks)

    @property
    def protected_size(self):
        return sum(len(n.run) for n in self._all() if n.locks)

    @property
    def total_size(self):
        return sum(len(n.run) for n in self._all())

    @property
    def num_nodes(self):
        return sum(1 for _ in self._all())


class PrefixPool:
    def __init__(self, num_slots):
        if type(num_slots) is not int or num_slots <= 0:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        self.cache = RadixCache()
        self._free = list(range(num_slots))
        self._reqs = {}

    @property
    def num_free(self):
        return len(self._free)

    def _req(self, req_id):
        try:
            return self._reqs[req_id]
        except KeyError:
            raise ValueError(f"req_id {req_id!r} unknown") from None

    def _alloc(self, n):
        if len(self._free) + self.cache.evictable_size < n:
            raise OutOfSlotsError(f"cannot find {n} slots")
        if len(self._free) < n:
            for s in self.cache.evict(n - len(self._free)):
                bisect.insort(self._free, s)
        got, self._free = self._free[:n], self._free[n:]
        return got

    def begin(self, req_id, tokens):
        if req_id in self._reqs:
            raise ValueError(f"req_id {req_id!r} already running")
        _check_tokens(tokens)
        hit, node = self.cache.match(tokens, max_len=len(tokens) - 1)
        self.cache.lock(node)
        try:
            mine = self._alloc(len(tokens) - len(hit))
        except OutOfSlotsError:
            self.cache.unlock(node)
            raise
        self._reqs[req_id] = {"tokens": list(tokens), "slots": hit + mine, "hit": len(hit), "node": node}
        return len(hit)

    def extend(self, req_id, token):
        r = self._req(req_id)
        r["slots"].extend(self._alloc(1))
        r["tokens"].append(token)

    def finish(self, req_id):
        r = self._req(req_id)
        known = self.cache.insert(r["tokens"], r["slots"])
        for s in r["slots"][r["hit"]:known]:
            bisect.insort(self._free, s)
        self.cache.unlock(r["node"])
        del self._reqs[req_id]

    def slots(self, req_id):
        return list(self._req(req_id)["slots"])
