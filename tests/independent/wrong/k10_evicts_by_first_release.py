"""Kata 10, WRONG: a cached block keeps the time of its first release as its eviction stamp; a hit followed by a second release does not move it to the back of the eviction order."""
from __future__ import annotations

import copy


class OutOfBlocksError(RuntimeError):
    pass


def block_hashes(token_ids, block_size):
    if type(block_size) is not int or block_size < 1:
        raise ValueError(f"block_size must be an int of at least 1 (got {block_size!r})")
    toks = tuple(token_ids)
    hashes = []
    h = hash(("prefix-root",))
    for i in range(len(toks) // block_size):
        h = hash((h, toks[i * block_size:(i + 1) * block_size]))
        hashes.append(h)
    return hashes


class _Block:
    __slots__ = ("refs", "hash", "released_at")

    def __init__(self):
        self.refs = 0
        self.hash = None
        self.released_at = None  # set while evictable


class PrefixCache:
    def __init__(self, num_blocks, block_size):
        if type(num_blocks) is not int or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int of at least 1 (got {num_blocks!r})")
        if type(block_size) is not int or block_size < 1:
            raise ValueError(f"block_size must be an int of at least 1 (got {block_size!r})")
        self.block_size = block_size
        self.blocks = [_Block() for _ in range(num_blocks)]
        self.free_stack = list(range(num_blocks))  # pop() gives the highest id first
        self.by_hash = {}
        self.clock = 0
        self.seqs = {}  # seq_id -> {"table": [...], "n": tokens, "last_hash": h or None, "tail": [...]}

    def _evictable(self):
        return [b for b, blk in enumerate(self.blocks) if blk.refs == 0 and blk.hash is not None]

    def _get_block(self):
        if self.free_stack:
            b = self.free_stack.pop()
        else:
            cands = self._evictable()
            if not cands:
                raise OutOfBlocksError("no free or evictable block left")
            b = min(cands, key=lambda i: self.blocks[i].released_at)
            blk = self.blocks[b]
            del self.by_hash[blk.hash]
            blk.hash = None
            blk.released_at = None
        self.blocks[b].refs = 1
        return b

    def _publish(self, b, h):
        if h not in self.by_hash:
            self.by_hash[h] = b
            self.blocks[b].hash = h

    def _snapshot(self):
        return copy.deepcopy((self.blocks, self.free_stack, self.by_hash, self.clock, self.seqs))

    def _restore(self, snap):
        self.blocks, self.free_stack, self.by_hash, self.clock, self.seqs = snap

    def allocate(self, seq_id, token_ids):
        if seq_id in self.seqs:
            raise ValueError(f"seq_id {seq_id!r} is in use already")
        toks = list(token_ids)
        if len(toks) == 0:
            raise ValueError("token_ids is empty: a prompt needs at least one token")
        P = self.block_size
        hs = block_hashes(toks, P)
        snap = self._snapshot()
        try:
            table = []
            while len(table) < (len(toks) - 1) // P and hs[len(table)] in self.by_hash:
                b = self.by_hash[hs[len(table)]]
                blk = self.blocks[b]
                blk.refs += 1  # wrong: keeps its first release stamp
                table.append(b)
            hits = len(table)
            while len(table) * P < len(toks):
                table.append(self._get_block())
        except OutOfBlocksError:
            self._restore(snap)
            raise OutOfBlocksError(f"allocate({seq_id!r}) cannot get its blocks") from None
        for i in range(hits, len(hs)):
            self._publish(table[i], hs[i])
        self.seqs[seq_id] = {"table": table, "n": len(toks), "last_hash": hs[-1] if hs else None,
                             "tail": toks[len(hs) * P:]}
        return hits * P

    def _known(self, seq_id):
        if seq_id not in self.seqs:
            raise ValueError(f"seq_id {seq_id!r} is not a known sequence")
        return self.seqs[seq_id]

    def append_token(self, seq_id, token_id):
        s = self._known(seq_id)
        P = self.block_size
        if s["n"] % P == 0:
            s["table"].append(self._get_block())  # raises before any change
        s["n"] += 1
        s["tail"].append(token_id)
        if len(s["tail"]) == P:
            prev = s["last_hash"] if s["last_hash"] is not None else hash(("prefix-root",))
            h = hash((prev, tuple(s["tail"])))
            s["last_hash"] = h
            s["tail"] = []
            self._publish(s["table"][s["n"] // P - 1], h)

    def free(self, seq_id):
        s = self._known(seq_id)
        del self.seqs[seq_id]
        for b in s["table"][::-1]:
            blk = self.blocks[b]
            blk.refs -= 1
            if blk.refs == 0:
                if blk.hash is None:
                    self.free_stack.append(b)
                elif blk.released_at is None:  # wrong: only the first release counts
                    self.clock += 1
                    blk.released_at = self.clock

    def block_table(self, seq_id):
        return self._known(seq_id)["table"][:]

    @property
    def num_free_blocks(self):
        return len(self.free_stack) + len(self._evictable())

    @property
    def num_cached_blocks(self):
        return len(self.by_hash)
