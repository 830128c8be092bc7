"""Known mistakes of kata 07 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="dropping the sinks",
        why="a plain sliding window throws the first tokens away, and with them the place where a "
            "trained model parks the attention it does not need.",
        hint="Once the cache is full, which tokens must still be there besides the last `window`?",
        edits=(("return list(range(n_sink)) + list(range(seq_len - window, seq_len))",
                "return list(range(seq_len - window, seq_len))"),
               ("K = torch.cat([K[:, :, :self.n_sink], K[:, :, -self.window:]], dim=2)", "K = K[:, :, -self.window:]"),
               ("V = torch.cat([V[:, :, :self.n_sink], V[:, :, -self.window:]], dim=2)", "V = V[:, :, -self.window:]")),
    ),
    Mistake(
        name="keeping original positions",
        why="keys and queries rotated at their positions in the whole stream reach angles the model never saw "
            "in training, and a sink at 0 looks ever further away.",
        hint="After eviction the cache holds n tokens. Which positions should RoPE use for them?",
        edits=(("slots = torch.arange(K.shape[2], device=K.device)",
                "slots = torch.tensor(kept_positions(self.tokens_seen, self.n_sink, self.window), device=K.device)"),
               ("q = apply_rope(self._heads(self.wq(x)), slots, self.rope_base)",
                "q = apply_rope(self._heads(self.wq(x)), slots + cache.tokens_seen - n, self.rope_base)")),
    ),
    Mistake(
        name="the query at its original position",
        why="the keys sit at slots 0 … n-1 but the query is rotated at its index in the whole stream, so every "
            "query-key distance is off by the number of evicted tokens.",
        hint="The new token's key went into slot n-1. Where should its query be rotated?",
        edits=(("q = apply_rope(self._heads(self.wq(x)), slots, self.rope_base)",
                "q = apply_rope(self._heads(self.wq(x)), slots + cache.tokens_seen - n, self.rope_base)"),),
    ),
    Mistake(
        name="the query at slot n",
        why="the query is rotated one slot past its own key: the length of the cache after the update is one "
            "more than the new token's slot.",
        hint="With n tokens in the cache, the slots run 0 … n-1. Which one is the new token's?",
        edits=(("q = apply_rope(self._heads(self.wq(x)), slots, self.rope_base)",
                "q = apply_rope(self._heads(self.wq(x)), slots + 1, self.rope_base)"),),
    ),
    Mistake(
        name="the window off by one",
        why="the recent window keeps one token fewer than `window` after the cache fills.",
        hint="With window=4 and 10 tokens seen, which four indices are the last four?",
        edits=(("list(range(seq_len - window, seq_len))", "list(range(seq_len - window + 1, seq_len))"),
               ("K = torch.cat([K[:, :, :self.n_sink], K[:, :, -self.window:]], dim=2)",
                "K = torch.cat([K[:, :, :self.n_sink], K[:, :, K.shape[2] + 1 - self.window:]], dim=2)"),
               ("V = torch.cat([V[:, :, :self.n_sink], V[:, :, -self.window:]], dim=2)",
                "V = torch.cat([V[:, :, :self.n_sink], V[:, :, V.shape[2] + 1 - self.window:]], dim=2)")),
    ),
    Mistake(
        name="the window counted including the sinks",
        why="`window` is the number of recent tokens besides the sinks; the cache holds n_sink + window tokens.",
        hint="With n_sink=2 and window=4, how many tokens does a full cache hold?",
        edits=(("if seq_len <= n_sink + window:", "if seq_len <= window:"),
               ("list(range(seq_len - window, seq_len))", "list(range(seq_len - window + n_sink, seq_len))"),
               ("if K.shape[2] > self.n_sink + self.window:", "if K.shape[2] > self.window:"),
               ("K = torch.cat([K[:, :, :self.n_sink], K[:, :, -self.window:]], dim=2)",
                "K = torch.cat([K[:, :, :self.n_sink], K[:, :, K.shape[2] - self.window + self.n_sink:]], dim=2)"),
               ("V = torch.cat([V[:, :, :self.n_sink], V[:, :, -self.window:]], dim=2)",
                "V = torch.cat([V[:, :, :self.n_sink], V[:, :, V.shape[2] - self.window + self.n_sink:]], dim=2)")),
    ),
    Mistake(
        name="rotating keys once, when they are written",
        why="after an eviction every window token moves one slot to the left, but a key rotated on arrival "
            "keeps the angle of the slot it arrived in.",
        hint="After one eviction, which slot holds the token that was at slot n-1, and where is its key rotated?",
        edits=(("        K = k_new if self._k is None else torch.cat([self._k, k_new], dim=2)  # (B, H, n + T, D)\n",
                "        first = min(len(self), self.n_sink + self.window - T)  # the slots it lands in\n"
                "        arrival = torch.arange(first, first + T, device=k_new.device)\n"
                "        k_new = apply_rope(k_new, arrival, self.rope_base)\n"
                "        K = k_new if self._k is None else torch.cat([self._k, k_new], dim=2)  # (B, H, n + T, D)\n"),
               ("return apply_rope(K, slots, self.rope_base), V", "return K, V")),
    ),
    Mistake(
        name="a multi-token update that evicts silently",
        why="evicting inside a chunk would drop tokens the chunk's own earlier queries still need to see.",
        hint="What should update do when T > 1 new tokens do not fit in the free slots?",
        edits=(("        if T > 1 and len(self) + T > self.n_sink + self.window:\n",
                "        if False:\n"),),
    ),
    Mistake(
        name="the layer counts the tokens itself",
        why="the layer keeps its own count of tokens held instead of reading it from the cache it is given, so "
            "the same layer serving a second cache (another request, another sequence) rotates queries wrongly.",
        hint="Where does the number of kept tokens live, and what tells you it after cache.update?",
        edits=(("        n = K.shape[2]\n",
                "        self._n = n = min(getattr(self, \"_n\", 0) + T, self.n_sink + self.window)  # tokens held\n"),),
    ),
    Mistake(
        name="any object taken as the cache",
        why="forward calls cache.update on whatever it is given; a (K, V) pair from katas 01 to 03 fails deep "
            "inside with an AttributeError instead of a ValueError naming cache.",
        hint="What should forward do when cache is not a SinkKVCache?",
        edits=(("        if not isinstance(cache, SinkKVCache):\n"
                "            raise ValueError(f\"cache: expected a SinkKVCache, got {type(cache).__name__}\")\n", ""),),
    ),
]
