"""Known mistakes of kata 23 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="prefills before decodes",
        why="decodes go first, one token each: a prompt that takes the budget first leaves running requests "
            "without their next token, the very stall chunked prefill exists to remove.",
        hint="In which order does schedule() share out the budget? Who must never wait for a prompt?",
        edits=(("        self._schedule_decodes(step)\n        self._schedule_prefills(step)\n",
                "        self._schedule_prefills(step)\n        self._schedule_decodes(step)\n"),),
    ),
    Mistake(
        name="a chunk fed from position 0",
        why="a chunk computes tokens c … c + n - 1 of the request: their positions are c … c + n - 1, or "
            "rotary embeddings place the second chunk on top of the first.",
        hint="Which positions does a request's second chunk have?",
        edits=(("rows.append((req_id, (prompts[req_id] + out[req_id])[start:start + n], start))",
                "rows.append((req_id, (prompts[req_id] + out[req_id])[start:start + n], 0))"),),
    ),
    Mistake(
        name="a chunk attending without its cached prefix",
        why="a chunk's queries must see the keys of every earlier chunk (in the cache) as well as their own; "
            "hiding them reads each chunk as if it were a prompt of its own.",
        hint="Which keys may the first query of a request's second chunk see?",
        edits=(("    mask &= real[:, :, None]\n",
                "    mask &= real[:, :, None]\n"
                "    mask &= keys[None, None, :] >= torch.tensor([start for _, _, start in rows])[:, None, None]\n"),),
    ),
    Mistake(
        name="a token sampled after an intermediate chunk",
        why="only the chunk that reaches the end of the request's known tokens gives a next token; an "
            "intermediate chunk's last logits predict a prompt token that is already known.",
        hint="Which of a prompt's chunks produces the first new token?",
        edits=(("            if start + len(tokens) < len(prompts[req_id]) + len(out[req_id]):\n"
                "                continue  # an intermediate chunk: its logits are not a next token\n", ""),),
    ),
    Mistake(
        name="each chunk written from the request's first block",
        why="a resumed chunk must be appended after the request's cached tokens; starting its cache over "
            "writes it into the first blocks and loses every earlier chunk, silently.",
        hint="When a request's second chunk runs, where do its keys go, and what must still be in the cache?",
        edits=(("            if start == 0:\n                cache.add_sequence(req_id)",
                "            if start > 0:\n                cache.free(req_id)\n            if True:\n"
                "                cache.add_sequence(req_id)"),),
    ),
    Mistake(
        name="decode rows not counted in the budget",
        why="every decode row feeds one token through the same forward, so the prompts get only what the "
            "decodes left of max_num_batched_tokens.",
        hint="How many tokens of the budget are left for prompts after the decodes?",
        edits=(("budget = self.budget - len(step.decode)  # a decode row takes one token", "budget = self.budget"),),
    ),
    Mistake(
        name="a fully cached prompt accepted",
        why="a hit of the whole prompt leaves no token to compute, and the first new token comes from the last "
            "prompt token's logits; engines cap a hit at prompt_len - 1 (nano-vllm crashed without it).",
        hint="How many prompt tokens may be cached at most, and why must one be computed?",
        edits=(("if num_cached > prompt_len - 1:", "if num_cached > prompt_len:"),),
    ),
    Mistake(
        name="a preempted request resuming from its old count",
        why="a preemption frees the request's blocks: nothing of it is in the cache any more, so its count goes "
            "back to 0 and it is read again from its first token.",
        hint="After a preemption, how many of the request's tokens are still in the cache?",
        edits=(("request.blocks, request.computed = 0, 0  # its cache is gone: recomputed from token 0",
                "request.blocks = 0"),),
    ),
    Mistake(
        name="the per-request cap ignored",
        why="long_prefill_token_threshold caps one prompt's share of a step, so a long prompt cannot take "
            "the whole budget while others wait.",
        hint="What three numbers bound a chunk?",
        edits=(("        if self.cap:\n            n = min(n, self.cap)\n", ""),),
    ),
    Mistake(
        name="a prompt not cut at the budget",
        why="a prompt longer than what is left of the budget is cut there; fed whole, one step is as slow as "
            "an unchunked prefill.",
        hint="What happens to a prompt longer than the budget left?",
        edits=(("        return min(n, budget)\n", "        return n\n"),),
    ),
    Mistake(
        name="a prefix hit ignored",
        why="num_cached tokens are in the cache already: the request's count starts there and its first chunk "
            "starts at num_cached.",
        hint="Where does the first chunk of a request with a prefix hit start?",
        edits=(("self.requests[req_id] = _Request(prompt_len, max_new_tokens, num_cached)",
                "self.requests[req_id] = _Request(prompt_len, max_new_tokens, 0)"),),
    ),
]
