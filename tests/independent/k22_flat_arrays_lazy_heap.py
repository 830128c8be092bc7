"""Kata 22, written from its README: nodes live in flat parallel lists indexed by an int id (parent,
run, slots, lock count, tick, alive), children in one dict keyed by (parent id, first token); the
handle match returns is the node's int id (the lower part of a split keeps its id); sizes kept as
running counters; eviction from a heap of (tick, id) with stale entries skipped (ids grow with
creation, so the id breaks ties); the pool's free slots a heap."""
from __future__ import annotations

import heapq


class OutOfSlotsError(RuntimeError):
    pass


ROOT = 0


class RadixCache:
    def __init__(self):
        self.par, self.run, self.sl, self.lk, self.tk, self.alive = [-1], [[]], [[]], [0], [0], [True]
        self.kid: dict[tuple[int, int], int] = {}
        self.nkids = [0]
        self.clock = 0
        self.free_sz = self.prot_sz = self.count = 0

    def _new(self, parent, run, slots, tick, locks=0):
        i = len(self.par)
        self.par.append(parent); self.run.append(run); self.sl.append(slots)
        self.lk.append(locks); self.tk.append(tick); self.alive.append(True); self.nkids.append(0)
        self.kid[(parent, run[0])] = i
        self.nkids[parent] += 1
        self.count += 1
        return i

    def _walk(self, toks, tick):
        at, pos = ROOT, 0
        while pos < len(toks) and (at, toks[pos]) in self.kid:
            c = self.kid[(at, toks[pos])]
            self.tk[c] = tick
            r, k = self.run[c], 0
            while k < len(r) and pos + k < len(toks) and r[k] == toks[pos + k]:
                k += 1
            if k < len(r):  # split: a new id on top, c keeps its id and the tail
                top = self._new(at, r[:k], self.sl[c][:k], tick, self.lk[c])
                self.par[c], self.run[c], self.sl[c] = top, r[k:], self.sl[c][k:]
                self.kid[(top, self.run[c][0])] = c
                self.nkids[top] += 1
                self.nkids[at] -= 1  # c no longer hangs from `at` (top replaced it under the same key)
                c = top
            at, pos = c, pos + k
        return at, pos

    def match(self, tokens, max_len=None):
        if not isinstance(tokens, list) or not tokens:
            raise ValueError("tokens: a non-empty list is needed")
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 0):
            raise ValueError("max_len: None or an int >= 0")
        self.clock += 1
        end, _ = self._walk(tokens if max_len is None else tokens[:max_len], self.clock)
        chain, i = [], end
        while i != ROOT:
            chain = self.sl[i] + chain
            i = self.par[i]
        return chain, end

    def insert(self, tokens, slots):
        if not isinstance(tokens, list) or not tokens:
            raise ValueError("tokens: a non-empty list is needed")
        if not isinstance(slots, list) or len(slots) != len(tokens):
            raise ValueError("slots: one per token")
        self.clock += 1
        end, pos = self._walk(tokens, self.clock)
        if pos < len(tokens):
            self._new(end, tokens[pos:], slots[pos:], self.clock)
            self.free_sz += len(tokens) - pos
        return pos

    def lock(self, node):
        while node != ROOT:
            if self.lk[node] == 0:
                self.free_sz -= len(self.run[node]); self.prot_sz += len(self.run[node])
            self.lk[node] += 1
            node = self.par[node]

    def unlock(self, node):
        if node != ROOT and self.lk[node] == 0:
            raise ValueError("node: not locked")
        while node != ROOT:
            self.lk[node] -= 1
            if self.lk[node] == 0:
                self.prot_sz -= len(self.run[node]); self.free_sz += len(self.run[node])
            node = self.par[node]

    def evict(self, n_tokens):
        heap = [(self.tk[i], i) for i in range(1, len(self.par))
                if self.alive[i] and self.nkids[i] == 0 and self.lk[i] == 0]
        heapq.heapify(heap)
        out = []
        while heap and len(out) < n_tokens:
            _, i = heapq.heappop(heap)
            p = self.par[i]
            del self.kid[(p, self.run[i][0])]
            self.alive[i] = False
            self.nkids[p] -= 1
            self.count -= 1
            self.free_sz -= len(self.run[i])
            out += self.sl[i]
            if p != ROOT and self.nkids[p] == 0 and self.lk[p] == 0:
                heapq.heappush(heap, (self.tk[p], p))
        return out

    evictable_size = property(lambda self: self.free_sz)
    protected_size = property(lambda self: self.prot_sz)
    total_size = property(lambda self: self.free_sz + self.prot_sz)
    num_nodes = property(lambda self: self.count)


class PrefixPool:
    def __init__(self, num_slots):
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError("num_slots: an int >= 1")
        self.cache = RadixCache()
        self.heap = list(range(num_slots))
        self.table = {}

    num_free = property(lambda self: len(self.heap))

    def _need(self, req_id):
        if req_id not in self.table:
            raise ValueError(f"req_id: {req_id!r} is not running")
        return self.table[req_id]

    def _slots(self, n):
        short = n - len(self.heap)
        if short > self.cache.evictable_size:
            raise OutOfSlotsError(f"short of {short} slots")
        if short > 0:
            for s in self.cache.evict(short):
                heapq.heappush(self.heap, s)
        return [heapq.heappop(self.heap) for _ in range(n)]

    def begin(self, req_id, tokens):
        if req_id in self.table:
            raise ValueError(f"req_id: {req_id!r} is running")
        if not isinstance(tokens, list) or not tokens:
            raise ValueError("tokens: a non-empty list is needed")
        got, node = self.cache.match(tokens, len(tokens) - 1)
        self.cache.lock(node)
        try:
            new = self._slots(len(tokens) - len(got))
        except OutOfSlotsError:
            self.cache.unlock(node)
            raise
        self.table[req_id] = [tokens[:], got + new, len(got), node]
        return len(got)

    def extend(self, req_id, token):
        entry = self._need(req_id)
        entry[1] = entry[1] + self._slots(1)
        entry[0].append(token)

    def finish(self, req_id):
        toks, slots, reused, node = self._need(req_id)
        cached = self.cache.insert(toks, slots)
        for s in slots[reused:cached]:
            heapq.heappush(self.heap, s)
        self.cache.unlock(node)
        del self.table[req_id]

    def slots(self, req_id):
        return self._need(req_id)[1][:]
