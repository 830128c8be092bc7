"""Known mistakes of kata 04 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="forgetting the 2 for K and V",
        why="every layer stores a key and a value per token, so a formula without the factor 2 counts half the cache.",
        hint="For one token in one layer, how many vectors of head_dim numbers does the cache keep per KV head?",
        edits=(("return 2 * n_layers * n_kv_heads * head_dim * bytes_per_elem",
                "return n_layers * n_kv_heads * head_dim * bytes_per_elem"),),
    ),
    Mistake(
        name="caching the query heads instead of the KV heads",
        why="under grouped-query attention only num_key_value_heads heads are stored; num_attention_heads "
            "counts the query heads, which share them.",
        hint="Llama-3-8B has 32 query heads and 8 KV heads. Which number sits in the cache's head axis?",
        edits=(('n_kv = _field(text, "num_key_value_heads", default=n_heads)', "n_kv = n_heads"),),
    ),
    Mistake(
        name="head_dim from hidden_size // num_key_value_heads",
        why="hidden_size is split among the query heads, so the default head width is hidden_size // "
            "num_attention_heads; dividing by the KV heads makes each head several times too wide.",
        hint="q has num_attention_heads heads of head_dim numbers each. What do they add up to?",
        edits=(('head_dim = _field(text, "hidden_size") // n_heads', 'head_dim = _field(text, "hidden_size") // n_kv'),),
    ),
    Mistake(
        name="ignoring text_config",
        why="a multimodal config nests the language model's sizes in text_config; the top-level sizes, when "
            "present, describe another part of the model (a vision tower).",
        hint="Which part of the model writes to the KV cache while generating text, and where are its sizes?",
        edits=(('text = config.get("text_config") or config', "text = config"),),
    ),
    Mistake(
        name="bits instead of bytes",
        why="bfloat16 is 16 bits but 2 bytes; counting bits makes every size 8 times too large.",
        hint="What does the 16 in float16 count, and what unit does the answer use?",
        edits=(("    return dtype.itemsize\n", "    return dtype.itemsize * 8\n"),),
    ),
    Mistake(
        name="an explicit bytes_per_elem ignored",
        why="a cache may be stored in another precision than the weights (an fp8 cache next to bf16 weights); "
            "the bytes_per_elem argument must win over the config's dtype.",
        hint="When the caller passes bytes_per_elem=1 for a bfloat16 model, which one should you use?",
        edits=(("    if bytes_per_elem is None:  # an explicit bytes_per_elem (say, an fp8 cache) beats the weights' dtype\n"
                "        bytes_per_elem = _config_dtype_bytes(text, config)\n",
                "    bytes_per_elem = _config_dtype_bytes(text, config)\n"),),
    ),
    Mistake(
        name="crossover rounded down",
        why="floor division gives the last token count whose cache is still smaller than the weights, "
            "unless the division is exact.",
        hint="With 1,000 B of weights and 128 B per token, do 7 tokens reach the weights?",
        edits=(("return -(-weight_bytes // per_token)", "return weight_bytes // per_token"),),
    ),
    Mistake(
        name="crossover as floor plus one",
        why="floor + 1 is one too many when the weights are an exact multiple of the bytes per token.",
        hint="With 1,024 B of weights and 128 B per token, is 8 tokens enough?",
        edits=(("return -(-weight_bytes // per_token)", "return weight_bytes // per_token + 1"),),
    ),
    Mistake(
        name="crossover through float division",
        why="weight_bytes / per_token is a float, and past 2**53 a float cannot tell n from n + 1: "
            "math.ceil then misses a remainder of a few bytes.",
        hint="How do you round a / b up using only ints? (Think of -(-a // b).)",
        edits=(("import numbers\n", "import math\nimport numbers\n"),
               ("return -(-weight_bytes // per_token)", "return math.ceil(weight_bytes / per_token)")),
    ),
    Mistake(
        name="max_batch_size rounded up",
        why="a sequence whose cache only partly fits cannot run; the count of whole caches rounds down.",
        hint="8,000 free bytes and 1,024 B per sequence: can the 8th sequence run?",
        edits=(("return free // per_sequence", "return -(-free // per_sequence)"),),
    ),
    Mistake(
        name="max_batch_size ignoring the weights",
        why="the weights sit in the same memory as the caches; only what they leave free holds caches.",
        hint="On an 80 GiB GPU serving a 16 GB model, how much memory is there for caches?",
        edits=(('free = _count("memory_bytes", memory_bytes) - _count("weight_bytes", weight_bytes)',
                'free = _count("memory_bytes", memory_bytes)'),),
    ),
    Mistake(
        name="every uncached pass as long as the last",
        why="without a cache, pass i re-projects the p + i tokens seen so far, not the final length every time.",
        hint="From a 1-token prompt, how many tokens does the 3rd uncached pass project?",
        edits=(("uncached = n * p + n * (n - 1) // 2", "uncached = n * (p + n - 1)"),),
    ),
    Mistake(
        name="cached projections forgetting the prompt",
        why="the first pass projects every prompt token once; only the later passes project one token each.",
        hint="With a 5-token prompt and 2 more steps, how many tokens go through wk in all?",
        edits=(("cached = p + (n - 1)", "cached = n"),),
    ),
    Mistake(
        name="cached prompt pass scored as P instead of P x P",
        why="the prompt pass runs all P queries at once, each against the prompt's keys: P x P scores, "
            "even with a cache.",
        hint="In the prompt pass, how many query rows and how many key columns does the score matrix have?",
        edits=(("cached = p * p + (n - 1) * p", "cached = p + (n - 1) * p"),),
    ),
    Mistake(
        name="uncached scores counting only the unmasked half",
        why="the kata counts the L x L score entries an uncached pass computes; the causal mask hides half of "
            "them afterwards but they are still computed.",
        hint="Does q @ K.transpose(-2, -1) skip the entries the mask will hide?",
        edits=(("return m * (m + 1) * (2 * m + 1) // 6", "return m * (m + 1) * (m + 2) // 6"),),
    ),
    Mistake(
        name="hidden_size demanded when head_dim is given",
        why="hidden_size only matters as the default for a missing head_dim; a config that gives head_dim may "
            "leave hidden_size out or null, and the cache size does not depend on it.",
        hint="Which fields does the formula multiply? Read hidden_size only on the path that needs it.",
        edits=(('    head_dim = text.get("head_dim")\n',
                '    hidden_size = _field(text, "hidden_size")\n    head_dim = text.get("head_dim")\n'),),
    ),
    Mistake(
        name="dtype read only at the top level",
        why="a multimodal config may keep the dtype inside text_config alone; the language model's own "
            "dtype is the one its cache uses.",
        hint="When text_config is there, where does the language model say which dtype it runs in?",
        edits=(("    for source in (text, config):\n", "    for source in (config,):\n"),),
    ),
]
