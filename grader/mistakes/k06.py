"""Known mistakes of kata 06 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="no copy-on-write",
        why="a forked sequence writes its new tokens into the partly filled block it still shares, "
            "so the other sequence's tokens at those positions are overwritten.",
        hint="Before reserve hands out a slot in the last block, who else holds that block?",
        edits=(("copy_last = n_tokens > 0 and length % P > 0 and self.allocator.refcount(table[-1]) > 1",
                "copy_last = False"),),
    ),
    Mistake(
        name="copy-on-write copies layer 0 only",
        why="the copied block holds the first tokens of that block in every layer; copying one layer leaves "
            "the other layers of the new block empty.",
        hint="A block id indexes k_pages[layer] and v_pages[layer] of every layer: which ones need the copy?",
        edits=(("for layer in range(self.n_layers):  # the block holds part of every layer's cache",
                "for layer in range(1):"),),
    ),
    Mistake(
        name="copying a full shared block",
        why="a full block is never written again, so copying it on the next append only wastes a block "
            "and ends the sharing fork was for.",
        hint="New tokens of a sequence whose last block is full go where? Does that block need a private copy?",
        edits=(("and length % P > 0 and self.allocator", "and length > 0 and self.allocator"),),
    ),
    Mistake(
        name="copy-on-write keeps the reference to the shared block",
        why="after the copy this sequence no longer holds the shared block, but its count still says so, "
            "so the block is never freed.",
        hint="When you redirect a table entry to the fresh copy, what happens to the count of the old block?",
        edits=(("            self.allocator.decref(shared)\n", ""),),
    ),
    Mistake(
        name="reserve not atomic when out of blocks",
        why="allocating (and copying) before knowing that every block needed is free leaves some blocks "
            "taken and the table grown when OutOfBlocksError finally comes.",
        hint="Can you count the blocks a reservation needs, copy included, before touching anything?",
        edits=(("        if new_blocks + copy_last > self.allocator.num_free:\n"
                "            raise OutOfBlocksError(f\"reserve: {n_tokens} token(s) for sequence {seq_id!r} need \"\n"
                "                                   f\"{new_blocks + copy_last} free block(s), {self.allocator.num_free} left\")\n",
                ""),),
    ),
    Mistake(
        name="slots are logical positions",
        why="the slot of a token is in the physical block its table points to, not at its position in the sequence.",
        hint="Token at position p lives in logical block p // block_size. Where is that block in the pages?",
        edits=(("slots = [table[p // P] * P + p % P for p in", "slots = [p for p in"),),
    ),
    Mistake(
        name="gather returns whole blocks",
        why="the last block is usually only partly filled; its unused slots hold zeros or another "
            "sequence's old tokens.",
        hint="How many tokens does the sequence hold, and how many slots do its blocks have?",
        edits=(("return K[:, :S], V[:, :S]", "return K, V"),),
    ),
    Mistake(
        name="fork without incref",
        why="the child holds every block of the parent, so each block has one more holder; without counting "
            "it, freeing one sequence frees blocks the other still reads.",
        hint="After fork, how many block tables point at the parent's first block?",
        edits=(("            self.allocator.incref(block)  # one more table holds it\n", "            pass\n"),),
    ),
    Mistake(
        name="child shares the parent's table list",
        why="the child's table is the very same list object as the parent's, so blocks reserved for one "
            "sequence appear in the other's table too.",
        hint="fork must share the blocks, not the Python list that holds their ids.",
        edits=(("self._tables[child_id] = list(self._tables[parent_id])", "self._tables[child_id] = self._tables[parent_id]"),),
    ),
    Mistake(
        name="free leaks the blocks",
        why="dropping the table without decref leaves every block counted as held, so the free pool shrinks "
            "with each finished request.",
        hint="When a sequence goes away, what must happen to each block in its table?",
        edits=(("        for block in self._tables.pop(seq_id):\n            self.allocator.decref(block)\n",
                "        self._tables.pop(seq_id)\n"),),
    ),
    Mistake(
        name="decref never frees",
        why="a block whose count reaches zero must go back to the free pool, or the cache runs out of blocks.",
        hint="What should decref do when the last holder lets go?",
        edits=(("            self._free.append(block)", "            pass"),),
    ),
    Mistake(
        name="silent double free",
        why="decref of a block that is already free is a bookkeeping bug in the caller; ignoring it hides "
            "the bug and corrupts the counts.",
        hint="What should decref do when the block's count is already zero?",
        edits=(('self._expect_held(block, "decref")', "self._expect_known(block)"),),
    ),
    Mistake(
        name="incref of a free block accepted",
        why="a free block given a holder stays on the free list, so allocate() can hand it out again while a "
            "table still points at it: two sequences then write into one block.",
        hint="Which blocks may gain a holder: any known id, or only one that is allocated?",
        edits=(('self._expect_held(block, "incref")', "self._expect_known(block)"),),
    ),
    Mistake(
        name="slots as int32",
        why="reserve returned int32 slots; the API promises a LongTensor (int64), the dtype PyTorch indexing and "
            "the callers of reserve expect.",
        hint="Which dtype does torch.tensor(...) get when you pass dtype=, and which one does the API promise?",
        edits=(("torch.tensor(slots, dtype=torch.long)", "torch.tensor(slots, dtype=torch.int32)"),),
    ),
    Mistake(
        name="a freed id cannot be added again",
        why="free drops the table but keeps the length, and add_sequence looks for the id among the lengths: "
            "an id used once is refused forever, although serving engines reuse request ids.",
        hint="After free(seq_id), is any trace of seq_id left in your dicts?",
        edits=(("        del self._lens[seq_id]\n", ""),
               ("        if seq_id in self._tables:\n            raise ValueError(f\"seq_id: sequence {seq_id!r} is already",
                "        if seq_id in self._lens:\n            raise ValueError(f\"seq_id: sequence {seq_id!r} is already")),
    ),
]
