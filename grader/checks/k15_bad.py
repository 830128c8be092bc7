"""Bad input for kata 15's checks, in both directions: each argument too small, too large where a bound
exists, of the wrong type, each refused with a ValueError naming it; and each boundary value accepted
(a one-token sequence, past length 0, maxima exactly the true ones, an unseen sequence's seq_len 0).
"""
from __future__ import annotations

import torch

from grader.checks.k15_rows import cu, fields, row
from grader.checks.support.common import expect_value_error, randn
from grader.checks.support.models import successor_model


def _refused(c, ex, fn, tries) -> None:
    for what, args, kwargs, name in tries:
        expect_value_error(c, fn, *args, what=what, names=(name,), example=ex, **kwargs)


def bad_pack(c, ex):
    _refused(c, ex, c.t.cu_seqlens, [
        (f"cu_seqlens({bad!r})", (bad,), {}, "lengths")
        for bad in ([], [3, 0], [2, -1], [2, 1.0], [True], None, 4, "12")])
    c.t.cu_seqlens([1])  # the boundary: a sequence of one token
    seqs = [[1, 2], [3]]
    _refused(c, ex, c.t.pack, [
        ("pack([])", ([],), {}, "seqs"),
        ("pack(None)", (None,), {}, "seqs"),
        ("pack with an empty sequence", ([[1, 2], []],), {}, "seqs"),
        ("pack with the token id -1", ([[1, -1]],), {}, "seqs"),
        ("pack with the token 2.0 (a float)", ([[1, 2.0]],), {}, "seqs"),
        ("pack with a sequence that is not a list", ([[1, 2], 3],), {}, "seqs"),
        ("pack with past_lens [0] for 2 sequences", (seqs, [0]), {}, "past_lens"),
        ("pack with past_lens [0, 0, 0] for 2 sequences", (seqs, [0, 0, 0]), {}, "past_lens"),
        ("pack with past_lens [0, -1]", (seqs, [0, -1]), {}, "past_lens"),
        ("pack with past_lens [0, 1.5]", (seqs, [0, 1.5]), {}, "past_lens"),
        ("pack with past_lens [] for 2 sequences", (seqs, []), {}, "past_lens"),
        ("pack with seq_ids [] for 2 sequences", (seqs, None, []), {}, "seq_ids"),
        ("pack with seq_ids [7] for 2 sequences", (seqs, None, [7]), {}, "seq_ids"),
        ("pack with seq_ids [7, 8, 9] for 2 sequences", (seqs, None, [7, 8, 9]), {}, "seq_ids"),
        ("pack with seq_ids [7, 7] (the same id twice)", (seqs, None, [7, 7]), {}, "seq_ids"),
    ])
    # the boundaries: token id 0, past length 0, one sequence of one token (read as plain data, as every Packed is)
    c.differential(ex, lambda api, e: fields(api.pack([[0]], [0], ["only"])), "pack([[0]], [0], ['only'])")


