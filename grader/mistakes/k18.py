"""Known mistakes of kata 18 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="one FLOP per multiply-add",
        why="a multiply-add is two floating-point operations, and hardware peaks count both; counting one "
            "halves every FLOP figure and puts every pass at half its intensity.",
        hint="A dot product of two vectors of n numbers: how many multiplications, and how many additions?",
        edits=(("FLOPS_PER_MAC = 2 ", "FLOPS_PER_MAC = 1 "),),
    ),
    Mistake(
        name="query heads counted in the cache",
        why="the cache holds num_key_value_heads heads per layer, not num_attention_heads; under grouped-query "
            "attention several query heads read the same cached head.",
        hint="Llama-3-8B has 32 query heads and 8 KV heads. How many keys per token and layer are in memory?",
        edits=(('return weights, 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * kv',
                'return weights, 2 * m["layers"] * m["heads"] * m["head_dim"] * kv'),),
    ),
    Mistake(
        name="the LM head over every new token",
        why="only the last position's logits choose the next token; the README counts the LM head once per "
            "sequence, which is what serving engines compute.",
        hint="In a 2,048-token prefill, how many of the 2,048 positions' logits does generation use?",
        edits=(('lm_head = b * m["hidden"] * m["vocab"]', 'lm_head = b * t * m["hidden"] * m["vocab"]'),),
    ),
    Mistake(
        name="the weights read once per token",
        why="one forward reads each weight once and applies it to every token of the batch; counting a read "
            "per token hides exactly what makes prefill compute-bound and batching pay.",
        hint="In a batched matrix multiply, is the weight matrix fetched again for every row of the input?",
        edits=(("    return weights + cache_read + cache_write\n",
                "    return weights * b * t + cache_read + cache_write\n"),),
    ),
    Mistake(
        name="the cache write left out",
        why="each new token's key and value are written to the cache during the forward; the README counts "
            "those bytes.",
        hint="After a prefill of P tokens the cache holds P tokens. Who wrote them, and were those bytes moved?",
        edits=(("    return weights + cache_read + cache_write\n", "    return weights + cache_read\n"),),
    ),
    Mistake(
        name="the crossover as the ridge point, without the cache",
        why="each sequence of a decode batch reads its own cache, so the bytes grow with the batch too; the "
            "batch that amortizes the weights to the ridge is too small, and at long contexts no batch gets there.",
        hint="Write a decode step's memory time as a + b x batch. What is b, and what happens when b/bandwidth "
             "beats the FLOPs one sequence adds over peak_flops?",
        edits=(("    gain = one * bw - per_sequence * peak ", "    gain = one * bw "),),
    ),
    Mistake(
        name="GQA ignored in the K and V projections",
        why="k_proj and v_proj map hidden_size to num_key_value_heads x head_dim, not to num_attention_heads x "
            "head_dim; with grouped-query attention they are smaller than q_proj.",
        hint="Llama-3-8B's k_proj weight has shape (1024, 4096). Where does 1024 come from?",
        edits=(('k_and_v = 2 * m["hidden"] * m["kv_heads"] * m["head_dim"]',
                'k_and_v = 2 * m["hidden"] * m["heads"] * m["head_dim"]'),),
    ),
    Mistake(
        name="attention over the new tokens only",
        why="a new token attends to every cached key as well as the new ones up to itself; leaving out the "
            "past makes a decode step's attention cost nothing however long the context.",
        hint="A decode step after 2,047 cached tokens: how many keys does its query score?",
        edits=(("    pairs = t * p + t * (t + 1) // 2\n", "    pairs = t * (t + 1) // 2\n"),),
    ),
    Mistake(
        name="attention without the causal mask",
        why="new token i sees past_len + i + 1 keys, not past_len + new_tokens: the masked pairs are never "
            "computed by a fused kernel, and the README leaves them out.",
        hint="In a 4-token prefill, how many keys does the first token see, and how many the last?",
        edits=(("    pairs = t * p + t * (t + 1) // 2\n", "    pairs = t * (p + t)\n"),),
    ),
    Mistake(
        name="compute time plus memory time",
        why="compute and memory transfers overlap, so the roofline takes the larger of the two, not the sum.",
        hint="If a pass needs 3 ms of compute and 5 ms of memory traffic running at the same time, how long is it?",
        edits=(("    return max(compute, memory)\n", "    return compute + memory\n"),),
    ),
    Mistake(
        name="ratios through float division",
        why="a float carries 53 bits: the ratio of two counts past 2**53 rounds, and a Fraction keeps it exact.",
        hint="What type does int / int give in Python, and what does Fraction(a, b) keep that it loses?",
        edits=(("    return _rate(\"peak_flops\", peak_flops) / _rate(\"bandwidth\", bandwidth)\n",
                "    return float(_rate(\"peak_flops\", peak_flops) / _rate(\"bandwidth\", bandwidth))\n"),
               ("    return Fraction(flops, forward_bytes(", "    return flops / float(forward_bytes(")),
    ),
    Mistake(
        name="the crossover rounded down",
        why="the smallest batch that reaches the ridge rounds the exact quotient up; rounding down gives a batch "
            "that is still bandwidth-bound unless the division is exact.",
        hint="If 296.4 sequences would reach the ridge, is 296 enough?",
        edits=(("    return math.ceil(weights * peak / gain)", "    return math.floor(weights * peak / gain)"),),
    ),
    Mistake(
        name="the dtype read from the top level first",
        why="a multimodal config can write one dtype at the top level and the language model's own inside "
            "text_config; reading the top level first takes the wrapper's (or the vision tower's) bytes per number.",
        hint="Whose weights are you counting, and which dtype in the file belongs to them?",
        edits=(("    for source in (text, config):\n", "    for source in (config, text):\n"),),
    ),
]
