"""Hidden checks of kata 01 — appending to the cache."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks.common import (DTYPES, SEEDS, chunks, count_rows, expect_pair, load_linears, named, randn,
                                  value_error_names)
from grader.engine import Checks

CHECKS = Checks("01")


@st.composite
def kv_growth(draw):
    total = draw(st.integers(1, 9))
    return {
        "batch": draw(st.integers(1, 3)),
        "heads": draw(st.integers(1, 4)),
        "head_dim": draw(st.sampled_from([1, 2, 4, 8])),
        "chunks": chunks(total, draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))),
        "dtype": draw(DTYPES),
        "seed": draw(SEEDS),
    }


def _kv(ex, index, length, device):
    shape = (ex["batch"], ex["heads"], length, ex["head_dim"])
    k = randn(ex["seed"] + 2 * index, *shape, dtype=ex["dtype"], device=device)
    v = randn(ex["seed"] + 2 * index + 1, *shape, dtype=ex["dtype"], device=device)
    return k, v


def _grow(api, ctx, ex):
    seen, cache = {}, None
    for i, length in enumerate(ex["chunks"]):
        k, v = _kv(ex, i, length, ctx.device)
        cache = ctx.call(api.append_kv, cache, k, v)
        seen[f"after appending chunk {i + 1} of {length} token(s)"] = named(cache)
    return seen


@CHECKS.add("append_kv grows the cache along the sequence axis", uses="append_kv")
def append_kv_grows(ctx):
    ctx.forall(kv_growth(), lambda c, ex: c.differential(ex, lambda api, e: _grow(api, c, e),
                                                          "append_kv(cache, k_new, v_new), called chunk after chunk"))


@CHECKS.add("append_kv rejects bad input with a ValueError naming the argument", uses="append_kv")
def append_kv_rejects_bad_input(ctx):
    def body(c, ex):
        k, v = _kv(ex, 0, 2, c.device)
        cases = [
            ("k_new without a head axis", (None, k[:, 0], v), ("k_new",)),
            ("v_new longer than k_new", (None, k, torch.cat([v, v], 2)), ("v_new", "k_new")),
            ("k_new with another head count than the cache", ((k, v), torch.cat([k, k], 1), torch.cat([v, v], 1)), ("k_new", "cache")),
            ("k_new with another head width than the cache", ((k, v), torch.cat([k, k], 3), torch.cat([v, v], 3)), ("k_new", "cache")),
        ]
        for what, args, names in cases:
            exc = c.raises(ValueError, c.t.append_kv, *args, what=f"append_kv with {what}", example=ex)
            if not value_error_names(exc, names):
                c.fail(f"append_kv with {what} raised ValueError({str(exc)!r}); the message should name "
                       f"{' or '.join(names)}", ex, ("unnamed", what))

    ctx.forall(kv_growth(), body, max_examples=3)


@st.composite
def cache_steps(draw):
    return {
        "layers": draw(st.integers(1, 3)),
        "batch": draw(st.integers(1, 2)),
        "heads": draw(st.integers(1, 3)),
        "head_dim": draw(st.sampled_from([2, 4])),
        "chunks": chunks(draw(st.integers(1, 8)), draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))),
        "dtype": draw(DTYPES),
        "seed": draw(SEEDS),
    }


def _drive_cache(api, ctx, ex):
    cache = api.DynamicKVCache()
    seen = {"len before any update": len(cache), "seq_len(0) before any update": cache.seq_len(0)}
    for step, length in enumerate(ex["chunks"], start=1):
        for layer in range(ex["layers"]):
            k, v = _kv(ex, step * 10 + layer, length, ctx.device)
            seen[f"step {step}: update({layer}) result"] = named(ctx.call(cache.update, layer, k, v))
            seen[f"step {step}: seq_len({layer}) after update({layer})"] = cache.seq_len(layer)
            seen[f"step {step}: seq_len({layer + 1}) after update({layer})"] = cache.seq_len(layer + 1)
        seen[f"step {step}: len(cache)"] = len(cache)
    return seen


@CHECKS.add("DynamicKVCache keeps one growing cache per layer", uses="DynamicKVCache")
def dynamic_cache_per_layer(ctx):
    ctx.forall(cache_steps(), lambda c, ex: c.differential(
        ex, lambda api, e: _drive_cache(api, c, e),
        "a model's loop: each step calls update(layer, k, v) for layer 0, 1, ... then reads seq_len and len"))


@st.composite
def attention_run(draw):
    heads = draw(st.integers(1, 4))
    return {
        "batch": draw(st.integers(1, 3)),
        "d_model": heads * draw(st.sampled_from([2, 4, 8])),
        "n_heads": heads,
        "prompt": draw(st.integers(1, 6)),
        "decode_steps": draw(st.integers(0, 4)),
        "dtype": draw(DTYPES),
        "seed": draw(SEEDS),
    }


def _layer(api, ex, device):
    d = ex["d_model"]
    layer = api.CachedAttention(d, ex["n_heads"]).to(device=device, dtype=ex["dtype"])
    load_linears(layer, {name: (d, d) for name in ("wq", "wk", "wv", "wo")}, ex["seed"], "CachedAttention")
    return layer


def _tokens(ex, device):
    total = ex["prompt"] + ex["decode_steps"]
    return randn(ex["seed"] + 7, ex["batch"], total, ex["d_model"], dtype=ex["dtype"], device=device)


def _generate(api, ctx, ex):
    layer, x, P = _layer(api, ex, ctx.device), _tokens(ex, ctx.device), ex["prompt"]
    out, cache = expect_pair(ctx.call(layer, x[:, :P]), "forward(x)")
    seen = {"prefill output": out, "cache after prefill": named(cache)}
    for step in range(ex["decode_steps"]):
        out, cache = expect_pair(ctx.call(layer, x[:, P + step:P + step + 1], cache), "forward(x, cache)")
        seen[f"decode step {step + 1} output"] = out
        seen[f"cache after decode step {step + 1}"] = named(cache)
    return seen


@CHECKS.add("CachedAttention prefill: causal attention over the prompt", uses="CachedAttention.forward")
def attention_prefill(ctx):
    ctx.forall(attention_run(), lambda c, ex: c.differential(
        {**ex, "decode_steps": 0}, lambda api, e: _generate(api, c, e), "prefill: layer(x) with cache=None"))


@CHECKS.add("CachedAttention decode steps match the uncached forward", uses="CachedAttention.forward")
def attention_decode(ctx):
    ctx.forall(attention_run().filter(lambda e: e["decode_steps"] > 0), lambda c, ex: c.differential(
        ex, lambda api, e: _generate(api, c, e), "prefill, then one-token steps that pass the returned cache back in"))


@CHECKS.add("a decode step projects only the new token", uses="CachedAttention.forward")
def decode_projects_one_token(ctx):
    def body(c, ex):
        layer, x, P = _layer(c.t, ex, c.device), _tokens(ex, c.device), ex["prompt"]
        _, cache = layer(x[:, :P])
        for step in range(ex["decode_steps"]):
            with count_rows(layer, ["wq", "wk", "wv"]) as rows:
                _, cache = layer(x[:, P + step:P + step + 1], cache)
            extra = {name: n for name, n in rows.items() if n > ex["batch"]}
            if extra:
                c.fail(f"decode step {step + 1} (after {P + step} cached token(s)) sent "
                       + ", ".join(f"{n} rows through {name}" for name, n in extra.items())
                       + f"; one new token per sequence is {ex['batch']} row(s). Project only the new token "
                       "and reuse the cached keys and values.", ex, ("rows", tuple(sorted(extra.items()))))

    ctx.forall(attention_run().filter(lambda e: e["decode_steps"] > 0), body, max_examples=5)


@CHECKS.add("CachedAttention rejects bad input with a ValueError naming the argument", uses="CachedAttention.forward")
def attention_rejects_bad_input(ctx):
    def body(c, ex):
        layer, x = _layer(c.t, ex, c.device), _tokens(ex, c.device)
        c.raises(ValueError, layer, x[0], what="forward with x missing the batch axis", example=ex)
        c.raises(ValueError, layer, torch.cat([x, x], -1), what="forward with x wider than d_model", example=ex)

    ctx.forall(attention_run(), body, max_examples=2)
