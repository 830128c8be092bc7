"""Known mistakes of kata 21 — each the reference with one bug (the bugs users of H2O, SnapKV and kvpress hit)."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="the next position from the cache length",
        why="after an eviction the cache holds fewer tokens than were seen; a new key rotated at len(cache) "
            "reuses a position the text already had (kvpress's first generate()).",
        hint="Three tokens evicted from ten: where in the text is the eleventh token, 7 or 10?",
        edits=(("pos = torch.arange(self.tokens_seen, self.tokens_seen + T, device=k_new.device)",
                "pos = torch.arange(len(self), len(self) + T, device=k_new.device)"),),
    ),
    Mistake(
        name="kept keys re-rotated to their slots",
        why="kata 07's habit: the kept keys are rotated at slots 0 … n-1 when they are read, while the scores "
            "were earned, and the queries sit, at true positions.",
        hint="After an eviction, which rotation should a kept key have: that of its position in the text, or "
             "of its place in the cache?",
        edits=(("        k_rot = apply_rope(k_new, pos, self.rope_base)", "        k_rot = k_new"),
               ("        return self._k, self._v\n",
                "        return apply_rope(self._k, torch.arange(self._k.shape[2], device=self._k.device), "
                "self.rope_base), self._v\n")),
    ),
    Mistake(
        name="repeat_kv before scoring keeps the query heads",
        why="the keys are repeated to the query heads for the product and the scores are never averaged back "
            "over the group: one score row per query head, a cache of Hq heads.",
        hint="How many heads does the cache store, and how many rows should snapkv_scores return?",
        edits=(("    return pooled.reshape(B, Hkv, G, S - W).mean(dim=2)", "    return pooled.reshape(B, Hq, S - W)"),),
    ),
    Mistake(
        name="the observation window evictable",
        why="SnapKV keeps the whole window it voted with; here the window competes for the budget and is not "
            "kept whatever its score.",
        hint="Which indices must snapkv_keep return whatever the scores say?",
        edits=(("    return _top_then_rest(scores, min(P, budget - window), window)",
                "    return _top_then_rest(scores, min(P, budget), 0)"),),
    ),
    Mistake(
        name="no pooling",
        why="the votes are used as they are: a chosen key's neighbours, which usually carry the rest of the "
            "same fact, are not pulled in.",
        hint="What does kernel_size do to the averaged votes before they are compared?",
        edits=(("F.avg_pool1d(votes.reshape(B * Hq, 1, S - W), kernel_size, stride=1, padding=kernel_size // 2,",
                "F.avg_pool1d(votes.reshape(B * Hq, 1, S - W), 1, stride=1, padding=0,"),),
    ),
    Mistake(
        name="the softmax over the prefix only",
        why="the window queries' softmax leaves out the window's own keys, so every weight is inflated by a "
            "different factor per query and the averages mix them.",
        hint="Over which keys does a window query's softmax run in the model itself?",
        edits=(("    probs = torch.softmax(logits, dim=-1)[..., :S - W]",
                "    probs = torch.softmax(logits[..., :S - W], dim=-1)"),),
    ),
    Mistake(
        name="H2O's recent window evictable",
        why="the newest tokens compete on scores they have had no time to earn, so a token can be evicted the "
            "step after it arrived.",
        hint="Which tokens does h2o_keep keep whatever their score?",
        edits=(("    return _top_then_rest(scores[..., :S - recent], budget - recent, recent)",
                "    return _top_then_rest(scores, budget, 0)"),),
    ),
    Mistake(
        name="an empty keep accepted",
        why="compress with no index empties the cache without an error; the next attention reads nothing and "
            "gives NaN (a ratio floored to zero tokens, as kvpress once did on short contexts).",
        hint="What should compress do with a keep of m = 0 indices?",
        edits=(("or tuple(keep.shape[:2]) != tuple(self._k.shape[:2]) or keep.shape[2] == 0):",
                "or tuple(keep.shape[:2]) != tuple(self._k.shape[:2])):"),
               ("        if order.min() < 0 or order.max() >= n or",
                "        if order.numel() and (order.min() < 0 or order.max() >= n) or")),
    ),
    Mistake(
        name="one index set for every head",
        why="the scores are summed over the KV heads and every head keeps the same tokens, though each head "
            "attends to its own.",
        hint="Does h2o_keep choose per row (batch, head), or once for the whole batch?",
        edits=(("    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]",
                "    order = torch.sort(scores.sum(dim=1, keepdim=True).expand_as(scores), dim=-1, descending=True, "
                "stable=True).indices[..., :k]"),),
    ),
    Mistake(
        name="keys gathered but scores not",
        why="after an eviction the kept keys move but the scores stay where they were, so every later total "
            "belongs to another token.",
        hint="When tokens leave, what else must be gathered with the keys and values?",
        edits=(("        self._score = self._score.gather(2, idx)\n", "        self._score = self._score[..., :idx.shape[2]]\n"),),
    ),
    Mistake(
        name="ties to the newer token",
        why="an unstable or reversed sort breaks ties toward the higher index; the README keeps the older token.",
        hint="Among equal scores, which index does your sort put first?",
        edits=(("    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]",
                "    order = (P - 1 - torch.sort(scores.flip(-1), dim=-1, descending=True, stable=True).indices)[..., :k]"),),
    ),
    Mistake(
        name="scores compared in float32",
        why="float64 totals are cast to float32 before ranking; near-ties merge and the older token wins a "
            "choice the scores had decided.",
        hint="Compare the scores as given: what does a cast do to two totals 1e-12 apart?",
        edits=(("    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]",
                "    order = torch.sort(scores.float(), dim=-1, descending=True, stable=True).indices[..., :k]"),),
    ),
    Mistake(
        name="no causal mask in the window",
        why="each window query also sees the window keys after it, so the softmax divides by a larger sum than "
            "the model's.",
        hint="Window query i sits at position S - W + i: which keys may it see?",
        edits=(("    logits = logits.masked_fill(cols > rows, float(\"-inf\"))", "    logits = logits"),),
    ),
    Mistake(
        name="only the last query observed",
        why="observe adds the last query's row only; a prefill's earlier queries never vote.",
        hint="probs holds T query rows: whose attention should the totals get?",
        edits=(("        paid = probs.to(torch.float64).sum(dim=2)", "        paid = probs.to(torch.float64)[:, :, -1]"),),
    ),
]
