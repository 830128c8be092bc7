"""Known mistakes of kata 08 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="pad keys attended",
        why="the masks let real tokens attend to the padding, so a padded row is continued as if the pads "
            "were part of its prompt.",
        hint="Which key columns of a left-padded row hold a real token? Only those may be True in the mask.",
        edits=(("real = slots[None, :P] >= first[:, None]", "real = (slots[None, :P] >= 0).expand(B, P)"),),
    ),
    Mistake(
        name="padding found by comparing ids with pad_token_id",
        why="a prompt may contain the pad token itself; the mask then hides real tokens of the prompt.",
        hint="You know each prompt's length: the padding is the first P - len(prompt) columns, whatever they hold.",
        edits=(("real = slots[None, :P] >= first[:, None]", "real = ids != pad_token_id"),),
    ),
    Mistake(
        name="positions that ignore padding",
        why="a row with p pads starts its prompt at position p instead of 0; with RoPE alone the scores hide "
            "it, but the positions are wrong for any model where absolute position matters.",
        hint="What position should the first real token of every row get, however many pads precede it?",
        edits=(("positions = (slots[None, :P] - first[:, None]).clamp(min=0)", "positions = slots[None, :P].expand(B, P)"),
               ("step_positions = lengths[:, None] + torch.arange(N, device=device)",
                "step_positions = P + torch.arange(N, device=device).expand(B, N)")),
    ),
    Mistake(
        name="new tokens placed one position too far",
        why="the first new token sits right after the prompt, at position len(prompt), not len(prompt) + 1.",
        hint="A prompt of L tokens uses positions 0 … L-1. Which position comes next?",
        edits=(("step_positions = lengths[:, None] + torch.arange(N, device=device)",
                "step_positions = lengths[:, None] + 1 + torch.arange(N, device=device)"),),
    ),
    Mistake(
        name="right padding",
        why="with pads after the prompt, the last column holds a pad for short rows, so their first new token "
            "is predicted from a pad, and the shared write slot leaves a hole inside their sequence.",
        hint="Where must every prompt end so that the next token of every row goes to the same cache slot?",
        edits=(("ids[b, P - len(prompt):] = torch.tensor(prompt)", "ids[b, :len(prompt)] = torch.tensor(prompt)"),),
    ),
    Mistake(
        name="the new token unable to see its own key",
        why="the decode mask is opened for the new slot only after the step, so each new query attends to "
            "everything but itself.",
        hint="At a decode step, which slot holds the key of the token being processed? Must the mask show it?",
        edits=(("        real[:, P + step] = True  # the slot this token is written to: its query must see its own key\n"
                "        logits = model(token[:, None], position_ids=step_positions[:, step:step + 1], cache=cache,\n"
                "                       attention_mask=real[:, None, :P + step + 1])[:, -1]  # (B, V)\n",
                "        logits = model(token[:, None], position_ids=step_positions[:, step:step + 1], cache=cache,\n"
                "                       attention_mask=real[:, None, :P + step + 1])[:, -1]  # (B, V)\n"
                "        real[:, P + step] = True\n"),),
    ),
    Mistake(
        name="the whole sequence recomputed each step",
        why="every decode step runs the prompt and all new tokens through the model again; the answer is right "
            "but the cache is thrown away and each step costs as much as a prefill.",
        hint="What does a decode step need to feed the model, when the cache already holds every older key and value?",
        edits=(("        logits = model(token[:, None], position_ids=step_positions[:, step:step + 1], cache=cache,\n"
                "                       attention_mask=real[:, None, :P + step + 1])[:, -1]  # (B, V)\n",
                "        seen = torch.cat([ids, out[:, :step + 1]], dim=1)\n"
                "        every = torch.cat([positions, step_positions[:, :step + 1]], dim=1)\n"
                "        square = torch.ones(P + step + 1, P + step + 1, dtype=torch.bool, device=device).tril()\n"
                "        logits = model(seen, position_ids=every, attention_mask=square & real[:, None, :P + step + 1])[:, -1]\n"),),
    ),
    Mistake(
        name="cache grown by torch.cat",
        why="concatenating allocates and copies the whole cache at every step, quadratic traffic over a "
            "generation, which preallocation exists to avoid.",
        hint="The buffers have room for every token already: write the new entries into them in place.",
        edits=(("        self.keys[layer][:, :, start:end] = k\n"
                "        self.values[layer][:, :, start:end] = v\n"
                "        self.filled[layer] = end\n"
                "        # Views of the one buffer: nothing is copied, and attention reads only the filled slots.\n"
                "        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]\n",
                "        self.keys[layer] = torch.cat([self.keys[layer][:, :, :start], k], dim=2)\n"
                "        self.values[layer] = torch.cat([self.values[layer][:, :, :start], v], dim=2)\n"
                "        self.filled[layer] = end\n"
                "        return self.keys[layer], self.values[layer]\n"),),
    ),
    Mistake(
        name="EOS not sticky",
        why="the finished flag is recomputed from the latest token, so a row that produced EOS starts "
            "generating again on the next step.",
        hint="Once a row has produced EOS, what should ever make it unfinished again?",
        edits=(("done |= token == eos_token_id", "done = token == eos_token_id"),),
    ),
    Mistake(
        name="EOS left out of the output",
        why="the row is marked finished before its EOS is counted, so the EOS itself is dropped.",
        hint="The spec keeps the EOS: count a row's token before you mark the row finished.",
        edits=(("        produced += ~done\n", ""),
               ("            done |= token == eos_token_id\n", "            done |= token == eos_token_id\n"
                "        produced += ~done\n        if eos_token_id is not None:\n")),
    ),
    Mistake(
        name="no early exit",
        why="after every row has finished, the loop keeps calling the model for tokens nobody keeps.",
        hint="When every row is done, is there any reason to run another step?",
        edits=(("            if done.all():  # the one host-device sync of a step\n                break\n", ""),),
    ),
    Mistake(
        name="one token short",
        why="the loop stops a step early: the token picked from the last logits is never added.",
        hint="The prefill already gives the first new token. How many tokens does a row hold when no EOS comes?",
        edits=(("for step in range(N):", "for step in range(N - 1):"),),
    ),
    Mistake(
        name="temperature ignored",
        why="the draws come from softmax(logits): every temperature samples like temperature 1.",
        hint="Divide the logits by the temperature before the softmax: what does T < 1 do to the distribution?",
        edits=(("scaled = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature",
                "scaled = logits.to(torch.promote_types(logits.dtype, torch.float32))"),),
    ),
    Mistake(
        name="generator ignored",
        why="the draws use the global random state, so the same generator seed does not give the same tokens.",
        hint="Which argument of torch.multinomial takes the caller's generator?",
        edits=(("torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator)",
                "torch.multinomial(torch.softmax(scaled, dim=-1), 1)"),),
    ),
    Mistake(
        name="negative temperature accepted",
        why="softmax(logits / T) with T < 0 turns the distribution upside down: the least likely tokens "
            "become the most likely, silently.",
        hint="Which temperatures have a meaning, and what should generate do with the others?",
        edits=(("    if temperature < 0:\n"
                "        raise ValueError(f\"temperature: expected a number >= 0 (0 is greedy), got {temperature!r}\")\n",
                ""),),
    ),
    Mistake(
        name="the cache kept on the model between calls",
        why="the cache built for one call is stored on the model and reused by the next, whose batch, "
            "lengths and slots are different: the second call reads the first call's keys and values.",
        hint="What does a call of generate leave behind, and which call may read it?",
        edits=(("    cache = _StaticCache(config.num_hidden_layers, B, S, config.num_key_value_heads, config.head_dim,\n"
                "                         model.dtype, device)\n",
                "    cache = getattr(model, \"kv_cache\", None) or _StaticCache(\n"
                "        config.num_hidden_layers, B, S, config.num_key_value_heads, config.head_dim, model.dtype, device)\n"
                "    model.kv_cache = cache  # kept for the next call\n"),),
    ),
]
