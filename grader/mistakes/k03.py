"""Known mistakes of kata 03 — each the reference with one bug."""
from grader.mistakes import Mistake

_REPEAT = "K, V = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)  # (B, Hq, S, D)"

MISTAKES = [
    Mistake(
        name="tiled repeat instead of interleave",
        why="x.repeat (tiling) gives k0 k1 k0 k1, so query head 1 reads KV head 1 instead of KV head 0; with one "
            "KV head (MQA) or one query head per KV head (MHA) the two orders agree, which hides the bug.",
        hint="For n_kv = 2 and n_rep = 3, write the 6 output heads in order. Which torch function gives k0 k0 k0 k1 k1 k1?",
        edits=(("x[:, :, None].expand(B, H, n_rep, S, D)", "x[:, None].expand(B, n_rep, H, S, D)"),),
    ),
    Mistake(
        name="query heads grouped as (n_rep, n_kv)",
        why="forward pairs query head j with KV head j % n_kv instead of j // n_rep (a view as (n_rep, n_kv) instead "
            "of (n_kv, n_rep)), so each group of neighbouring query heads reads different KV heads.",
        hint="Query heads h*n_rep … h*n_rep + n_rep - 1 form one group. Which KV head does query head 1 use when n_rep = 2?",
        edits=((_REPEAT, "K, V = (t[:, None].expand(-1, self.n_rep, -1, -1, -1).flatten(1, 2) for t in (k, v))"),),
    ),
    Mistake(
        name="caching n_q heads (repeat before storing)",
        why="the outputs are right, but the cache stores every KV head n_rep times, which throws away the memory "
            "saving that is the reason for grouped-query attention.",
        hint="What shape should the returned K have: (B, n_q_heads, S, D) or (B, n_kv_heads, S, D)? Repeat at the last moment.",
        edits=(("        v = self._split(self.wv(x), self.n_kv_heads)  # (B, Hkv, T, D)\n",
                "        v = self._split(self.wv(x), self.n_kv_heads)  # (B, Hkv, T, D)\n"
                "        k, v = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)\n"),
               (_REPEAT, "K, V = k, v")),
    ),
    Mistake(
        name="positions restart at 0 on each call",
        why="RoPE rotates the new tokens as if they began a fresh sequence, so their keys are stored at the wrong "
            "positions and the queries meet the cache at the wrong distances.",
        hint="After P cached tokens, at which positions do the new tokens sit?",
        edits=(("pos = torch.arange(past, past + T, device=x.device)", "pos = torch.arange(T, device=x.device)"),),
    ),
    Mistake(
        name="head_dim defaults to d_model // n_kv_heads",
        why="the head width is shared by queries, keys and values and comes from the query heads: "
            "d_model // n_q_heads. Dividing by n_kv_heads makes every projection too wide under GQA.",
        hint="With d_model = 32, 4 query heads and 2 KV heads, how wide is one head?",
        edits=(("head_dim = d_model // n_q_heads if head_dim is None", "head_dim = d_model // n_kv_heads if head_dim is None"),),
    ),
    Mistake(
        name="scores scaled by the default head width",
        why="the scores must be divided by sqrt(head_dim) of the heads actually used; d_model // n_q_heads is only "
            "the default and differs when head_dim is given.",
        hint="GQAttention(d_model=8, n_q_heads=4, n_kv_heads=2, head_dim=6): by what do you divide the scores?",
        edits=(("/ math.sqrt(self.head_dim)", "/ math.sqrt(self.d_model // self.n_q_heads)"),),
    ),
    Mistake(
        name="n_q_heads % n_kv_heads not checked",
        why="with n_q = 4 and n_kv = 3 the heads cannot be split into equal groups; the layer must refuse at "
            "construction instead of silently using n_rep = 1.",
        hint="What should GQAttention(32, 4, 3) do?",
        edits=(("if n_kv_heads <= 0 or n_q_heads % n_kv_heads:", "if n_kv_heads <= 0:"),),
    ),
    Mistake(
        name="re-projecting the whole history every call",
        why="keeping the hidden states and projecting all of them again gives the right numbers, but the cache "
            "exists so that past keys and values are computed once.",
        hint="On a decode step, how many rows should go through wk and wv?",
        edits=(("        k = apply_rope(self._split(self.wk(x), self.n_kv_heads), pos, self.rope_base)  # (B, Hkv, T, D)\n"
                "        v = self._split(self.wv(x), self.n_kv_heads)  # (B, Hkv, T, D)\n"
                "        if cache is not None:\n"
                "            k = torch.cat([cache[0], k], dim=2)  # (B, Hkv, S, D)\n"
                "            v = torch.cat([cache[1], v], dim=2)  # (B, Hkv, S, D)\n",
                "        self._seen = x if cache is None else torch.cat([self._seen, x], dim=1)\n"
                "        every = torch.arange(past + T, device=x.device)\n"
                "        k = apply_rope(self._split(self.wk(self._seen), self.n_kv_heads), every, self.rope_base)\n"
                "        v = self._split(self.wv(self._seen), self.n_kv_heads)\n"),),
    ),
    Mistake(
        name="a cache handed back in not checked",
        why="a cache with other heads, another head width or K and V of different lengths reaches torch.cat, "
            "which either fails with a message about tensors or quietly builds a pair that does not line up.",
        hint="Before you concatenate, what must the cached K and V share with the new keys and values?",
        edits=(("        _expect_cache(cache, B, self.n_kv_heads, self.head_dim, x.dtype)\n", ""),),
    ),
    Mistake(
        name="the layer keeps its own cache",
        why="keys and values kept in the layer mix up the sequences one layer serves; the cache that is handed "
            "in and returned is the only memory a call may use.",
        hint="Which cache does forward read when two sequences take turns through the same layer?",
        edits=(("            k = torch.cat([cache[0], k], dim=2)  # (B, Hkv, S, D)\n"
                "            v = torch.cat([cache[1], v], dim=2)  # (B, Hkv, S, D)\n",
                "            k = torch.cat([self.kv[0], k], dim=2)  # (B, Hkv, S, D)\n"
                "            v = torch.cat([self.kv[1], v], dim=2)  # (B, Hkv, S, D)\n        self.kv = (k, v)\n"),),
    ),
    Mistake(
        name="head_dim=0 taken as not given",
        why="`head_dim or d_model // n_q_heads` treats an explicit 0 like None and quietly builds a layer of "
            "another width instead of refusing a size that cannot work.",
        hint="Which values of head_dim mean \"use the default\", and which are mistakes to report?",
        edits=(("head_dim = d_model // n_q_heads if head_dim is None else head_dim",
                "head_dim = head_dim or d_model // n_q_heads"),),
    ),
]
