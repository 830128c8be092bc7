"""Known mistakes of kata 05 — each the reference with one bug."""
from grader.mistakes import Mistake

_WRITE = ("        K[:, :, start:end] = k_new  # (B, Hkv, T, D) copied into slots start … end-1, in place\n"
          "        V[:, :, start:end] = v_new\n")
_CHECK = "        if end > self.max_len:  # check before writing: a failed update must change nothing\n"
_RAISE = (_CHECK
          + '            raise CacheFullError(f"k_new: {end - start} new token(s) after the {start} in layer {layer} "\n'
          + '                                 f"exceed max_len={self.max_len}")\n')
_MASK = "        return cols <= rows  # (T, L)\n"

MISTAKES = [
    Mistake(
        name="rebuilding the buffer with torch.cat",
        why="each update allocates a new max_len tensor and copies the whole cache into it: the cost "
            "preallocation exists to remove, and keys[layer] is no longer the buffer made in __init__.",
        hint="How do you write into slots start … end-1 of an existing tensor without creating another one?",
        edits=((_WRITE,
                "        K = self.keys[layer] = torch.cat([K[:, :, :start], k_new, K[:, :, end:]], dim=2)\n"
                "        V = self.values[layer] = torch.cat([V[:, :, :start], v_new, V[:, :, end:]], dim=2)\n"),),
    ),
    Mistake(
        name="unfilled slots left visible in the mask",
        why="the slots after seq_len hold zeros or stale values; a mask that lets the query see them mixes junk "
            "into the attention.",
        hint="Which columns of the mask belong to slots nothing has been written to yet?",
        edits=((_MASK, "        return (cols <= rows) | (cols >= filled)  # (T, L)\n"),),
    ),
    Mistake(
        name="mask without the causal part",
        why="hiding only the unfilled slots lets every token of a multi-token update see the tokens written "
            "after it in the same chunk.",
        hint="In a 3-token update, which of the other two new tokens may the first one see?",
        edits=((_MASK, "        return cols < filled  # (T, L)\n"),),
    ),
    Mistake(
        name="mask rows off by one",
        why="each row is placed one slot too far right, so a token sees the next token, and the last one sees "
            "an unfilled slot.",
        hint="After 5 tokens, attention_mask(1) has one row: which is the last column it may see, 4 or 5?",
        edits=(("+ (filled - new_len)  # (T, 1)", "+ (filled - new_len + 1)  # (T, 1)"),),
    ),
    Mistake(
        name="mask only as wide as the filled slots",
        why="attention runs over the whole buffer of max_len slots, so the mask needs a column for every slot, "
            "filled or not.",
        hint="What is the last dimension of q @ keys[layer].transpose(-2, -1)?",
        edits=(("cols = torch.arange(self.max_len, device=device)", "cols = torch.arange(filled, device=device)"),),
    ),
    Mistake(
        name="one position counter for all layers",
        why="in a model loop layer 0 writes its tokens and moves the shared counter, so layer 1 writes after "
            "them; every layer needs its own position.",
        hint="After update(0, …) with 3 tokens and nothing written to layer 1, what is seq_len(1)?",
        edits=(("        self._pos[layer] = end\n", "        self._pos = [end] * len(self._pos)\n"),),
    ),
    Mistake(
        name="silent truncation on overflow",
        why="dropping the tokens that do not fit loses them without telling the caller; the README asks for "
            "CacheFullError.",
        hint="What should the caller learn when 3 tokens arrive and only 1 slot is left?",
        edits=((_RAISE, "        if end > self.max_len:\n"
                        "            end = self.max_len\n"
                        "            k_new, v_new = k_new[:, :, : end - start], v_new[:, :, : end - start]\n"),),
    ),
    Mistake(
        name="writing the part that fits before raising",
        why="the update raises CacheFullError but has already written into the last slots; a failed update must "
            "leave the cache exactly as it was.",
        hint="Can you know whether the tokens fit before you touch the buffers?",
        edits=((_CHECK, "        if end > self.max_len:\n"
                        "            fit = self.max_len - start\n"
                        "            K[:, :, start:], V[:, :, start:] = k_new[:, :, :fit], v_new[:, :, :fit]\n"),),
    ),
    Mistake(
        name="position moved although the update failed",
        why="seq_len grows before the overflow check, so after the CacheFullError the layer claims tokens it "
            "never stored.",
        hint="At which point of update is it safe to move the layer's position?",
        edits=((_CHECK, "        self._pos[layer] = end\n" + _CHECK),),
    ),
    Mistake(
        name="reset that reallocates",
        why="making fresh tensors on reset throws away the buffers the caller (and a compiled graph) holds; "
            "a reset only needs to move the positions back to 0.",
        hint="What does the next sequence need from the old buffers: new memory, or just seq_len = 0?",
        edits=(("        self._pos = [0] * len(self._pos)\n",
                "        self._pos = [0] * len(self._pos)\n"
                "        self.keys = [torch.zeros_like(k) for k in self.keys]\n"
                "        self.values = [torch.zeros_like(v) for v in self.values]\n"),),
    ),
    Mistake(
        name="reset that forgets only layer 0",
        why="the other layers keep their positions, so the next sequence is written after the old one there.",
        hint="After reset(), what should seq_len(layer) be for every layer?",
        edits=(("        self._pos = [0] * len(self._pos)\n", "        self._pos[0] = 0\n"),),
    ),
    Mistake(
        name="returning only the filled slots",
        why="a slice K[:, :, :end] is a new tensor object of a new shape every step; the API returns the "
            "buffers themselves and the mask hides what is not filled.",
        hint="What shape does update return, and is it the same object as keys[layer]?",
        edits=(("        return K, V\n", "        return K[:, :, :end], V[:, :, :end]\n"),),
    ),
    Mistake(
        name="negative layer numbers accepted",
        why="Python lists take layer=-1 as the last layer, so a bad index silently writes to the wrong layer.",
        hint="Which layer numbers exist in a cache of n_layers layers?",
        edits=(("not 0 <= layer < len(self.keys)", "not -len(self.keys) <= layer < len(self.keys)"),),
    ),
    Mistake(
        name="a size of 0 accepted",
        why="a cache with max_len=0 (or no layers, no heads) is built without complaint and fails far away, "
            "at the first update or inside attention, where nobody can tell which size was wrong.",
        hint="Is 0 a positive int? Which check lets it through?",
        edits=(("or not isinstance(value, int) or value < 1:", "or not isinstance(value, int) or value < 0:"),),
    ),
    Mistake(
        name="a full layer refuses its last slot",
        why="an update that ends exactly at max_len fits, but `end >= max_len` raises CacheFullError for it: "
            "the cache never holds more than max_len - 1 tokens.",
        hint="Slots run 0 … max_len-1; after writing slots start … end-1, is end == max_len an overflow?",
        edits=(("        if end > self.max_len:", "        if end >= self.max_len:"),),
    ),
]
