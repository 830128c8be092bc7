"""Known mistakes of kata 11 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="each beam re-prefills the prompt",
        why="every beam gets a sequence of its own and runs the whole prompt through the model again, so the "
            "prompt's keys and values are computed and stored once per beam instead of once.",
        hint="The prompt is the same for every beam. Which cache operation gives a new beam the prompt's blocks "
             "without a forward?",
        edits=(("                cache.fork(live[parent].seq, seq)\n",
                "                if live[parent].seq == root:\n"
                "                    cache.add_sequence(seq)\n"
                "                    model(torch.tensor([prompt], device=device), cache=_PagedBatch(cache, [seq], P))\n"
                "                else:\n"
                "                    cache.fork(live[parent].seq, seq)\n"),),
    ),
    Mistake(
        name="a dropped beam not freed",
        why="the beams of the last step are replaced by forks of them but never freed, so the blocks that only "
            "a dropped beam held stay in use, step after step, and after the search.",
        hint="After you fork the new beams, who still needs the sequences of the old ones?",
        edits=(("            for beam in live:\n                if beam.seq != root:  # the prompt's own sequence may "
                "stay until the end\n                    cache.free(beam.seq)\n", ""),),
    ),
    Mistake(
        name="the cache not reordered",
        why="new beam i continues the sequence of old beam i instead of its parent's, so it attends to the keys "
            "and values of another history: a beam reads a dead beam's cache.",
        hint="Beam i of this step may come from any beam of the last one. Whose blocks must it fork?",
        edits=(("            for parent, tokens, total in chosen:\n                seq = next(ids)\n"
                "                cache.fork(live[parent].seq, seq)\n",
                "            for i, (parent, tokens, total) in enumerate(chosen):\n                seq = next(ids)\n"
                "                cache.fork(live[min(i, len(live) - 1)].seq, seq)\n"),),
    ),
    Mistake(
        name="EOS candidates kept as live beams",
        why="a candidate ending in EOS is recorded as finished but also goes on as a live beam, so hypotheses "
            "continue past their EOS and take the place of real beams.",
        hint="Once a candidate ends in EOS, is there anything left to generate for it?",
        edits=(("            finished.append((tokens, value / len(tokens) ** length_penalty))\n            continue\n",
                "            finished.append((tokens, value / len(tokens) ** length_penalty))\n"),),
    ),
    Mistake(
        name="length penalty over prompt + new tokens",
        why="the score divides by (prompt + new tokens) ** length_penalty; the README (and Hugging Face today) "
            "counts the new tokens only, so scores and the order of hypotheses of different lengths change.",
        hint="Which tokens did the search generate, and so which length does the penalty count?",
        edits=(("finished.append((tokens, value / len(tokens) ** length_penalty))",
                "finished.append((tokens, value / (P + len(tokens)) ** length_penalty))"),
               ("def _walk(live: list[_Beam], logp: torch.Tensor, k: int, eos_token_id, length_penalty: float, "
                "finished: list)", "def _walk(live: list[_Beam], logp: torch.Tensor, k: int, eos_token_id, "
                "length_penalty: float, finished: list, P: int = 0)"),
               ("_walk(live, logp, k, eos_token_id, length_penalty, finished)",
                "_walk(live, logp, k, eos_token_id, length_penalty, finished, P)"),
               ("L = N if length_penalty > 0 else step", "L = P + (N if length_penalty > 0 else step)"),
               ("def _done(live: list[_Beam], finished: list, k: int, step: int, N: int, length_penalty: float)",
                "def _done(live: list[_Beam], finished: list, k: int, step: int, N: int, length_penalty: float, P=0)"),
               ("_done(live, finished, k, step, N, length_penalty)", "_done(live, finished, k, step, N, length_penalty, P)"),
               ("[(b.tokens, b.total / N ** length_penalty) for b in live]",
                "[(b.tokens, b.total / (P + N) ** length_penalty) for b in live]")),
    ),
    Mistake(
        name="stopping as soon as one hypothesis finishes",
        why="the search ends at the first EOS, although the live beams may still produce better hypotheses and "
            "num_beams of them are asked for.",
        hint="When is no live beam able to beat the finished ones any more? Count them first.",
        edits=(("    if len(finished) < k:\n        return False\n", "    return bool(finished)\n"),),
    ),
    Mistake(
        name="only the top num_beams candidates walked",
        why="an EOS candidate among the top num_beams takes a live beam's place, so fewer than num_beams beams "
            "go on; walking the top 2 * num_beams always leaves enough live candidates.",
        hint="Each beam has one EOS candidate. How many candidates must you look at to be sure of num_beams live ones?",
        edits=(("zip(ranked.values[:2 * k].tolist(), ranked.indices[:2 * k].tolist())",
                "zip(ranked.values[:k].tolist(), ranked.indices[:k].tolist())"),),
    ),
    Mistake(
        name="logits summed instead of log-probabilities",
        why="raw logits are not normalised per step: their sums are not log-probabilities, so beams are ranked "
            "by numbers whose offset changes from row to row.",
        hint="What turns a row of logits into log-probabilities, so that sums over steps compare across beams?",
        edits=(("logp = torch.log_softmax(logits.to(work), dim=-1)  # (n, V)", "logp = logits.to(work)  # (n, V)"),),
    ),
    Mistake(
        name="a cache with blocks in use accepted",
        why="the search assumes the pool is its own: with blocks already held by another sequence it may run "
            "out of blocks half-way, and it cannot tell at the end whether it freed everything it took.",
        hint="Before the prefill, how many blocks of the cache are free, and how many should be?",
        edits=(("    if cache.allocator.num_free != pages.shape[0]:\n", "    if False:\n"),),
    ),
]
