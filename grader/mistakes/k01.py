"""Known mistakes of kata 01 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="concatenating on the head axis",
        why="torch.cat on dim 1 stacks heads instead of tokens, so the cache grows the wrong way.",
        hint="The cache is (batch, heads, seq, head_dim): which axis counts tokens?",
        edits=(("K = torch.cat([K, k_new], dim=2)", "K = torch.cat([K, k_new], dim=1)"),
               ("V = torch.cat([V, v_new], dim=2)", "V = torch.cat([V, v_new], dim=1)")),
    ),
    Mistake(
        name="new entries put before the old ones",
        why="the cache must list tokens in the order they arrived; prepending reverses it.",
        hint="After appending, where should the newest token sit in the sequence axis?",
        edits=(("torch.cat([K, k_new], dim=2)", "torch.cat([k_new, K], dim=2)"),
               ("torch.cat([V, v_new], dim=2)", "torch.cat([v_new, V], dim=2)")),
    ),
    Mistake(
        name="re-projecting the whole history every step",
        why="keeping the hidden states and projecting all of them again gives the right numbers "
            "but throws away the point of the cache: the past keys and values never change.",
        hint="On a decode step, how many rows should go through wk and wv?",
        edits=(("        q = self._heads(self.wq(x))  # (B, H, T, D)\n"
                "        K, V = append_kv(cache, self._heads(self.wk(x)), self._heads(self.wv(x)))  # (B, H, S, D)\n",
                "        self._seen = x if cache is None else torch.cat([self._seen, x], dim=1)\n"
                "        q = self._heads(self.wq(self._seen))[:, :, -T:]\n"
                "        K, V = self._heads(self.wk(self._seen)), self._heads(self.wv(self._seen))\n"),),
    ),
    Mistake(
        name="missing the 1/sqrt(head_dim) scale",
        why="without the scale the softmax is too sharp and the outputs differ from standard attention.",
        hint="Scaled dot-product attention divides the scores by what?",
        edits=(("scores = q @ K.transpose(-2, -1) / math.sqrt(self.head_dim)", "scores = q @ K.transpose(-2, -1)"),),
    ),
    Mistake(
        name="no causal mask in prefill",
        why="during prefill every prompt token would see the tokens after it.",
        hint="In the prompt pass, which keys may token i look at?",
        edits=(('        scores = scores.masked_fill(cols > rows, float("-inf"))\n', ""),),
    ),
    Mistake(
        name="causal mask not offset by the cache length",
        why="on a decode step the one query sits at position past, not 0; a mask aligned to the top "
            "left (which is what scaled_dot_product_attention's is_causal=True does) lets it see only "
            "the first cached token.",
        hint="On a decode step, which keys may the single new query attend to? Is any mask needed at all?",
        edits=(("rows = torch.arange(T, device=x.device)[:, None] + past", "rows = torch.arange(T, device=x.device)[:, None]"),),
    ),
    Mistake(
        name="returning the old cache",
        why="the caller gets back the cache it passed in, so the new token is never stored.",
        hint="What should the second element of forward's result hold after this call?",
        edits=(("return self.wo(out), (K, V)", "return self.wo(out), cache if cache is not None else (K, V)"),),
    ),
    Mistake(
        name="update returns only the new entries",
        why="attention needs every cached token, not just the ones added by this call.",
        hint="What does the layer attend to after update: this step's keys, or all of them?",
        edits=(("        return self._layers[layer]\n\n    def seq_len", "        return k_new, v_new\n\n    def seq_len"),),
    ),
    Mistake(
        name="seq_len counts calls instead of tokens",
        why="a prefill adds many tokens in one call; the cache position is the number of tokens stored.",
        hint="After a 5-token prefill, what should seq_len return?",
        edits=(("return self._layers[layer][0].shape[2] if", "return 1 if"),),
    ),
    Mistake(
        name="queries kept in the layer",
        why="a query is needed only for its own token's output, in its own step; storing every query makes a "
            "QKV cache that grows with the sequence and is never read.",
        hint="Which of q, k and v does a later step ever read again?",
        edits=(("        q = self._heads(self.wq(x))  # (B, H, T, D)\n",
                "        q = self._heads(self.wq(x))  # (B, H, T, D)\n"
                "        self.queries = q if cache is None else torch.cat([self.queries, q], dim=2)\n"),),
    ),
    Mistake(
        name="a cache's K and V not checked against each other",
        why="a cache handed back with keys and values of different lengths (or dtypes) is silently grown into "
            "a pair whose rows no longer belong together.",
        hint="Before you append, what must be true of the K and the V you were given?",
        edits=(("    if K.shape != V.shape or K.dtype != V.dtype:\n", "    if False:\n"),),
    ),
    Mistake(
        name="a layer past the end stored as the next layer",
        why="update(2, ...) on a cache holding no layer appends at index 0, so layer 2's tokens are read back "
            "as layer 0's and seq_len(2) says 0.",
        hint="Which list index does layer 2 end up at when layers 0 and 1 were never updated?",
        edits=(("or not 0 <= layer <= len(self._layers):", "or layer < 0:"),
               ("        if layer == len(self._layers):\n            self._layers.append(append_kv(None, k_new, v_new))\n",
                "        if layer >= len(self._layers):\n            self._layers.append(append_kv(None, k_new, v_new))\n"
                "            return self._layers[-1]\n")),
    ),
]
