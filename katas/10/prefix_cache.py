"""Kata 10 — prefix caching by block hash.

Fill in ``block_hashes`` and ``PrefixCache`` below, then run ``pytest katas/10``. The README
explains the idea. Sizes: N blocks, P block size (tokens per block). A block id indexes a paged
cache like kata 06's; this class only keeps the books: which block holds which prefix, who holds
which block. No tensors here.
"""
from __future__ import annotations


class OutOfBlocksError(RuntimeError):
    """No block can be had for what was asked. Nothing was changed."""


def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """One hash per full block of ``token_ids`` (len // P of them; a partly filled last block has none).

    Hash i is chained on hash i - 1, so it identifies tokens 0 … (i + 1) * P - 1, the whole prefix.
    Any hash function will do. ValueError naming ``block_size`` when it is below 1.
    """
    raise NotImplementedError("kata 10: block_hashes — see README, task 1")


class PrefixCache:
    """Block tables whose full blocks are found again by the hash of the prefix they end.

    A block is free (holds nothing), referenced (refcount > 0, in some table) or evictable
    (refcount 0 but holding a hash, so a later prompt can still hit it).
    """

    def __init__(self, num_blocks: int, block_size: int):
        """``num_blocks`` free blocks of ``block_size`` tokens. ValueError if either is below 1."""
        raise NotImplementedError("kata 10: PrefixCache — see README, task 2")

    def allocate(self, seq_id, token_ids: list[int]) -> int:
        """Build the sequence's block table, reusing cached leading blocks; returns the reused tokens.

        At most len(token_ids) - 1 tokens are reused: the last token is always computed. Take every
        new block first (free ones, then evict), then hash and cache the fresh full blocks. Atomic:
        OutOfBlocksError leaves everything as it was. ValueError for an id in use or an empty prompt.
        """
        raise NotImplementedError("kata 10: PrefixCache.allocate — see README, task 2")

    def append_token(self, seq_id, token_id: int) -> None:
        """One decode token: a new block when the last is full (or OutOfBlocksError, nothing changed);
        a block that becomes full is hashed and cached. ValueError for an unknown id."""
        raise NotImplementedError("kata 10: PrefixCache.append_token — see README, task 3")

    def free(self, seq_id) -> None:
        """Drop the sequence's references, tail first. A block left unreferenced stays cached
        (evictable) if it holds a hash, else it is free. ValueError for an unknown id."""
        raise NotImplementedError("kata 10: PrefixCache.free — see README, task 2")

    def block_table(self, seq_id) -> list[int]:
        """The block of each logical block of the sequence (a copy). ValueError for an unknown id."""
        raise NotImplementedError("kata 10: PrefixCache.block_table — see README, task 2")

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new prompt could get: free ones plus evictable ones."""
        raise NotImplementedError("kata 10: PrefixCache.num_free_blocks — see README, task 2")

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a hash, referenced or not."""
        raise NotImplementedError("kata 10: PrefixCache.num_cached_blocks — see README, task 2")
