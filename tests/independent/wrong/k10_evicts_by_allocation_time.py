"""Kata 10, WRONG: evicts the cached block allocated longest ago (its allocation time), not the one released longest ago."""
from __future__ import annotations

import hashlib
import heapq
import itertools


class OutOfBlocksError(RuntimeError):
    """Raised when a prompt or a decode token cannot get a block; the cache is unchanged."""


def _digest(prev: bytes, block) -> bytes:
    h = hashlib.blake2b(prev, digest_size=16)
    for t in block:
        s = str(int(t)).encode()
        h.update(len(s).to_bytes(2, "little"))
        h.update(s)
    return h.digest()


def _hashes(token_ids, block_size):
    out, prev = [], b"\x00" * 16
    for i in range(len(token_ids) // block_size):
        prev = _digest(prev, token_ids[i * block_size:(i + 1) * block_size])
        out.append(prev)
    return out


def block_hashes(token_ids, block_size):
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size: expected an int of at least 1, got {block_size!r}")
    return [int.from_bytes(d, "little") for d in _hashes(list(token_ids), block_size)]


class PrefixCache:
    def __init__(self, num_blocks, block_size):
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
            raise ValueError(f"num_blocks: expected an int of at least 1, got {num_blocks!r}")
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size: expected an int of at least 1, got {block_size!r}")
        self._P = block_size
        self._free_heap = list(range(num_blocks))
        heapq.heapify(self._free_heap)
        self._lru = []  # (stamp, block); valid only when self._stamp[block] == stamp
        self._stamp = {}  # evictable block -> its release stamp
        self._tick = itertools.count()
        self._born = {}
        self._refs = {}  # block -> refcount (> 0 only)
        self._key = {}  # block -> digest
        self._where = {}  # digest -> block
        self._seqs = {}  # seq_id -> (table, tokens, digests)

    # ------------------------------------------------------------------------------------------
    def _n_available(self):
        return len(self._free_heap) + len(self._stamp)

    def _grab(self):
        if self._free_heap:
            b = heapq.heappop(self._free_heap)
        else:
            while True:
                stamp, b = heapq.heappop(self._lru)
                if self._stamp.get(b) == stamp:
                    break
            del self._stamp[b]
            del self._where[self._key.pop(b)]
        self._refs[b] = 1
        self._born[b] = next(self._tick)  # wrong: the stamp is taken when the block is allocated
        return b

    def _register(self, b, d):
        if d not in self._where:
            self._where[d] = b
            self._key[b] = d

    def _release(self, b):
        self._refs[b] -= 1
        if self._refs[b]:
            return
        del self._refs[b]
        if b in self._key:
            s = self._born[b]
            self._stamp[b] = s
            heapq.heappush(self._lru, (s, b))
        else:
            heapq.heappush(self._free_heap, b)

    # ------------------------------------------------------------------------------------------
    def allocate(self, seq_id, token_ids):
        if seq_id in self._seqs:
            raise ValueError(f"seq_id: {seq_id!r} already names a live sequence")
        toks = list(token_ids)
        if not toks:
            raise ValueError("token_ids: a prompt of at least one token is needed, got none")
        P = self._P
        ds = _hashes(toks, P)
        hit_blocks = []
        for d in ds[:(len(toks) - 1) // P]:
            if d not in self._where:
                break
            hit_blocks.append(self._where[d])
        need = (len(toks) + P - 1) // P - len(hit_blocks)
        reserved = len([b for b in hit_blocks if b in self._stamp])
        if self._n_available() - reserved < need:
            raise OutOfBlocksError(f"allocate: {need} blocks needed for seq_id {seq_id!r}, "
                                   f"{self._n_available() - reserved} available")
        for b in hit_blocks:
            if b in self._stamp:
                del self._stamp[b]  # its heap entry is now stale
                self._refs[b] = 1
            else:
                self._refs[b] += 1
        table = hit_blocks + [self._grab() for _ in range(need)]
        for i in range(len(hit_blocks), len(ds)):
            self._register(table[i], ds[i])
        self._seqs[seq_id] = (table, toks, ds)
        return len(hit_blocks) * P

    def _get(self, seq_id):
        try:
            return self._seqs[seq_id]
        except (KeyError, TypeError):
            raise ValueError(f"seq_id: no sequence {seq_id!r}") from None

    def append_token(self, seq_id, token_id):
        table, toks, ds = self._get(seq_id)
        P = self._P
        if len(toks) == P * len(table):
            if not self._n_available():
                raise OutOfBlocksError(f"append_token: no block for seq_id {seq_id!r}")
            table.append(self._grab())
        toks.append(token_id)
        if len(toks) % P == 0:
            d = _digest(ds[-1] if ds else b"\x00" * 16, toks[-P:])
            ds.append(d)
            self._register(table[len(ds) - 1], d)

    def free(self, seq_id):
        table, _, _ = self._get(seq_id)
        del self._seqs[seq_id]
        for b in reversed(table):
            self._release(b)

    def block_table(self, seq_id):
        return list(self._get(seq_id)[0])

    @property
    def num_free_blocks(self):
        return self._n_available()

    @property
    def num_cached_blocks(self):
        return len(self._where)