def _offsets(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def bad_mask(c, ex):
    q, k = cu([3, 1]), cu([3, 4])  # [0, 3, 4] and [0, 3, 7]
    tries = []
    for name, good in (("cu_seqlens_q", q), ("cu_seqlens_k", k)):
        for what, bad in (("int64", good.long()), ("float", good.double()), ("2-D", good[None]),
                          ("a list, not a tensor", good.tolist())):
            tries.append((f"varlen_mask with {name} {what}", (bad, k) if name == "cu_seqlens_q" else (q, bad), {},
                          (name,)))
    tries += [
        ("varlen_mask with cu_seqlens_q not starting at 0", (_offsets([1, 3, 4]), k), {}, ("cu_seqlens_q",)),
        ("varlen_mask with cu_seqlens_q holding a sequence of 0 tokens", (_offsets([0, 3, 3, 4]), _offsets([0, 3, 5, 7])),
         {}, ("cu_seqlens_q",)),
        ("varlen_mask with cu_seqlens_q decreasing", (_offsets([0, 3, 2]), k), {}, ("cu_seqlens_q",)),
        ("varlen_mask with cu_seqlens_k not starting at 0", (q, _offsets([1, 4, 8])), {}, ("cu_seqlens_k",)),
        ("varlen_mask with cu_seqlens_k holding a sequence of 0 tokens", (_offsets([0, 3, 4, 5]), _offsets([0, 3, 3, 7])),
         {}, ("cu_seqlens_k",)),
        ("varlen_mask with cu_seqlens_k decreasing", (q, _offsets([0, 7, 3])), {}, ("cu_seqlens_k",)),
        ("varlen_mask with 3 sequences in cu_seqlens_k for 2 in cu_seqlens_q", (q, cu([3, 4, 1])), {},
         ("cu_seqlens_k", "cu_seqlens_q")),
        ("varlen_mask with a sequence of 3 queries and 2 keys", (q, cu([2, 4])), {}, ("cu_seqlens_k",)),
        ("varlen_mask with a second sequence of 3 queries and 2 keys", (cu([1, 3]), cu([3, 2])), {}, ("cu_seqlens_k",)),
        ("varlen_mask with 2 sequences in cu_seqlens_k for 3 in cu_seqlens_q", (cu([3, 1, 1]), k), {},
         ("cu_seqlens_q", "cu_seqlens_k")),
        ("varlen_mask with no sequence at all: both offsets [0]", (_offsets([0]), _offsets([0])), {},
         ("cu_seqlens_q", "cu_seqlens_k")),
    ]
    for what, args, kwargs, names in tries:
        expect_value_error(c, c.t.varlen_mask, *args, what=what, names=names, example=ex, **kwargs)
    c.t.varlen_mask(cu([3, 1]), cu([3, 1]))  # the boundary: as many keys as queries


def bad_attention(c, ex):
    cu_q, cu_k = cu([3, 1]), cu([3, 4])
    q, k, v = randn(1, 4, 4, 8), randn(2, 7, 2, 8), randn(3, 7, 2, 8)
    ok = (q, k, v, cu_q, cu_k, 3, 4)

    def change(i, value):
        return tuple(value if j == i else a for j, a in enumerate(ok))
    _refused(c, ex, c.t.varlen_attention, [
        ("q 2-D", change(0, q[:, 0]), {}, "q"), ("q 4-D", change(0, q[None]), {}, "q"),
        ("v 4-D", change(2, v[None]), {}, "v"),
        ("v of 6 tokens for k of 7", change(2, v[:6]), {}, "v"),
        ("v of 8 tokens for k of 7", change(2, randn(3, 8, 2, 8)), {}, "v"),
        ("k and v with 2 KV heads for 3 query heads", (randn(1, 4, 3, 8), k, v, *ok[3:]), {}, "k"),
        ("k and v with heads of width 16 for q's 8", (q, randn(2, 7, 2, 16), randn(3, 7, 2, 16), *ok[3:]), {}, "k"),
        ("k and v with 3 KV heads for 4 query heads", (q, randn(4, 7, 3, 8), randn(5, 7, 3, 8), *ok[3:]), {}, "k"),
        ("k and v with heads of width 4 for q's 8", (q, k[..., :4], v[..., :4], *ok[3:]), {}, "k"),
        ("cu_seqlens_q ending at 3 for q of 4 tokens", change(3, cu([2, 1])), {}, "cu_seqlens_q"),
        ("cu_seqlens_q ending at 5 for q of 4 tokens", change(3, cu([3, 2])), {}, "cu_seqlens_q"),
        ("cu_seqlens_k ending at 8 for k of 7 tokens", change(4, cu([3, 5])), {}, "cu_seqlens_k"),
        ("cu_seqlens_q int64", change(3, cu_q.long()), {}, "cu_seqlens_q"),
        ("max_seqlen_q 2 below the longest sequence's 3 queries", change(5, 2), {}, "max_seqlen_q"),
        ("max_seqlen_k 3 below the longest sequence's 4 keys", change(6, 3), {}, "max_seqlen_k"),
        ("max_seqlen_q 3.0 (a float)", change(5, 3.0), {}, "max_seqlen_q"),
        ("max_seqlen_k None", change(6, None), {}, "max_seqlen_k"),
        ("a causal sequence of 3 queries and 2 keys", (q, randn(2, 6, 2, 8), randn(3, 6, 2, 8), cu_q, cu([2, 4]), 3, 4),
         {}, "cu_seqlens_k"),
        ("causal=1 (not a bool)", ok, {"causal": 1}, "causal"),
        ("causal=None", ok, {"causal": None}, "causal"),
        ("scale=0", ok, {"scale": 0.0}, "scale"), ("scale=-0.5", ok, {"scale": -0.5}, "scale"),
        ("scale='0.5' (a string)", ok, {"scale": "0.5"}, "scale"),
    ])
    expect_value_error(c, c.t.varlen_attention, q, k[:, 0], v[:, 0], *ok[3:], what="k and v 2-D", names=("k", "v"),
                       example=ex)
    for accepted in (ok, change(5, 100), change(6, 100)):  # the exact maxima, and any above them
        c.t.varlen_attention(*accepted)
    c.t.varlen_attention(q, k[:4], v[:4], cu_q, cu([2, 2]), 3, 2, causal=False)  # not causal: fewer keys is fine
    c.t.varlen_attention(*ok, scale=2)  # an int scale is a number


def bad_cache(c, ex):
    cache = c.t.PackedKVCache()
    k = randn(ex["seed"], 1, 2, 3, 4, device=c.device)
    _refused(c, ex, cache.update, [("update before any begin", (0, k, k.clone()), {}, "begin")])
    cache.begin(row([2, 1], [0, 0], ["a", "b"], c.device))
    cache.update(0, k, k.clone())
    cache.begin(row([1], [2], ["a"], c.device))
    one = randn(ex["seed"] + 1, 1, 2, 1, 4, device=c.device)
    _refused(c, ex, cache.update, [
        ("update of layer -1", (-1, one, one.clone()), {}, "layer"),
        ("update of layer '0' (a string)", ("0", one, one.clone()), {}, "layer"),
        ("update with k and v 3-D", (0, one[0], one[0].clone()), {}, "k"),
        ("update with k 5-D", (0, one[..., None], one[..., None].clone()), {}, "k"),
        ("update with k of batch 2", (0, torch.cat([one, one]), torch.cat([one, one])), {}, "k"),
        ("update with k of 2 tokens for a row of 1", (0, k[:, :, :2], k[:, :, :2].clone()), {}, "k"),
        ("update with k of 0 tokens for a row of 1", (0, k[:, :, :0], k[:, :, :0].clone()), {}, "k"),
        ("update with k of 3 heads where 2 are held", (0, randn(5, 1, 3, 1, 4), randn(6, 1, 3, 1, 4)), {}, "k"),
        ("update with k of width 8 where 4 is held", (0, randn(5, 1, 2, 1, 8), randn(6, 1, 2, 1, 8)), {}, "k"),
        ("update with k of 1 head where 2 are held", (0, one[:, :1], one[:, :1].clone()), {}, "k"),
        ("update with k of width 2 where 4 is held", (0, one[..., :2], one[..., :2].clone()), {}, "k"),
        ("update with v of another shape", (0, one, randn(7, 1, 2, 1, 8)), {}, "v"),
        ("update with v None", (0, one, None), {}, "v"),
    ])
    _refused(c, ex, cache.begin, [
        ("begin with sequence 'a' continuing from 1 cached token where 2 are held", (row([1], [1], ["a"]),), {}, "packed"),
        ("begin with sequence 'a' continuing from 3 cached tokens where 2 are held", (row([1], [3], ["a"]),), {},
         "packed"),
        ("begin with a new sequence 'c' continuing from 1 cached token", (row([1], [1], ["c"]),), {}, "packed"),
    ])
    _refused(c, ex, cache.seq_len, [("seq_len('a', layer=-1)", ("a",), {"layer": -1}, "layer"),
                                    ("seq_len('a', layer=1.0)", ("a",), {"layer": 1.0}, "layer")])
    _refused(c, ex, cache.free, [("free('c'), an id never held", ("c",), {}, "seq_id")])
    held = (cache.seq_len("a"), cache.seq_len("b"), cache.seq_len("a", 1), cache.seq_len("c"))
    if held != (2, 1, 0, 0):
        c.fail(f"after the refused calls, seq_len of 'a', 'b', 'a' in layer 1 and the unseen 'c' are {held}, expected "
               "(2, 1, 0, 0): check the input before changing anything", ex, ("changed", held))
    K, _ = cache.update(0, one, one.clone())  # the row begun before the refused begins is still the row
    if tuple(K.shape) != (1, 2, 3, 4):
        c.fail(f"after refused begins, update of the row begun before (sequence 'a', 1 new token after 2) returned K "
               f"of shape {tuple(K.shape)}, expected (1, 2, 3, 4): a refused begin must not change the row",
               ex, ("row changed", tuple(K.shape)))
    cache.free("a")
    _refused(c, ex, cache.free, [("free('a') twice", ("a",), {}, "seq_id")])


def bad_generate(c, ex):
    model = successor_model(16, c.device)
    _refused(c, ex, c.t.packed_generate, [
        ("packed_generate with prompts None", (model, None, 3), {}, "prompts"),
        ("packed_generate with an empty prompt", (model, [[1], []], 3), {}, "prompts"),
        ("packed_generate with the token id 16 of a 16-token vocabulary", (model, [[1, 16]], 3), {}, "prompts"),
        ("packed_generate with the token id -1", (model, [[-1]], 3), {}, "prompts"),
        ("packed_generate with the token 2.0 (a float)", (model, [[2.0]], 3), {}, "prompts"),
        ("packed_generate with a prompt that is an int", (model, [3], 3), {}, "prompts"),
        ("packed_generate with max_new_tokens -1", (model, [[1]], -1), {}, "max_new_tokens"),
        ("packed_generate with max_new_tokens 2.5", (model, [[1]], 2.5), {}, "max_new_tokens"),
        ("packed_generate with eos_token_id 16 of a 16-token vocabulary", (model, [[1]], 3), {"eos_token_id": 16},
         "eos_token_id"),
        ("packed_generate with eos_token_id -1", (model, [[1]], 3), {"eos_token_id": -1}, "eos_token_id"),
        ("packed_generate with eos_token_id '2' (a string)", (model, [[1]], 3), {"eos_token_id": "2"},
         "eos_token_id"),
    ])
    c.t.packed_generate(model, [[0], [15]], 1, eos_token_id=15)  # the boundaries: ids 0 and 15, EOS 15, budget 1
