"""Known mistakes of kata 12 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="draft cache not rolled back",
        why="the draft's cache keeps the keys and values of rejected proposals; the draft then attends to tokens "
            "that are not in the sequence, so it proposes worse tokens (the output stays right, only slower).",
        hint="After a round, which of the tokens the draft was fed are not in the accepted sequence? Crop its cache too.",
        edits=(("        d_cache.crop(min(d_cache.seq_len(), len(seq) - 1))\n", ""),
               ("have = cache.seq_len()  # the draft's cache holds seq[:have] (then earlier proposals)",
                "have = min(cache.seq_len(), len(seq) - 1 + len(proposals))")),
    ),
    Mistake(
        name="target cache not rolled back",
        why="the target's cache keeps the keys and values of rejected proposals, so its next verification "
            "attends to tokens that were never accepted and the output drifts from its greedy generation.",
        hint="After the target rejects a proposal, how many tokens should its cache hold? Crop it to that.",
        edits=(("        t_cache.crop(len(seq) - 1)\n", ""),),
    ),
    Mistake(
        name="first mismatching proposal accepted",
        why="at the first disagreement the draft's token is kept instead of the target's, so a token the target "
            "did not choose enters the output.",
        hint="When proposal j differs from the target's choice at row j, whose token is right there?",
        edits=(("new = proposals[:a] + [choices[a]]", "new = (proposals + [choices[-1]])[:a + 1]"),),
    ),
    Mistake(
        name="bonus token dropped",
        why="when every proposal agrees, the target's own next token (already computed in the same forward) is "
            "thrown away, so each such round gives k tokens instead of k + 1 and costs an extra target forward later.",
        hint="The verification forward has k + 1 rows of logits. When all k proposals agree, what does the last row give you?",
        edits=(("new = proposals[:a] + [choices[a]]", "new = proposals if 0 < a == len(proposals) else proposals[:a] + [choices[a]]"),),
    ),
    Mistake(
        name="bonus token taken from the draft",
        why="when every proposal agrees, the extra token is asked of the draft instead of read from the target's "
            "last row of logits, so an unverified draft token enters the output.",
        hint="After k agreeing proposals, which model's logits already predict the next token?",
        edits=(("new = proposals[:a] + [choices[a]]",
                "new = proposals[:a] + [choices[a] if a < len(proposals) else "
                "_propose(draft, seq + proposals, d_cache, 1, stats)[0]]"),),
    ),
    Mistake(
        name="proposals verified one forward each",
        why="the target runs one forward per proposal instead of one over all of them; the tokens are right but the "
            "target runs as often as plain decoding, which is the cost speculative decoding exists to avoid.",
        hint="The target can score the pending token and all k proposals at once: feed them together, read k + 1 rows.",
        edits=(("logits = _forward(target, [seq[-1]] + proposals, start, t_cache, stats, \"target_forwards\")  # (1 + n, V)",
                "logits = torch.cat([_forward(target, [t], start + i, t_cache, stats, \"target_forwards\")\n"
                "                            for i, t in enumerate([seq[-1]] + proposals)])"),),
    ),
    Mistake(
        name="pending token one position too far",
        why="after a rollback the pending token is placed at len(seq) instead of len(seq) - 1: the positions "
            "skip one past what the cache holds, so every rotary angle of the verification is off by one.",
        hint="A sequence of L accepted tokens uses positions 0 … L-1. Which of them does the pending token sit at?",
        edits=(("start = len(seq) - 1  # the pending token's position", "start = len(seq)  # the pending token's position"),),
    ),
    Mistake(
        name="bonus token counted as accepted",
        why="stats['accepted'] adds the target's own extra token to the agreeing prefix, so the acceptance rate "
            "reads higher than the draft earned.",
        hint="accepted counts draft proposals the target agreed with. Is the token the target adds itself a proposal?",
        edits=(("stats[\"accepted\"] += a\n", "stats[\"accepted\"] += a + 1\n"),),
    ),
    Mistake(
        name="no stop at EOS",
        why="the loop keeps going after the EOS, so tokens after it are returned.",
        hint="The README asks to stop right after the first EOS, which is kept. Where do you check each accepted token?",
        edits=(("            if token == eos_token_id:\n                break\n", ""),
               ("while len(out) < max_new_tokens and out[-1] != eos_token_id:",
                "while len(out) < max_new_tokens:")),
    ),
    Mistake(
        name="crop keeps the last n tokens",
        why="crop slices from the end, so the cache keeps the newest n tokens (the rejected ones among them) "
            "and forgets the start of the sequence.",
        hint="crop(n) keeps the first n tokens. Which slice of the sequence axis is that?",
        edits=(("self._keys[layer] = self._keys[layer][:, :, :n]", "self._keys[layer] = self._keys[layer][:, :, self._keys[layer].shape[2] - n:]"),
               ("self._values[layer] = self._values[layer][:, :, :n]",
                "self._values[layer] = self._values[layer][:, :, self._values[layer].shape[2] - n:]")),
    ),
    Mistake(
        name="crop of the first layer only",
        why="only layer 0 is cut back; every deeper layer keeps the rejected tokens' keys and values.",
        hint="Every layer of the model appended the same tokens. How many layers must a rollback touch?",
        edits=(("        for layer in self._keys:\n", "        for layer in list(self._keys)[:1]:\n"),),
    ),
    Mistake(
        name="crop(seq_len()) refused",
        why="crop accepts only n < seq_len(), but cutting to the current length is valid (it keeps everything); "
            "a round where every proposal is accepted crops exactly there.",
        hint="Which values of n are valid for crop? Is keeping all the tokens one of them?",
        edits=(("not 0 <= n <= self.seq_len()", "not 0 <= n < self.seq_len()"),),
    ),
    Mistake(
        name="crop range not checked",
        why="crop(-1) or crop(n) past the end is taken silently: a negative n slices from the end and drops "
            "tokens nobody asked to drop, a too-large n does nothing, and the caller's bug stays hidden.",
        hint="Which n make sense for crop? Refuse the others with a ValueError naming n, before changing anything.",
        edits=(("if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= self.seq_len():",
                "if not isinstance(n, int):"),),
    ),
]
