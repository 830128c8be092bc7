"""Known mistakes of kata 10 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="block hashes not chained",
        why="each block is hashed on its own tokens only, so equal blocks after different prefixes look the same; "
            "their keys and values differ, because they depend on every earlier token.",
        hint="Which tokens does block i's cached K and V depend on? Let hash i take in hash i - 1.",
        edits=(("previous = _chain(previous, token_ids[start:start + block_size])",
                "previous = _chain(None, token_ids[start:start + block_size])"),),
    ),
    Mistake(
        name="partly filled block hashed",
        why="the last block of a prompt is hashed before it is full, so it is cached and shared while its owner "
            "still writes tokens into it.",
        hint="How many full blocks do n tokens make? Only those can be named by a hash.",
        edits=(("range(0, len(token_ids) - block_size + 1, block_size)", "range(0, len(token_ids), block_size)"),),
    ),
    Mistake(
        name="whole prompt counted as reused",
        why="when every block of the prompt is cached, nothing is left to compute, but the model needs the logits "
            "of the last prompt token to pick the next one.",
        hint="At most len(token_ids) - 1 tokens can be reused. Which block holds the last token?",
        edits=(("for block_hash in hashes[:(len(tokens) - 1) // P]:", "for block_hash in hashes:"),),
    ),
    Mistake(
        name="a hit block stays evictable",
        why="a cached block that a new prompt reuses is still in the eviction order, so it can be evicted and "
            "handed out again while a sequence still reads it.",
        hint="When a prompt hits an unreferenced cached block, is that block still a candidate for eviction?",
        edits=(("            self._evictable.pop(block, None)  # in use again: out of the eviction order\n", ""),),
    ),
    Mistake(
        name="eviction takes a freed sequence's head first",
        why="the blocks of a freed sequence join the eviction order from the head, so its first block is evicted "
            "first and the blocks after it can never be hit again, yet stay cached.",
        hint="A prompt can hit block i only if it hits blocks 0 … i - 1. Which block of a freed sequence is the "
             "least useful?",
        edits=(("for block in reversed(self._tables.pop(seq_id)):", "for block in self._tables.pop(seq_id):"),),
    ),
    Mistake(
        name="free forgets cached blocks",
        why="a freed block that holds a hash goes back to the free blocks and loses its hash, so the next request "
            "with the same prompt finds nothing cached once the first one has finished.",
        hint="After free, should a block whose prefix is known stay findable until its memory is needed?",
        edits=(("                if block in self._hash_of:\n"
                "                    self._evictable[block] = None  # at the back of the eviction order\n"
                "                else:\n"
                "                    self._free.append(block)\n",
                "                if block in self._hash_of:\n"
                "                    del self._block_of[self._hash_of.pop(block)]\n"
                "                self._free.append(block)\n"),),
    ),
    Mistake(
        name="reuse does not raise the refcount",
        why="a block shared by a second sequence still counts one holder, so when either sequence is freed the block "
            "looks unreferenced and can be evicted under the other.",
        hint="When a prompt hits a block another sequence holds, how many tables point at it now?",
        edits=(("            self._refs[block] += 1\n", "            self._refs[block] = 1\n"),),
    ),
    Mistake(
        name="allocate not atomic when out of blocks",
        why="hit blocks are taken and fresh ones allocated before it is known that the prompt can get all of them, "
            "so OutOfBlocksError comes with blocks held by no table.",
        hint="Can you count the new blocks and the blocks you can get before you touch anything?",
        edits=(("        if needed > len(self._free) + len(self._evictable) - woken:  # check before act\n"
                "            raise OutOfBlocksError(f\"allocate: {len(tokens)} tokens need {needed} new block(s), \"\n"
                "                                   f\"{self.num_free_blocks - woken} can be had\")\n", ""),),
    ),
    Mistake(
        name="blocks filled by decode tokens are not cached",
        why="a block that becomes full during decoding never gets its hash, so a follow-up prompt that repeats the "
            "conversation so far cannot reuse the generated part.",
        hint="When append_token fills a block, what does it have in common with a full prompt block?",
        edits=(("            self._register(table[-1], hashes[-1])\n", ""),),
    ),
    Mistake(
        name="evicting while free blocks remain",
        why="a new block is taken by evicting a cached block even though a free block is available, so a prefix "
            "that could still be hit is thrown away for nothing.",
        hint="Which blocks cost nothing to hand out, and which hold something a later prompt could reuse?",
        edits=(("        if self._free:\n            block = self._free.pop()",
                "        if self._free and not self._evictable:\n            block = self._free.pop()"),),
    ),
]
