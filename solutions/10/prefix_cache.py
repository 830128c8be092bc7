"""Kata 10 — prefix caching by block hash (reference solution).

Sizes: N blocks, P block size (tokens per block). A block id indexes a paged cache like kata 06's;
this class only keeps the books: which block holds which prefix, who holds which block.
"""
from __future__ import annotations

from collections import OrderedDict


class OutOfBlocksError(RuntimeError):
    """No block can be had for what was asked. Nothing was changed."""


def _expect_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value!r}")


def _chain(previous: int | None, block: list[int]) -> int:
    """The hash of one full block, chained on the hash of everything before it."""
    return hash((previous, tuple(block)))


def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """One hash per full block of ``token_ids`` (len // P of them; a partly filled last block has none).

    Hash i is chained on hash i - 1, so it identifies tokens 0 … (i + 1) * P - 1, the whole prefix.
    Any hash function will do. ValueError naming ``block_size`` when it is below 1.
    """
    _expect_positive("block_size", block_size)
    hashes: list[int] = []
    previous = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):  # full blocks only
        previous = _chain(previous, token_ids[start:start + block_size])
        hashes.append(previous)
    return hashes


class PrefixCache:
    """Block tables whose full blocks are found again by the hash of the prefix they end.

    A block is free (holds nothing), referenced (refcount > 0, in some table) or evictable
    (refcount 0 but holding a hash, so a later prompt can still hit it).
    """

    def __init__(self, num_blocks: int, block_size: int):
        """``num_blocks`` free blocks of ``block_size`` tokens. ValueError if either is below 1."""
        _expect_positive("num_blocks", num_blocks)
        _expect_positive("block_size", block_size)
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack of blocks that hold no hash
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, int] = {}  # block -> the hash it holds
        self._block_of: dict[int, int] = {}  # hash -> the block holding it
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently released first
        self._tables: dict = {}  # seq_id -> its blocks
        self._tokens: dict = {}  # seq_id -> its token ids
        self._hashes: dict = {}  # seq_id -> the hashes of its full blocks

    def _expect_seq(self, seq_id) -> None:
        if seq_id not in self._tables:
            raise ValueError(f"seq_id: expected a sequence in the cache, got {seq_id!r}")

    def _take(self) -> int:
        """A block for new tokens: a free one, else the least recently released cached one."""
        if self._free:
            block = self._free.pop()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            del self._block_of[self._hash_of.pop(block)]  # evicted: its prefix is gone
        else:
            raise OutOfBlocksError(f"all {self.num_blocks} blocks are held by sequences")
        self._refs[block] = 1
        return block

    def _register(self, block: int, block_hash: int) -> None:
        if block_hash not in self._block_of:  # else the older block keeps the hash
            self._block_of[block_hash] = block
            self._hash_of[block] = block_hash

    def allocate(self, seq_id, token_ids: list[int]) -> int:
        """Build the sequence's block table, reusing cached leading blocks; returns the reused tokens.

        At most len(token_ids) - 1 tokens are reused: the last token is always computed. Take every
        new block first (free ones, then evict), then hash and cache the fresh full blocks. Atomic:
        OutOfBlocksError leaves everything as it was. ValueError for an id in use or an empty prompt.
        """
        if seq_id in self._tables:
            raise ValueError(f"seq_id: sequence {seq_id!r} is already in the cache")
        tokens, P = list(token_ids), self.block_size
        if not tokens:
            raise ValueError("token_ids: expected at least one token, got an empty prompt")
        hashes = block_hashes(tokens, P)
        hits = []
        for block_hash in hashes[:(len(tokens) - 1) // P]:  # the block of the last token is always computed
            if block_hash not in self._block_of:
                break
            hits.append(self._block_of[block_hash])
        needed = -(-len(tokens) // P) - len(hits)
        woken = sum(block in self._evictable for block in hits)  # hit blocks can no longer be evicted
        if needed > len(self._free) + len(self._evictable) - woken:  # check before act
            raise OutOfBlocksError(f"allocate: {len(tokens)} tokens need {needed} new block(s), "
                                   f"{self.num_free_blocks - woken} can be had")
        for block in hits:
            self._evictable.pop(block, None)  # in use again: out of the eviction order
            self._refs[block] += 1
        fresh = [self._take() for _ in range(needed)]
        for index, block in enumerate(fresh, start=len(hits)):  # hashed only once every block is taken
            if index < len(hashes):
                self._register(block, hashes[index])
        self._tables[seq_id], self._tokens[seq_id], self._hashes[seq_id] = hits + fresh, tokens, hashes
        return len(hits) * P

    def append_token(self, seq_id, token_id: int) -> None:
        """One decode token: a new block when the last is full (or OutOfBlocksError, nothing changed);
        a block that becomes full is hashed and cached. ValueError for an unknown id."""
        self._expect_seq(seq_id)
        tokens, table, P = self._tokens[seq_id], self._tables[seq_id], self.block_size
        if len(tokens) % P == 0:
            table.append(self._take())  # raises before anything changed
        tokens.append(token_id)
        if len(tokens) % P == 0:
            hashes = self._hashes[seq_id]
            hashes.append(_chain(hashes[-1] if hashes else None, tokens[-P:]))
            self._register(table[-1], hashes[-1])

    def free(self, seq_id) -> None:
        """Drop the sequence's references, tail first. A block left unreferenced stays cached
        (evictable) if it holds a hash, else it is free. ValueError for an unknown id."""
        self._expect_seq(seq_id)
        for block in reversed(self._tables.pop(seq_id)):  # tail first: the deepest block is the least useful
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._hash_of:
                    self._evictable[block] = None  # at the back of the eviction order
                else:
                    self._free.append(block)
        del self._tokens[seq_id], self._hashes[seq_id]

    def block_table(self, seq_id) -> list[int]:
        """The block of each logical block of the sequence (a copy). ValueError for an unknown id."""
        self._expect_seq(seq_id)
        return list(self._tables[seq_id])

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new prompt could get: free ones plus evictable ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a hash, referenced or not."""
        return len(self._hash_of)
