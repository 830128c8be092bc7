"""Known mistakes of kata 14 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="prefetching the layer just computed instead of the next",
        why="update(i) must start the copy of layer i + 1; a copy of layer i itself comes too late for anyone, so "
            "every update finds nothing prefetched and fetches synchronously: a miss per layer, no overlap at all.",
        hint="Which layer will the model ask for right after update(i) returns?",
        edits=(("nxt = (layer + 1) % self.n_layers", "nxt = layer % self.n_layers"),),
    ),
    Mistake(
        name="no wrap-around to layer 0",
        why="after the last layer comes the first layer of the next forward; without prefetching it, layer 0 is a "
            "synchronous miss at every step.",
        hint="What does the model ask for after update(L - 1)? Who starts that copy?",
        edits=(("nxt = (layer + 1) % self.n_layers", "nxt = layer + 1"),
               ("        if self.host_keys[nxt] is not None:\n            self._on_device[nxt], self._ahead",
                "        if nxt < self.n_layers and self.host_keys[nxt] is not None:\n"
                "            self._on_device[nxt], self._ahead")),
    ),
    Mistake(
        name="the whole layer written back every step",
        why="the host already holds the S old tokens; writing the whole returned layer back moves S + T tokens "
            "where T changed, so the bus carries the cache twice per step.",
        hint="Of the S + T tokens update returns, which ones does the host not have yet?",
        edits=(("self._write_back(layer, k, v)", "self.host_keys[layer] = self.host_values[layer] = None\n"
                "        self._write_back(layer, K, V)"),),
    ),
    Mistake(
        name="device copies never dropped",
        why="the point of offloading is that the device holds about two layers; keeping every copy fills the "
            "device with the whole cache again.",
        hint="When update(i + 1) starts, who still needs the device copy of layer i?",
        edits=(("        self._on_device.clear()  # the layer before is done: drop its device copy\n", ""),),
    ),
    Mistake(
        name="the host copy replaced by the new tokens",
        why="the host copy is the authoritative one: the new tokens are appended to it; replacing it keeps only "
            "the last chunk, so the next prefetch brings back one token and attention forgets the rest.",
        hint="After update writes back, how many tokens does the host copy of that layer hold?",
        edits=(("        if self.host_keys[layer] is not None:\n            new_k = torch.cat",
                "        if False:\n            new_k = torch.cat"),),
    ),
    Mistake(
        name="the new tokens kept on the device only",
        why="the next prefetch reads the host copy; when the new tokens never reach it, every later step attends "
            "without the tokens written after the first update of the layer.",
        hint="Where does the next forward's copy of this layer come from, and does it hold this step's tokens?",
        edits=(("        self.host_keys[layer], self.host_values[layer] = new_k, new_v\n",
                "        if self.host_keys[layer] is None:\n"
                "            self.host_keys[layer], self.host_values[layer] = new_k, new_v\n"),),
    ),
    Mistake(
        name="the fetched layer left on the host",
        why="a copy made with .to(offload_device), or no copy at all, leaves the layer in host memory; concatenating "
            "it with the new keys on the GPU raises \"Expected all tensors to be on the same device\".",
        hint="After the fetch, which device are the layer's K and V on? Print .device.",
        edits=(("            return K.to(self.device), V.to(self.device)", "            return K, V"),),
    ),
    Mistake(
        name="a miss not counted",
        why="stats['misses'] counts the updates that found no prefetched copy and had to wait for one; without it "
            "an out-of-order caller cannot see that the overlap was lost.",
        hint="When update fetches a layer itself, what has just happened that stats should record?",
        edits=(("            self._stats[\"misses\"] += 1  # not prefetched in time: fetch it now and wait\n", ""),),
    ),
    Mistake(
        name="swap_out taking host blocks before checking there are enough",
        why="swap_out must check before it acts: taking host blocks one by one and failing half way leaves blocks "
            "taken from the pool for a sequence that never left the device.",
        hint="When the pool is one block short, what does the pool look like after your OutOfHostBlocksError?",
        edits=(("    if len(table) > pool.num_free:  # check before act\n        raise OutOfHostBlocksError",
                "    if len(table) > pool.num_free:  # check before act\n        pool._free.clear()\n"
                "        raise OutOfHostBlocksError"),),
    ),
    Mistake(
        name="swap_in adding the sequence before checking the blocks",
        why="when the device is short of blocks, swap_in must raise OutOfBlocksError with nothing changed; adding "
            "the sequence first leaves an empty sequence behind in the cache.",
        hint="After a swap_in that raised OutOfBlocksError, is the sequence in the cache?",
        edits=(("    if len(host) > cache.allocator.num_free:  # check before act\n        raise OutOfBlocksError",
                "    if len(host) > cache.allocator.num_free:  # check before act\n        cache.add_sequence(seq_id)\n"
                "        raise OutOfBlocksError"),),
    ),
    Mistake(
        name="host blocks not freed after swap_in",
        why="once the sequence is back on the device its host blocks are free again; otherwise the pool shrinks "
            "with every swap and later swap-outs fail for nothing.",
        hint="What happens to the pool's free count over one swap_out and one swap_in?",
        edits=(("    pool._free.extend(reversed(host))\n", ""),),
    ),
    Mistake(
        name="sequence length rounded up to whole blocks by swap_in",
        why="the sequence held `length` tokens, not a whole number of blocks; reserving whole blocks makes "
            "gather return the unused slots of the last block as tokens.",
        hint="How many tokens did the sequence hold before swap_out, and how many does seq_len say after swap_in?",
        edits=(("cache.reserve(seq_id, length)", "cache.reserve(seq_id, len(host) * cache.block_size)"),),
    ),
]
