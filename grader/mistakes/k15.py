"""Known mistakes of kata 15 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="one causal triangle over the whole row",
        why="the mask is causal over the packed row instead of block-diagonal, so every sequence attends to the "
            "sequences packed before it: cross-contamination that still looks plausible (the silent packed-training bug).",
        hint="May a token of the second sequence see the keys of the first? Which blocks of the (T, S) mask hold anything?",
        edits=(("    return mask\n\n\ndef _check_attention_args",
                "    return torch.ones_like(mask).tril(mask.shape[1] - mask.shape[0])\n\n\ndef _check_attention_args"),),
    ),
    Mistake(
        name="positions counted over the whole row",
        why="position_ids run 0 … T-1 along the row instead of restarting at each sequence's cache length, so every "
            "sequence after the first gets the rotary angles of the tokens before it.",
        hint="Which position does the first new token of sequence i have, given past_lens[i]?",
        edits=(("positions = [p + i for p, m in zip(past, lengths) for i in range(m)]",
                "positions = list(range(sum(lengths)))"),),
    ),
    Mistake(
        name="boundaries found from position resets",
        why="cu_seqlens_q is read off the positions (a new sequence wherever the position does not go up by one); in a "
            "decode row each sequence continues from its cache, so two sequences at consecutive positions merge into one.",
        hint="Sequence B decodes at position 3 and C at position 4, side by side. What tells you they are two sequences?",
        edits=(("def _offsets(name: str, cu, total",
                "def _runs(positions: list[int]) -> list[int]:\n"
                "    runs = [1]\n"
                "    for a, b in zip(positions, positions[1:]):\n"
                "        runs[-1:] = [runs[-1] + 1] if b == a + 1 else [runs[-1], 1]\n"
                "    return runs\n\n\n"
                "def _offsets(name: str, cu, total"),
               ("cu_seqlens_q=cu_seqlens(lengths, device)", "cu_seqlens_q=cu_seqlens(_runs(positions), device)")),
    ),
    Mistake(
        name="causal block aligned top-left",
        why="inside a block the triangle starts at the block's first key, as if the sequence had no cache: a continuing "
            "sequence's new tokens cannot see most of their own cached prefix (kata 02's offset, forgotten per sequence).",
        hint="A sequence with 4 cached tokens and 2 new ones: how many keys does its first new token see? Which diagonal is that?",
        edits=(("block.tril(diagonal=(k1 - k0) - (q1 - q0))", "block.tril()"),),
    ),
    Mistake(
        name="cu_seqlens without the leading 0",
        why="the offsets are the running sums l0, l0 + l1, … without the 0 in front, so there is one offset fewer than "
            "sequences + 1 and every reader takes sequence i from the wrong place.",
        hint="How many offsets do n sequences need, and where does the first sequence start?",
        edits=(("return torch.tensor(offsets, dtype=torch.int32, device=device)  # (n + 1,)",
                "return torch.tensor(offsets[1:], dtype=torch.int32, device=device)  # (n + 1,)"),),
    ),
    Mistake(
        name="max_seqlen set to the row total",
        why="max_seqlen_q and max_seqlen_k are the row's totals instead of the longest sequence's: a bound, not the "
            "maximum; a kernel sizes its grid by them and launches tiles with nothing to do.",
        hint="max_seqlen_q is the length of the longest sequence, not of the row. Which of your lengths is that?",
        edits=(("max_seqlen_q=max(lengths), max_seqlen_k=max(keys)", "max_seqlen_q=sum(lengths), max_seqlen_k=sum(keys)"),),
    ),
    Mistake(
        name="cache returns sequences in admission order",
        why="update returns the sequences in the order the cache first saw them instead of the row's order; whenever a "
            "row lists them differently, the keys no longer line up with the columns of the mask.",
        hint="Whose order does the mask follow, the cache's or cu_seqlens_k's?",
        edits=(("        return torch.cat(keys, dim=2), torch.cat(values, dim=2)  # (1, Hkv, S, D)",
                "        order = [i for i in self._kv if i in ids]\n"
                "        return (torch.cat([self._kv[i][layer][0] for i in order], dim=2),\n"
                "                torch.cat([self._kv[i][layer][1] for i in order], dim=2))"),),
    ),
    Mistake(
        name="free keeps the sequence",
        why="free leaves the sequence's keys and values in the cache, so the memory is never given back and an id "
            "admitted again starts with the old sequence's tokens.",
        hint="After free(seq_id), what should seq_len(seq_id) be, and what may the next row with that id start from?",
        edits=(("        del self._kv[seq_id]\n", "        self._kv[seq_id] = dict(self._kv[seq_id])\n"),),
    ),
    Mistake(
        name="begin trusts the row's past lengths",
        why="begin does not compare each sequence's past length with what the cache holds, so a row built from stale "
            "lengths is taken silently and its keys land at the wrong positions.",
        hint="cu_seqlens_k minus cu_seqlens_q says how many tokens each sequence already has. Does the cache agree?",
        edits=(("            if p != self.seq_len(seq_id):\n", "            if False:\n"),),
    ),
    Mistake(
        name="logits read at the row's last token only",
        why="the next token of every sequence is read from the last column of the row, which is the last sequence's: "
            "every sequence gets the last sequence's next token.",
        hint="The logits are (1, T, V) for the whole row. Which column holds sequence i's prediction?",
        edits=(("last = logits[0, row.cu_seqlens_q[1:].long() - 1]", "last = logits[0, -1:].expand(len(live), -1)"),),
    ),
    Mistake(
        name="no stop at EOS",
        why="a sequence goes on after its EOS, so tokens after the EOS are returned.",
        hint="Kata 08's rule: an EOS is kept and ends that sequence. Where do you decide that a sequence goes on?",
        edits=(("if len(out[i]) < max_new_tokens and (eos_token_id is None or token != eos_token_id):",
                "if len(out[i]) < max_new_tokens:"),),
    ),
    Mistake(
        name="EOS id 0 ignored",
        why="the EOS test uses the truth of eos_token_id, so an EOS of id 0 never stops a sequence.",
        hint="Many vocabularies number their special tokens first. Is `if eos_token_id` the same as `is not None`?",
        edits=(("(eos_token_id is None or token != eos_token_id)", "(not eos_token_id or token != eos_token_id)"),),
    ),
    Mistake(
        name="KV heads tiled instead of interleaved",
        why="the KV heads are repeated as a whole block (h % Hkv) instead of each for its group of query heads "
            "(h // (Hq // Hkv)), so query heads read the wrong keys and values.",
        hint="Query head h reads KV head h // (Hq // Hkv). Does .repeat or .repeat_interleave give that?",
        edits=(("ks = k[k0:k1].transpose(0, 1).repeat_interleave(group, dim=0)", "ks = k[k0:k1].transpose(0, 1).repeat(group, 1, 1)"),
               ("vs = v[k0:k1].transpose(0, 1).repeat_interleave(group, dim=0)", "vs = v[k0:k1].transpose(0, 1).repeat(group, 1, 1)")),
    ),
    Mistake(
        name="exact max_seqlen refused",
        why="max_seqlen equal to the longest sequence is refused; it is the best value a caller can give (pack gives "
            "exactly it), only a value below it is wrong.",
        hint="Which values of max_seqlen_q are valid: those below the true maximum, or those below it and equal to it?",
        edits=(("        if given < need:\n", "        if given <= need:\n"),),
    ),
    Mistake(
        name="greedy pick in float32",
        why="the last logits are cast to float32 before argmax; two float64 logits closer than float32's "
            "resolution become one value and the tie goes to the lower id, while the README picks in the model's "
            "dtype.",
        hint="What is 1 + 1e-8 in float32? Take the argmax of the logits in the dtype the model gave them.",
        edits=(("zip(live, last.argmax(dim=-1).tolist())", "zip(live, last.float().argmax(dim=-1).tolist())"),),
    ),
]
