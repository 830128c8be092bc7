"""Kata 10, written from its README: sha256 over the previous hash and the block's ids as text, an OrderedDict as the eviction order, a FIFO deque of free blocks, counting before changing."""
from __future__ import annotations

import hashlib
from collections import OrderedDict, deque


class OutOfBlocksError(RuntimeError):
    """No block can be had for what was asked. Nothing was changed."""


def _check_block_size(block_size):
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size: expected an int >= 1, got {block_size!r}")


def _chain(prev, block) -> int:
    text = ("root" if prev is None else str(prev)) + "|" + ",".join(str(int(t)) for t in block)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def block_hashes(token_ids, block_size):
    _check_block_size(block_size)
    ids = list(token_ids)
    out, prev = [], None
    for start in range(0, len(ids) - block_size + 1, block_size):
        prev = _chain(prev, ids[start:start + block_size])
        out.append(prev)
    return out


class PrefixCache:
    def __init__(self, num_blocks, block_size):
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        self.P = block_size
        self._free = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # first = least recently released
        self._ref = [0] * num_blocks
        self._hash_of: dict[int, int] = {}  # block -> hash
        self._block_of: dict[int, int] = {}  # hash -> block
        self._tables: dict = {}
        self._tokens: dict = {}
        self._chains: dict = {}  # seq -> hashes of its full blocks

    # -- blocks ---------------------------------------------------------------------------------
    def _take(self) -> int:
        if self._free:
            b = self._free.popleft()
        else:
            b, _ = self._evictable.popitem(last=False)
            h = self._hash_of.pop(b)
            del self._block_of[h]
        self._ref[b] = 1
        return b

    def _cache(self, block, h):
        if h in self._block_of:
            return  # the older block keeps it
        self._block_of[h] = block
        self._hash_of[block] = h

    # -- API ------------------------------------------------------------------------------------
    def allocate(self, seq_id, token_ids):
        if seq_id in self._tables:
            raise ValueError(f"seq_id: {seq_id!r} is already in use")
        ids = [int(t) for t in token_ids]
        if not ids:
            raise ValueError("token_ids: expected at least one token, got an empty list")
        P = self.P
        hashes = block_hashes(ids, P)
        limit = (len(ids) - 1) // P  # never the block holding the last token
        hits = []
        for h in hashes[:limit]:
            b = self._block_of.get(h)
            if b is None:
                break
            hits.append(b)
        n_new = -(-len(ids) // P) - len(hits)
        evictable_hits = sum(1 for b in hits if self._ref[b] == 0)
        can = len(self._free) + len(self._evictable) - evictable_hits
        if n_new > can:
            raise OutOfBlocksError(f"allocate({seq_id!r}): needs {n_new} new blocks, {can} can be had")
        for b in hits:
            if self._ref[b] == 0:
                del self._evictable[b]
            self._ref[b] += 1
        fresh = [self._take() for _ in range(n_new)]
        table = hits + fresh
        for j in range(len(hits), len(hashes)):
            self._cache(table[j], hashes[j])
        self._tables[seq_id] = table
        self._tokens[seq_id] = ids
        self._chains[seq_id] = hashes
        return len(hits) * P

    def _seq(self, seq_id):
        if seq_id not in self._tables:
            raise ValueError(f"seq_id: unknown sequence {seq_id!r}")

    def append_token(self, seq_id, token_id):
        self._seq(seq_id)
        toks, table, P = self._tokens[seq_id], self._tables[seq_id], self.P
        if len(toks) == len(table) * P:
            if not self._free and not self._evictable:
                raise OutOfBlocksError(f"append_token({seq_id!r}): no block left")
            table.append(self._take())
        toks.append(int(token_id))
        if len(toks) % P == 0:
            chain = self._chains[seq_id]
            h = _chain(chain[-1] if chain else None, toks[-P:])
            chain.append(h)
            self._cache(table[len(chain) - 1], h)

    def free(self, seq_id):
        self._seq(seq_id)
        table = self._tables.pop(seq_id)
        del self._tokens[seq_id], self._chains[seq_id]
        for b in reversed(table):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if b in self._hash_of:
                    self._evictable[b] = None
                else:
                    self._free.append(b)

    def block_table(self, seq_id):
        self._seq(seq_id)
        return list(self._tables[seq_id])

    @property
    def num_free_blocks(self):
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self):
        return len(self._block_of)
