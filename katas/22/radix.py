"""Kata 22 — a radix-tree prefix cache.

Fill in ``RadixCache`` and ``PrefixPool`` below, then run ``pytest katas/22``. The README explains
the idea. Page size 1: every token has one KV slot (an int naming a row of a paged cache like
kata 06's). The tree keeps the books only: which token runs are cached in which slots, who uses them.
"""
from __future__ import annotations


class OutOfSlotsError(RuntimeError):
    """Not enough slots can be had, even by evicting every unlocked leaf. Nothing was taken."""


class RadixCache:
    """Cached token runs in a compressed trie; locked paths are kept, unlocked leaves evicted LRU first."""

    def __init__(self):
        """An empty tree: only the root, all sizes 0."""
        raise NotImplementedError("kata 22: RadixCache — see README, task 1")

    def match(self, tokens, max_len: int | None = None):
        """(slots of the longest cached prefix of ``tokens``, at most ``max_len`` long; the node it ends at).
        A match ending inside a run splits that node first. Takes a tick."""
        raise NotImplementedError("kata 22: RadixCache.match — see README, task 1")

    def insert(self, tokens, slots) -> int:
        """Cache ``tokens`` in ``slots``; returns how many leading tokens were cached already (the tree
        keeps its slots for those). Takes a tick."""
        raise NotImplementedError("kata 22: RadixCache.insert — see README, task 1")

    def lock(self, node) -> None:
        """Protect ``node`` and every node above it (a count per node)."""
        raise NotImplementedError("kata 22: RadixCache.lock — see README, task 2")

    def unlock(self, node) -> None:
        """Undo one ``lock(node)``. ValueError when ``node`` is not locked."""
        raise NotImplementedError("kata 22: RadixCache.unlock — see README, task 2")

    def evict(self, n_tokens: int) -> list[int]:
        """Remove unlocked leaves, least recently used first (a childless parent joins the candidates),
        until at least ``n_tokens`` slots are freed or none is left. Returns the slots freed."""
        raise NotImplementedError("kata 22: RadixCache.evict — see README, task 2")

    @property
    def evictable_size(self) -> int:
        """Tokens cached in unlocked nodes."""
        raise NotImplementedError("kata 22: RadixCache.evictable_size — see README, task 1")

    @property
    def protected_size(self) -> int:
        """Tokens cached in locked nodes."""
        raise NotImplementedError("kata 22: RadixCache.protected_size — see README, task 1")

    @property
    def total_size(self) -> int:
        """Every cached token: evictable plus protected."""
        raise NotImplementedError("kata 22: RadixCache.total_size — see README, task 1")

    @property
    def num_nodes(self) -> int:
        """Nodes in the tree, the root not counted."""
        raise NotImplementedError("kata 22: RadixCache.num_nodes — see README, task 1")


class PrefixPool:
    """A pool of ``num_slots`` KV slots serving requests through a RadixCache (``self.cache``)."""

    def __init__(self, num_slots: int):
        """Slots 0 … num_slots - 1, all free; an empty tree. ValueError if num_slots is below 1."""
        raise NotImplementedError("kata 22: PrefixPool — see README, task 3")

    def begin(self, req_id, tokens) -> int:
        """Admit a request: reuse its longest cached prefix (at most len - 1 tokens), lock it, take
        the lowest free slots for the rest (evicting when too few). Returns the tokens reused."""
        raise NotImplementedError("kata 22: PrefixPool.begin — see README, task 3")

    def extend(self, req_id, token: int) -> None:
        """One generated token: one more slot."""
        raise NotImplementedError("kata 22: PrefixPool.extend — see README, task 3")

    def finish(self, req_id) -> None:
        """Insert the request's tokens, free its own slots of tokens the tree had, unlock its prefix."""
        raise NotImplementedError("kata 22: PrefixPool.finish — see README, task 3")

    def slots(self, req_id) -> list[int]:
        """The request's slot per token so far (a copy)."""
        raise NotImplementedError("kata 22: PrefixPool.slots — see README, task 3")

    @property
    def num_free(self) -> int:
        """Slots neither cached in the tree nor held by a running request."""
        raise NotImplementedError("kata 22: PrefixPool.num_free — see README, task 3")
