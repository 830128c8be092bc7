"""Known mistakes of kata 13 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="preempting the oldest request",
        why="when blocks run out the most recently admitted request must go: it has the least work to redo, and "
            "the oldest requests keep moving, so nobody starves.",
        hint="running is kept in admission order. Which end of it holds the newest request?",
        edits=(("victim = self.running.pop()  # running is in admission order: the newest is last",
                "victim = self.running.pop(0)"),),
    ),
    Mistake(
        name="admitting out of order",
        why="a request that does not fit blocks the ones behind it; letting a short request jump the queue can "
            "starve a long one forever.",
        hint="When the request at the front of the waiting queue does not fit, may you look at the next one?",
        edits=(("                break  # strict first come, first served: nobody jumps the queue",
                "                continue"),),
    ),
    Mistake(
        name="generated tokens lost on preemption",
        why="a preempted request's cache is freed, so its recompute prefill must feed its prompt and every token "
            "it generated; the prompt alone loses their keys and values.",
        hint="After a recompute, does the cache hold every token the request's next decode must attend to?",
        edits=(("rows.append((req_id, prompts[req_id] + out[req_id], 0))",
                "rows.append((req_id, prompts[req_id], 0))"),),
    ),
    Mistake(
        name="decode positions restart after a recompute",
        why="after a recompute the cache holds prompt + generated tokens, so the next decode token sits at "
            "position len(prompt) + len(generated), not right after the prompt.",
        hint="Count the tokens in a request's cache right after its recompute prefill. What is the next position?",
        edits=(("cached[req_id] = len(prompts[req_id]) + len(out[req_id])", "cached[req_id] = len(prompts[req_id])"),),
    ),
    Mistake(
        name="a finished request's blocks not freed",
        why="finish must hand the request's blocks back; otherwise the free count shrinks with every finished "
            "request and later ones wait or are preempted for nothing.",
        hint="What happens to the blocks a request holds when the caller says it finished?",
        edits=(("            self.running.remove(req_id)\n            self.free_blocks += request.blocks\n",
                "            self.running.remove(req_id)\n"),),
    ),
    Mistake(
        name="decode tokens not counted in the token budget",
        why="each decode row feeds one token through the same forward, so it takes one token of "
            "max_num_batched_tokens; admissions get only what is left.",
        hint="How many tokens does a step feed the model: the prefills alone, or the decodes too?",
        edits=(("budget = self.max_num_batched_tokens - len(step.decode)  # a decode token counts 1",
                "budget = self.max_num_batched_tokens"),),
    ),
    Mistake(
        name="pad keys visible to decode rows",
        why="next to a longer prefill, a decode row's keys come back padded to the longest row; a one-token row "
            "still needs a mask, or its query attends to the padding.",
        hint="A decode row holds S_b keys in a batch padded to S. Which of the S keys may its one query see?",
        edits=(("    mask &= real[:, :, None]  # a pad query",
                "    mask[torch.tensor([len(t) == 1 for _, t, _ in rows])] = True\n    mask &= real[:, :, None]  # a pad query"),),
    ),
    Mistake(
        name="preempted request sent to the back of the queue",
        why="a preempted request was admitted before everyone still waiting; it goes to the front, or it waits "
            "behind newer requests and its work so far is wasted longer.",
        hint="Where in the waiting queue does a preempted request go?",
        edits=(("self.waiting.appendleft(victim)", "self.waiting.append(victim)"),),
    ),
    Mistake(
        name="recompute prefill counted as the prompt only",
        why="a recompute prefills the prompt and the tokens generated so far; counting the prompt alone "
            "under-counts its tokens and blocks.",
        hint="How many tokens does a preempted request feed when it is admitted again?",
        edits=(("tokens = request.prompt_len + request.generated  # a recompute prefills what it generated too",
                "tokens = request.prompt_len"),),
    ),
]
