"""Known mistakes of kata 19 — each the reference with one bug."""
from grader.mistakes import Mistake

_UPDATE = "            c_kv, k_pe = cache.update(layer, c_kv, k_pe)  # (B, S, C), (B, S, R)\n"
_NORM = "        c_kv = self.kv_a_layernorm(c_kv)  # (B, T, C)\n"

MISTAKES = [
    Mistake(
        name="per-head keys and values kept beside the latent",
        why="the layer keeps the up-projected K and V of every head (what the published DeepSeek-V2 modeling code "
            "cached): 71 times the bytes of the latent at V3's shapes, and a state that mixes up the sequences a "
            "layer serves.",
        hint="What does one token leave behind after a call: the latent and the rotary key in the cache, and what else?",
        edits=((_UPDATE, _UPDATE + "            self.per_head = self.kv_b_proj(c_kv)  # kept for the next step\n"),),
    ),
    Mistake(
        name="the latent rotated",
        why="RoPE applied to the latent puts a position-dependent rotation between W_UK and the query, which is "
            "exactly what absorption cannot fold; position belongs in the rotary key only.",
        hint="Which of c_kv and k_pe carries the position? What would W_UK have to commute with if c_kv were rotated?",
        edits=((_NORM, _NORM + "        c_kv = _rope_interleaved(c_kv[:, None], positions, self.rope_base)[:, 0]\n"),),
    ),
    Mistake(
        name="one rotary key per head",
        why="the rotary key is shared by every head; a copy per head multiplies the R numbers a token stores by the "
            "number of heads for no change in the output.",
        hint="How wide is what you hand to cache.update as k_pe: qk_rope_dim, or n_heads x qk_rope_dim?",
        edits=((_UPDATE, "            c_kv, k_pe = cache.update(layer, c_kv, k_pe.repeat(1, 1, self.n_heads))\n"
                         "            k_pe = k_pe[..., :R]\n"),),
    ),
    Mistake(
        name="absorbed scores scaled by the latent's width",
        why="the absorbed dot product is C + R wide, but the scores are still those of a head of width N + R: "
            "dividing by sqrt(C + R) changes every softmax.",
        hint="Write one absorbed score out: it equals a naive score exactly. By what does the naive path divide?",
        edits=(("weights = self._softmax(scores.view(B, H, T, -1), visible)",
                "weights = self._softmax(scores.view(B, H, T, -1) * math.sqrt((self.qk_nope_dim + self.qk_rope_dim)"
                " / (self.kv_lora_rank + self.qk_rope_dim)), visible)"),),
    ),
    Mistake(
        name="kv_b_proj split into all key rows, then all value rows",
        why="kv_b_proj's rows are grouped per head (each head's N key rows, then its V value rows); cutting the "
            "first H x N rows as W_UK gives head 1 part of head 0's values.",
        hint="View kv_b_proj.weight as (H, N + V, C) before you cut. Which rows does head 1 own?",
        edits=(("    per_head = weight.view(n_heads, qk_nope_dim + v_head_dim, weight.shape[1])  # (H, N + V, C)\n"
                "    return per_head[:, :qk_nope_dim], per_head[:, qk_nope_dim:]  # (H, N, C), (H, V, C)\n",
                "    split = n_heads * qk_nope_dim\n"
                "    return weight[:split].view(n_heads, qk_nope_dim, -1), weight[split:].view(n_heads, v_head_dim, -1)\n"),),
    ),
    Mistake(
        name="latent cached before kv_a_layernorm",
        why="the outputs are right, but the cache stores the raw projection and every read normalizes it again: "
            "not the latent a DeepSeek checkpoint's cache holds, and work on every step.",
        hint="Is kv_a_layernorm part of making the latent, or of reading it?",
        edits=((_NORM, ""), (_UPDATE, _UPDATE + "        c_kv = self.kv_a_layernorm(c_kv)\n")),
    ),
    Mistake(
        name="rotate-half RoPE on interleaved pairs",
        why="apply_rope pairs x[i] with x[i + R/2]; DeepSeek's rotary part pairs x[2i] with x[2i+1]. Both agree at "
            "position 0 only.",
        hint="Which two numbers of a 4-wide k_pe turn together? De-interleave (evens, then odds), apply_rope, interleave back.",
        edits=(("    halves = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)", "    halves = x"),
               ("    return torch.stack([turned[..., :half], turned[..., half:]], dim=-1).flatten(-2)",
                "    return turned")),
    ),
    Mistake(
        name="cache bytes as 2 x layers x tokens x kv_lora_rank",
        why="the latent stands for K and V together, so there is no factor 2, and the rotary key is stored too "
            "(a size once shipped in a serving library).",
        hint="What does one token leave in one layer: two latents, or one latent and one rotary key?",
        edits=(("return n_layers * batch * seq_len * (kv_lora_rank + qk_rope_dim) * dtype_bytes",
                "return 2 * n_layers * batch * seq_len * kv_lora_rank * dtype_bytes"),),
    ),
    Mistake(
        name="absorbed decode up-projects the latents anyway",
        why="the absorbed flag is ignored and kv_b_proj runs over every cached latent each step (the first llama.cpp "
            "port): right outputs, 100 times the FLOPs of decode at V3's shapes.",
        hint="With absorbed=True, which product involves S: W_UK times every latent, or the folded query times every latent?",
        edits=(("attend = self._absorbed if absorbed else self._naive", "attend = self._naive"),),
    ),
    Mistake(
        name="GQA groups without the rotary key",
        why="the latent is not all a token stores: (C + R) / (2 d_h) is 2.25 for DeepSeek, C / (2 d_h) gives 2.",
        hint="How many numbers per token does MLA store, and how many does one GQA group (a K and a V)?",
        edits=(("return (kv_lora_rank + qk_rope_dim) / (2 * head_dim)", "return kv_lora_rank / (2 * head_dim)"),),
    ),
    Mistake(
        name="absorbed FLOPs without the fold and the up-projection",
        why="absorbed decode still multiplies W_UK into the query and W_UV into each head's summed latent; they do "
            "not grow with S but are part of every step.",
        hint="List absorbed decode's four products: which two do not depend on the number of cached tokens?",
        edits=(("return 2 * H * (N * C + S * (C + R) + S * C + C * V)", "return 2 * H * (S * (C + R) + S * C)"),),
    ),
    Mistake(
        name="the cache keeps the caller's tensors",
        why="the first update stores c_kv and k_pe themselves; a caller who reuses its buffers then changes what "
            "the cache holds.",
        hint="After update returns, whose tensor is the first chunk the cache holds?",
        edits=(("c_kv, k_pe = c_kv.clone(), k_pe.clone()  # the caller's tensors stay the caller's",
                "pass  # stored as handed in"),),
    ),
    Mistake(
        name="every layer's latents under layer 0",
        why="the layer hands cache.update layer 0 whatever layer it is, so every layer of a model reads and grows "
            "one another's latents.",
        hint="Which layer number does forward pass on to cache.update?",
        edits=((_UPDATE, "            c_kv, k_pe = cache.update(0, c_kv, k_pe)  # (B, S, C), (B, S, R)\n"),),
    ),
]
