"""Known mistakes of kata 02 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="new tokens start at position 0",
        why="the new tokens are numbered as if they began a fresh sequence, so they are rotated at the wrong "
            "angles and their keys are stored that way for every later step to read.",
        hint="A cache holds past_len tokens. At which index does the first new token sit?",
        edits=(("torch.arange(past_len, past_len + new_len, device=device)", "torch.arange(new_len, device=device)"),),
    ),
    Mistake(
        name="square mask over the new tokens only",
        why="a (new, new) mask leaves out the cached keys; the attention weights are (new, past + new).",
        hint="How many keys can a new token attend to: only the new ones, or the cached ones as well?",
        edits=(("[:, None] + past_len  # (T, 1)", "[:, None]  # (T, 1)"),
               ("torch.arange(past_len + new_len, device=device)[None, :]", "torch.arange(new_len, device=device)[None, :]")),
    ),
    Mistake(
        name="mask rows not offset by the cache length",
        why="row i is treated as position i instead of past_len + i, so new tokens cannot see most of the cache "
            "(this is also what scaled_dot_product_attention's is_causal=True does when queries and keys differ "
            "in length: it aligns the triangle to the top-left corner).",
        hint="Row i of the mask is the new token at which position? Compare causal_mask(2, 3) with the picture in the README.",
        edits=(("[:, None] + past_len  # (T, 1)", "[:, None]  # (T, 1)"),),
    ),
    Mistake(
        name="mask hides the token itself",
        why="with < instead of <= a token cannot attend to its own key; the first token of a prompt then has "
            "nothing to attend to at all.",
        hint="May the token at position p attend to the key at position p?",
        edits=(("return cols <= rows  # (T, S)", "return cols < rows  # (T, S)"),),
    ),
    Mistake(
        name="mask lets each token see one future token",
        why="the diagonal of the mask is shifted one column right, so inside a chunk each token peeks at the next.",
        hint="In row i, which is the last column that may be True?",
        edits=(("return cols <= rows  # (T, S)", "return cols <= rows + 1  # (T, S)"),),
    ),
    Mistake(
        name="negative lengths not rejected",
        why="a negative past_len quietly gives negative positions instead of a clear error.",
        hint="What should position_ids(-1, 3) do? Check each length before using it.",
        edits=(("    if n < 0:\n", "    if False:\n"),),
    ),
    Mistake(
        name="keys stored unrotated and rotated on read",
        why="the outputs come out right, but the cache holds raw keys, so each step rotates the whole cache again "
            "and any code that reads the cache (another kernel, a paged store) gets keys without their positions.",
        hint="Rotate each key once, at its true position, before it goes into the cache; what should the returned K hold?",
        edits=(("        k = apply_rope(self._heads(self.wk(x)), pos, self.rope_base)  # (B, H, T, D)\n",
                "        k = self._heads(self.wk(x))  # (B, H, T, D)\n"),
               ("scores = q @ k.transpose(-2, -1)",
                "scores = q @ apply_rope(k, position_ids(0, past + T, device=x.device), self.rope_base).transpose(-2, -1)")),
    ),
    Mistake(
        name="cached keys rotated a second time",
        why="the keys are rotated before they are stored (right) and then the whole cache is rotated again when "
            "read, so every key carries twice its angle.",
        hint="The keys coming out of the cache already carry their positions: should anything rotate them again?",
        edits=(("scores = q @ k.transpose(-2, -1)",
                "scores = q @ apply_rope(k, position_ids(0, past + T, device=x.device), self.rope_base).transpose(-2, -1)"),),
    ),
    Mistake(
        name="query rotated from position 0",
        why="the keys get their true positions but the queries are rotated as if they started a sequence, so the "
            "query-key angle no longer equals the distance between the tokens.",
        hint="RoPE scores depend on the query position minus the key position. Where does the new query sit?",
        edits=(("q = apply_rope(self._heads(self.wq(x)), pos, self.rope_base)",
                "q = apply_rope(self._heads(self.wq(x)), position_ids(0, T, device=x.device), self.rope_base)"),),
    ),
    Mistake(
        name="mask applied only to the prefill",
        why="a one-token decode step needs no mask, but a chunk of several new tokens does: without it each token "
            "sees the tokens after it in the chunk.",
        hint="With a cache and 3 new tokens, may the first new token see the third?",
        edits=(("        scores = scores.masked_fill(",
                "        if cache is None:\n            scores = scores.masked_fill("),),
    ),
    Mistake(
        name="the layer counts positions itself",
        why="a counter kept in the layer knows only the calls it saw; the cache handed in says how many tokens "
            "came before, so two sequences served by one layer (or a cache rebuilt elsewhere) get wrong positions.",
        hint="Where does forward learn how many tokens are already cached?",
        edits=(("        past = 0 if cache is None else cache[0].shape[2]  # the cache position\n",
                "        past = 0 if cache is None else self.seen  # the cache position\n        self.seen = past + T\n"),),
    ),
    Mistake(
        name="fractional lengths truncated",
        why="int(2.5) quietly becomes 2, so a length that cannot be right gives a plausible answer instead of an error.",
        hint="What should position_ids(2.5, 3) do: round, or refuse?",
        edits=(("        n = operator.index(value)\n", "        n = int(value)\n"),),
    ),
]
