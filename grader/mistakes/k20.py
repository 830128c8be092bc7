"""Known mistakes of kata 20 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="the length read from a sliding layer",
        why="a sliding layer stores W - 1 tokens however many were seen; a length read from it stops growing at "
            "the window, and every later token gets the same position (a model whose first layer is sliding goes "
            "incoherent past its window).",
        hint="After 13 tokens with W = 4, what does the first layer store, and how many tokens has the request seen?",
        edits=(("        return max([0] + [layer.seen for layer in self.layers if layer is not None])",
                "        return next((len(held) for held, kind in zip(self.layers, self.layer_types) "
                "if kind in ATTENTION), 0)"),),
    ),
    Mistake(
        name="a window layer keeps W tokens",
        why="the next query sees itself and the W - 1 tokens before it; a W-th stored token is never read, one "
            "slot per layer wasted (and counted in the bytes).",
        hint="With W = 4, which earlier tokens can the next query see? How many must the layer keep for it?",
        edits=(("keep = min(S, self.window - 1)", "keep = min(S, self.window)"),
               ("else min(seq_len, window - 1)", "else min(seq_len, window)")),
    ),
    Mistake(
        name="a window layer keeps W - 2 tokens",
        why="one token too few survives the trim: the next chunk's first query misses the oldest key of its window.",
        hint="With W = 4 and a query at position 10, which keys must still be there when it arrives?",
        edits=(("keep = min(S, self.window - 1)", "keep = min(S, max(self.window - 2, 0))"),
               ("else min(seq_len, window - 1)", "else min(seq_len, max(window - 2, 0))")),
    ),
    Mistake(
        name="the sliding mask one key too wide",
        why="k >= q - W lets a query see W + 1 keys, one more than the model was trained with.",
        hint="With W = 4, which positions does the query at 7 see? Count them, its own included.",
        edits=(("mask = mask & (k > q - window)", "mask = mask & (k >= q - window)"),),
    ),
    Mistake(
        name="a chunk given only the stored window",
        why="update trims before it returns, so a chunk's first queries lose the keys just before them: a chunk "
            "of T tokens needs W - 1 + T keys.",
        hint="With W = 4, 5 tokens seen and a chunk of 3, which keys does the chunk's first query need?",
        edits=(("        return K, V, positions\n",
                "        return K[:, :, S - keep:], V[:, :, S - keep:], positions[S - keep:]\n"),),
    ),
    Mistake(
        name="positions from the slot, not the token",
        why="a trimmed or ring-buffered window's slot 0 is not position 0: a mask drawn from slot indices shows "
            "stale keys and hides fresh ones.",
        hint="After 9 tokens with W = 4, which positions do the stored keys have?",
        edits=(("positions = torch.arange(self.seen - S, self.seen, device=k.device)",
                "positions = torch.arange(S, device=k.device)"),),
    ),
    Mistake(
        name="a shared layer reads its producer's stored window",
        why="the producer stores W - 1 tokens but returned W - 1 + T for this chunk: the shared layer's queries "
            "lose the keys of their own chunk.",
        hint="What did the producer return on this step, and is it what the producer keeps afterwards?",
        edits=(("        return self._last[source]\n",
                "        held = self.layers[source]\n"
                "        return (*held._kv, torch.arange(held.seen - len(held), held.seen, device=held._kv[0].device))\n"),),
    ),
    Mistake(
        name="a shared layer counted as a copy",
        why="a shared layer stores nothing; counting its producer's bytes again overstates the cache.",
        hint="What does a shared layer hold of its own?",
        edits=(("held = self._layer(layer, KINDS)  # None for a shared layer: it holds nothing",
                "held = self._layer(self.shared_from.get(layer, layer), KINDS)"),),
    ),
    Mistake(
        name="one kind's heads and width for every layer",
        why="the first attention layer's heads and width used for all: with Gemma 4's sliding and full layers "
            "shaped differently, the bytes come out several times off.",
        hint="Where n_kv_heads is a dict, which entry does a full layer use?",
        edits=(("            per_token = 2 * _per_kind(\"n_kv_heads\", n_kv_heads, kind) * _per_kind(\"head_dim\", "
                "head_dim, kind)",
                "            first = next(x for x in kinds if x in ATTENTION)\n"
                "            per_token = 2 * _per_kind(\"n_kv_heads\", n_kv_heads, first) * _per_kind(\"head_dim\", "
                "head_dim, first)"),),
    ),
    Mistake(
        name="chunked layers masked as sliding",
        why="a chunked layer's query sees only its own chunk; a sliding mask lets it see across the chunk boundary.",
        hint="With chunks of 4, may the query at 8 see the key at 7?",
        edits=(("    if kind == \"sliding_attention\":", "    if kind in (\"sliding_attention\", \"chunked_attention\"):"),),
    ),
    Mistake(
        name="a linear state that never decays",
        why="without the decay the state adds up every token forever: old tokens weigh as much as new ones and "
            "the state grows without bound.",
        hint="What multiplies the state before each token's write?",
        edits=(("S = decay[:, :, t, None, None] * S + k[:, :, t, :, None] * v[:, :, t, None, :]",
                "S = S + k[:, :, t, :, None] * v[:, :, t, None, :]"),),
    ),
    Mistake(
        name="the decay applied after the write",
        why="decaying the new token's own write too scales every token's contribution by one extra decay.",
        hint="Does the token written now decay before it is read?",
        edits=(("S = decay[:, :, t, None, None] * S + k[:, :, t, :, None] * v[:, :, t, None, :]",
                "S = decay[:, :, t, None, None] * (S + k[:, :, t, :, None] * v[:, :, t, None, :])"),),
    ),
    Mistake(
        name="the state read before the token's write",
        why="out_t = q_t S must read the state after token t's own write; reading it before drops the token's "
            "own key and value from its output.",
        hint="Which state does the token at t read: the one before or after its own write?",
        edits=(("            S = decay[:, :, t, None, None] * S + k[:, :, t, :, None] * v[:, :, t, None, :]"
                "  # (B, H, Dk, Dv)\n"
                "            outs.append((q[:, :, t, None, :] @ S).squeeze(2))  # (B, H, Dv)\n",
                "            outs.append((q[:, :, t, None, :] @ S).squeeze(2))  # (B, H, Dv)\n"
                "            S = decay[:, :, t, None, None] * S + k[:, :, t, :, None] * v[:, :, t, None, :]\n"),),
    ),
]
