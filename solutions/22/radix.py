"""Kata 22 — a radix-tree prefix cache (reference solution).

Page size 1: every token has one KV slot (an int naming a row of a paged cache like kata 06's).
The tree keeps the books only: which token runs are cached in which slots, who is using them.
"""
from __future__ import annotations

import heapq
import itertools


class OutOfSlotsError(RuntimeError):
    """Not enough slots can be had, even by evicting every unlocked leaf. Nothing was taken."""


def _expect_tokens(tokens) -> list[int]:
    if not isinstance(tokens, (list, tuple)) or len(tokens) == 0:
        raise ValueError(f"tokens: expected a non-empty list of token ids, got {tokens!r}")
    return list(tokens)


class _Node:
    """One edge of the tree: a run of tokens, their slots, children keyed by first token."""

    def __init__(self, parent, tokens, slots, stamp, born):
        self.parent, self.tokens, self.slots = parent, tokens, slots
        self.children: dict[int, _Node] = {}
        self.lock_ref = 0
        self.stamp, self.born = stamp, born

    def order(self) -> tuple[int, int]:
        return self.stamp, self.born  # equal stamps: the node created first goes first


class RadixCache:
    """Cached token runs in a compressed trie; locked paths are kept, unlocked leaves evicted LRU first."""

    def __init__(self):
        """An empty tree: only the root, all sizes 0."""
        self._births = itertools.count()
        self.root = _Node(None, [], [], 0, next(self._births))  # never evicted: its stamp is never read
        self._clock = 0
        self._evictable = self._protected = self._nodes = 0  # tokens unlocked, tokens locked, nodes

    @property
    def evictable_size(self) -> int:
        return self._evictable

    @property
    def protected_size(self) -> int:
        return self._protected

    @property
    def total_size(self) -> int:
        return self._evictable + self._protected

    @property
    def num_nodes(self) -> int:
        return self._nodes

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _split(self, node: _Node, k: int) -> _Node:
        """Cut ``node`` after its first k tokens: a new upper node takes them, ``node`` keeps the rest."""
        upper = _Node(node.parent, node.tokens[:k], node.slots[:k], node.stamp, next(self._births))
        upper.lock_ref = node.lock_ref  # the lock of the whole run holds both parts
        upper.parent.children[upper.tokens[0]] = upper
        node.tokens, node.slots, node.parent = node.tokens[k:], node.slots[k:], upper
        upper.children[node.tokens[0]] = node
        self._nodes += 1
        return upper

    def _walk(self, tokens: list[int], stamp: int) -> tuple[_Node, int]:
        """Follow ``tokens`` from the root, splitting where they end or leave inside a run."""
        node, i = self.root, 0
        while i < len(tokens) and tokens[i] in node.children:
            child = node.children[tokens[i]]
            child.stamp = stamp
            k = 0
            while k < len(child.tokens) and i + k < len(tokens) and child.tokens[k] == tokens[i + k]:
                k += 1
            if k < len(child.tokens):
                child = self._split(child, k)
            node, i = child, i + k
        return node, i

    def match(self, tokens, max_len: int | None = None):
        """The slots of the longest cached prefix of ``tokens`` (at most ``max_len``) and its last node."""
        tokens = _expect_tokens(tokens)
        if max_len is not None:
            if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 0:
                raise ValueError(f"max_len: expected None or an int >= 0, got {max_len!r}")
            tokens = tokens[:max_len]
        node, _ = self._walk(tokens, self._tick())
        slots, up = [], node
        while up is not self.root:
            slots[:0] = up.slots
            up = up.parent
        return slots, node

    def insert(self, tokens, slots) -> int:
        """Cache ``tokens`` in ``slots``; returns how many leading tokens were cached already."""
        tokens = _expect_tokens(tokens)
        if not isinstance(slots, (list, tuple)) or len(slots) != len(tokens):
            raise ValueError(f"slots: expected one slot per token ({len(tokens)}), got {slots!r}")
        stamp = self._tick()
        node, i = self._walk(tokens, stamp)
        if i < len(tokens):
            leaf = _Node(node, tokens[i:], list(slots[i:]), stamp, next(self._births))
            node.children[tokens[i]] = leaf
            self._nodes += 1
            self._evictable += len(leaf.tokens)  # a new leaf is unlocked, whatever its parent
        return i

    def lock(self, node) -> None:
        """Protect ``node`` and every node above it (a running request's prefix)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.tokens)
                self._protected += len(node.tokens)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node) -> None:
        """Undo one ``lock(node)``. ValueError when ``node`` is not locked."""
        if node is not self.root and node.lock_ref == 0:
            raise ValueError("node: unlock of a node that is not locked")
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node.tokens)
                self._evictable += len(node.tokens)
            node = node.parent

    def _leaves(self) -> list[tuple[int, int, _Node]]:
        found, stack = [], [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not self.root and not node.children and node.lock_ref == 0:
                found.append((*node.order(), node))
        return found

    def evict(self, n_tokens: int) -> list[int]:
        """Free at least ``n_tokens`` slots (or all that are unlocked) by removing unlocked leaves,
        least recently used first; a parent left childless joins the candidates. The slots freed."""
        heap = [(stamp, born, id(node), node) for stamp, born, node in self._leaves()]
        heapq.heapify(heap)
        freed: list[int] = []
        while len(freed) < n_tokens and heap:
            *_, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.tokens[0]]
            freed += leaf.slots
            self._evictable -= len(leaf.tokens)
            self._nodes -= 1
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (*parent.order(), id(parent), parent))
        return freed


class PrefixPool:
    """A pool of ``num_slots`` KV slots serving requests through a RadixCache."""

    def __init__(self, num_slots: int):
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots: expected an int >= 1, got {num_slots!r}")
        self.cache = RadixCache()
        self._free = list(range(num_slots))  # a min-heap: the lowest free slot is handed out first
        self._requests: dict = {}  # req_id -> [tokens, slots, reused, locked node]

    @property
    def num_free(self) -> int:
        """Slots neither cached in the tree nor held by a running request."""
        return len(self._free)

    def _expect_request(self, req_id) -> list:
        if req_id not in self._requests:
            raise ValueError(f"req_id: expected a running request, got {req_id!r}")
        return self._requests[req_id]

    def _take(self, n: int) -> list[int]:
        """n slots, lowest first, evicting unlocked leaves when too few are free."""
        if n > len(self._free) + self.cache.evictable_size:
            raise OutOfSlotsError(f"{n} slot(s) needed, {len(self._free)} free and "
                                  f"{self.cache.evictable_size} evictable")
        if n > len(self._free):
            for slot in self.cache.evict(n - len(self._free)):
                heapq.heappush(self._free, slot)
        return [heapq.heappop(self._free) for _ in range(n)]

    def begin(self, req_id, tokens) -> int:
        """Admit a request: reuse its longest cached prefix (at most len - 1 tokens), lock it, take
        slots for the rest. Returns the tokens reused."""
        if req_id in self._requests:
            raise ValueError(f"req_id: {req_id!r} is already running")
        tokens = _expect_tokens(tokens)
        reused, node = self.cache.match(tokens, max_len=len(tokens) - 1)  # one token must be computed
        self.cache.lock(node)
        try:
            own = self._take(len(tokens) - len(reused))
        except OutOfSlotsError:
            self.cache.unlock(node)
            raise
        self._requests[req_id] = [tokens, reused + own, len(reused), node]
        return len(reused)

    def extend(self, req_id, token: int) -> None:
        """One generated token: one more slot."""
        request = self._expect_request(req_id)
        request[1] += self._take(1)
        request[0].append(token)

    def finish(self, req_id) -> None:
        """Cache the request's tokens, free its slots the tree already had, unlock its prefix."""
        tokens, slots, reused, node = self._expect_request(req_id)
        cached = self.cache.insert(tokens, slots)
        for slot in slots[reused:cached]:  # duplicates of cached tokens: the tree keeps its own
            heapq.heappush(self._free, slot)
        self.cache.unlock(node)
        del self._requests[req_id]

    def slots(self, req_id) -> list[int]:
        """The request's slot per token so far (a copy)."""
        return list(self._expect_request(req_id)[1])
