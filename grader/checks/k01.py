"""Hidden checks of kata 01 — appending to the cache."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.engine import report
from grader.checks.support import devices, envelope, protocol
from grader.checks.support.common import (DTYPES, SEEDS, bad_caches, chunks, count_rows, expect_bad_caches_refused,
                                          expect_no_bias, expect_pair, expect_value_error, held_tensors, interleaved,
                                          load_linears, named, randn, value_error_names)
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
    k = envelope.tensor(ex, ex["seed"] + 2 * index, *shape, device=device)
    v = envelope.tensor(ex, ex["seed"] + 2 * index + 1, *shape, device=device)
    return k, v


def _grow(api, ctx, ex):
    seen, cache = {}, None
    for i, length in enumerate(ex["chunks"]):
        k, v = _kv(ex, i, length, ctx.device)
        cache = ctx.call(api.append_kv, cache, k, v)
        seen[f"after appending chunk {i + 1} ({length} token{'' if length == 1 else 's'})"] = named(cache)
    return seen


GROWTH = {"batch": 2, "heads": 4, "head_dim": 8, "chunks": [3, 1, 2], "dtype": torch.float32, "seed": 5}


@CHECKS.add("append_kv grows the cache along the sequence axis", uses="append_kv")
def append_kv_grows(ctx):
    def body(c, ex):
        c.differential(ex, lambda api, e: _grow(api, c, e), "append_kv(cache, k_new, v_new), called chunk after chunk")

    ctx.forall(kv_growth(), body)
    envelope.run(ctx, GROWTH, ("large", "half", "strided"), body,
                 large={"batch": 1, "heads": 16, "head_dim": 4, "chunks": [257, 1]})


@CHECKS.add("append_kv rejects bad input with a ValueError naming the argument", uses="append_kv")
def append_kv_rejects_bad_input(ctx):
    def body(c, ex):
        k, v = _kv(ex, 0, 2, c.device)
        cases = [
            ("k_new without a head axis", (None, k[:, 0], v), ("k_new",)),
            ("k_new and v_new without a head axis", (None, k[:, 0], v[:, 0]), ("k_new", "v_new")),
            ("k_new and v_new with an extra axis", (None, k[None], v[None]), ("k_new", "v_new")),
            ("k_new that is not a tensor", (None, k.tolist(), v), ("k_new",)),
            ("v_new that is not a tensor", (None, k, v.tolist()), ("v_new",)),
            ("v_new longer than k_new", (None, k, torch.cat([v, v], 2)), ("v_new", "k_new")),
            ("v_new shorter than k_new", (None, k, v[:, :, :1]), ("v_new", "k_new")),
            ("k_new with another head count than the cache", ((k, v), torch.cat([k, k], 1), torch.cat([v, v], 1)), ("k_new", "cache")),
            ("k_new with another head width than the cache", ((k, v), torch.cat([k, k], 3), torch.cat([v, v], 3)), ("k_new", "cache")),
        ]
        for what, args, names in cases:
            expect_value_error(c, c.t.append_kv, *args, what=f"append_kv with {what}", names=names, example=ex)

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
        seen[f"step {step}: seq_len() (layer 0 by default)"] = cache.seq_len()
    return seen


@CHECKS.add("DynamicKVCache keeps one growing cache per layer", uses="DynamicKVCache")
def dynamic_cache_per_layer(ctx):
    def body(c, ex):
        c.differential(ex, lambda api, e: _drive_cache(api, c, e),
                       "a model's loop: each step calls update(layer, k, v) for layer 0, 1, ... then reads seq_len and len")

    ctx.forall(cache_steps(), body)
    base = {"layers": 2, "batch": 1, "heads": 2, "head_dim": 4, "chunks": [2, 1], "dtype": torch.float32, "seed": 3}
    envelope.run(ctx, base, ("large", "half"), body, large={"heads": 16, "chunks": [257, 1]})


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
    return envelope.tensor(ex, ex["seed"] + 7, ex["batch"], total, ex["d_model"], device=device)


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
    def body(c, ex):
        c.differential({**ex, "decode_steps": 0}, lambda api, e: _generate(api, c, e),
                              "prefill: layer(x) with cache=None")

    ctx.forall(attention_run(), body)
    envelope.run(ctx, ATTENTION, ("half", "strided", "magnitude"), body)  # the decode check runs the large prefill


ATTENTION = {"batch": 2, "d_model": 16, "n_heads": 2, "prompt": 5, "decode_steps": 2, "dtype": torch.float32, "seed": 9}


@CHECKS.add("CachedAttention decode steps match the uncached forward", uses="CachedAttention.forward")
def attention_decode(ctx):
    def body(c, ex):
        c.differential(ex, lambda api, e: _generate(api, c, e),
                              "prefill, then one-token steps that pass the returned cache back in")

    ctx.forall(attention_run().filter(lambda e: e["decode_steps"] > 0), body)
    envelope.run(ctx, ATTENTION, ("large", "half", "magnitude"), body,
                 large={"batch": 1, "n_heads": 16, "d_model": 64, "prompt": 257, "decode_steps": 1})


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
        c.raises(ValueError, layer, x[..., :1], what="forward with x narrower than d_model", example=ex)
        expect_value_error(c, layer, x[None], what="forward with x carrying an extra axis", names=("x",), example=ex)
        expect_no_bias(c, layer, ex)

    ctx.forall(attention_run(), body, max_examples=2)


@CHECKS.add("append_kv rejects a bad cache passed back in, naming the argument", uses="append_kv")
def append_kv_rejects_bad_cache(ctx):
    def body(c, ex):
        K, V = _kv(ex, 0, 3, c.device)
        k, v = _kv(ex, 1, 1, c.device)
        lists = [("a cache of two lists", (K.tolist(), V.tolist())), ("a cache whose K is a list", (K.tolist(), V)),
                 ("a cache whose V is a list", (K, V.tolist()))]
        for what, cache in bad_caches(K, V) + lists:
            expect_value_error(c, c.t.append_kv, cache, k, v, what=f"append_kv with {what}", names=("cache", "k_new"),
                               example=ex)
        other = torch.float32 if ex["dtype"] == torch.float64 else torch.float64
        expect_value_error(c, c.t.append_kv, (K, V), k, v.to(other), what="append_kv with v_new in another dtype "
                           "than k_new", names=("v_new", "k_new"), example=ex)
        expect_value_error(c, c.t.append_kv, (K, V), torch.cat([k, k]), torch.cat([v, v]),
                           what="append_kv with k_new of another batch size than the cache", names=("k_new", "cache"),
                           example=ex)

    ctx.forall(kv_growth(), body, max_examples=3)


@CHECKS.add("DynamicKVCache.update rejects a bad layer or mismatched k_new, v_new, naming the argument",
            uses="DynamicKVCache.update")
def dynamic_cache_rejects_bad_input(ctx):
    def body(c, ex):
        cache = c.t.DynamicKVCache()
        k, v = _kv(ex, 0, 2, c.device)
        c.call(cache.update, 0, k, v)
        for what, layer in (("layer=-1", -1), ("layer=0.5", 0.5), ("layer='0'", "0")):
            expect_value_error(c, cache.update, layer, k, v, what=f"update({what}, k_new, v_new)", names=("layer",),
                               example=ex)
        other = torch.float32 if ex["dtype"] == torch.float64 else torch.float64
        for what, pair in (("k_new, v_new with twice the heads layer 0 holds", (torch.cat([k, k], 1), torch.cat([v, v], 1))),
                           ("v_new longer than k_new", (k, torch.cat([v, v], 2))),
                           ("k_new without a head axis", (k[:, 0], v[:, 0])),
                           ("k_new, v_new in another dtype than layer 0 holds", (k.to(other), v.to(other)))):
            expect_value_error(c, cache.update, 0, *pair, what=f"update(0, ...) with {what}",
                               names=("k_new", "v_new", "cache"), example=ex)

    ctx.forall(cache_steps(), body, max_examples=2)


@CHECKS.add("DynamicKVCache: a layer that skips ahead is a ValueError or kept apart", uses="DynamicKVCache.update")
def dynamic_cache_layer_skipping_ahead(ctx):
    def body(c, ex):
        cache = c.t.DynamicKVCache()
        k, v = _kv(ex, 0, 2, c.device)
        k0, v0 = _kv(ex, 1, 1, c.device)
        try:
            got = c.call(cache.update, 2, k, v)
        except ValueError as exc:  # refusing a layer that skips ahead is fine, if the message says which
            if not value_error_names(exc, ("layer",)):
                c.fail(f"update(2, ...) on an empty cache raised ValueError({str(exc)!r}); the message should name "
                       "layer", ex, ("unnamed", "layer"))
            return
        seen = {"update(2) result": named(got), "seq_len(2)": cache.seq_len(2), "seq_len(0)": cache.seq_len(0),
                "seq_len(1)": cache.seq_len(1)}
        seen["then update(0) result"] = named(c.call(cache.update, 0, k0, v0))
        seen["then seq_len(0)"], seen["then seq_len(2)"] = cache.seq_len(0), cache.seq_len(2)
        expected = {"update(2) result": {"K": k, "V": v}, "seq_len(2)": 2, "seq_len(0)": 0, "seq_len(1)": 0,
                    "then update(0) result": {"K": k0, "V": v0}, "then seq_len(0)": 1, "then seq_len(2)": 2}
        problem = report.compare(expected, seen)
        if problem:
            c.fail("update(2, k, v) on an empty cache (2 tokens), then update(0, k0, v0) (1 token): raise a ValueError "
                   f"naming layer, or keep each layer's tokens apart (layers 0 and 1 not seen yet)\n  {problem}", ex,
                   seen)

    ctx.forall(cache_steps(), body, max_examples=2)


@CHECKS.add("CachedAttention rejects a bad cache passed back in, and bad sizes", uses="CachedAttention.forward")
def attention_rejects_bad_cache(ctx):
    def body(c, ex):
        layer, x, P = _layer(c.t, ex, c.device), _tokens(ex, c.device), ex["prompt"]
        expect_bad_caches_refused(c, layer, x, P, ex, "a decode step")
        d, h = ex["d_model"], ex["n_heads"]
        for args in ((d, d + 1), (d, 0), (0, h), (d, -h)):
            expect_value_error(c, c.t.CachedAttention, *args, what=f"CachedAttention(d_model={args[0]}, n_heads={args[1]})",
                               names=("d_model", "n_heads"), example=ex)
        try:  # the smallest layer is valid: one head of width 1
            c.t.CachedAttention(1, 1)
        except ValueError as exc:
            c.fail(f"CachedAttention(d_model=1, n_heads=1) raised ValueError({str(exc)!r}); one head of width 1 "
                   "is a valid layer", ex, ("rejected", "smallest"))

    ctx.forall(attention_run().filter(lambda e: e["decode_steps"] > 0), body, max_examples=2)


def _queries_held(layer, ex, cache) -> list[str]:
    """Tensors the layer keeps that look like per-token queries or hidden states: a float tensor ending in
    head_dim or d_model with an axis as long as the tokens seen (the returned cache itself left out)."""
    seen, head_dim = ex["prompt"] + ex["decode_steps"], ex["d_model"] // ex["n_heads"]
    returned = {t.untyped_storage().data_ptr() for t in cache if isinstance(t, torch.Tensor)}
    return [f"{name} {tuple(t.shape)}" for name, t in held_tensors(layer)
            if t.is_floating_point() and t.dim() >= 2 and t.shape[-1] in (head_dim, ex["d_model"])
            and seen in t.shape[:-1] and t.untyped_storage().data_ptr() not in returned]


@CHECKS.add("CachedAttention stores no queries: forward depends on x and the cache only", uses="CachedAttention.forward")
def attention_keeps_no_state(ctx):
    def held(c, ex):
        layer, x, P = _layer(c.t, ex, c.device), _tokens(ex, c.device), ex["prompt"]
        out, cache = expect_pair(c.call(layer, x[:, :P]), "forward(x)")
        for step in range(ex["decode_steps"]):
            out, cache = expect_pair(c.call(layer, x[:, P + step:P + step + 1], cache), "forward(x, cache)")
        kept = _queries_held(layer, ex, cache)
        if kept:
            c.fail(f"after a {P}-token prefill and {ex['decode_steps']} decode steps the layer holds "
                   f"{', '.join(kept)}: a query is used once, in its own step, and never stored (only K and V are "
                   "cached, and the caller holds them)", ex, ("held", len(kept)))

    # 2 heads of width 8, 6 tokens: no size of the layer is 5 or 6, so a tensor that long is per-token state.
    ctx.case({"batch": 2, "d_model": 16, "n_heads": 2, "prompt": 3, "decode_steps": 3, "dtype": torch.float64,
              "seed": 11}, held)

    def two_sequences(api, c, ex):
        layer = _layer(api, ex, c.device)
        xa, xb = _tokens(ex, c.device), randn(ex["seed"] + 99, ex["batch"], 9, ex["d_model"], dtype=ex["dtype"],
                                              device=c.device)
        steps = [1] * ex["decode_steps"]
        return interleaved(layer, c, xa, xb, [ex["prompt"]] + steps, [ex["prompt"] % 3 + 2] + steps)

    ctx.forall(attention_run().filter(lambda e: e["decode_steps"] > 0), lambda c, ex: c.differential(
        ex, lambda api, e: two_sequences(api, c, e),
        "two sequences served by one layer, calls alternating, each passing its own cache back in"), max_examples=3)


def _device_scenario(s):
    api, kv = s.ctx.t, [s.put(randn(i, 1, 2, 2, 4)) for i in range(4)]  # four (B=1, H=2, T=2, D=4) tensors
    K, V = s.call("append_kv(None, k_new, v_new)", api.append_kv, None, kv[0], kv[1])
    s.call("append_kv((K, V), k_new, v_new)", api.append_kv, (K, V), kv[2], kv[3])
    cache = api.DynamicKVCache()
    s.call("DynamicKVCache.update(0, k_new, v_new)", cache.update, 0, kv[0], kv[1])
    s.call("DynamicKVCache.update(0, k_new, v_new) on a filled layer", cache.update, 0, kv[2], kv[3])
    s.call("DynamicKVCache.update(1, k_new, v_new)", cache.update, 1, kv[2], kv[3])
    layer, x = devices.module_on(s, lambda: api.CachedAttention(8, 2)), s.put(randn(5, 1, 4, 8, dtype=torch.float32))
    _, kv_cache = expect_pair(s.call("CachedAttention.forward(x), a prefill of 3 tokens", layer, x[:, :3]), "forward(x)")
    s.call("CachedAttention.forward(x, cache), a decode step", layer, x[:, 3:], kv_cache)


@CHECKS.add("every function keeps the inputs' device (no tensor made on the CPU by accident)", uses="append_kv")
def keeps_the_device(ctx):
    ctx.case({"batch": 1, "heads": 2, "head_dim": 4}, lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))


def _own_cache(api, ex, i):
    return api.DynamicKVCache()


def _update_in_turn(ctx):
    def step(api, ex, cache, i, n):
        layer = n % ex["layers"]
        k, v = _kv(ex, 100 * i + n, ex["chunks"][n // ex["layers"]], ctx.device)
        return {"update result": named(ctx.call(cache.update, layer, k, v)), "seq_len": cache.seq_len(layer),
                "len": len(cache)}
    return step


def _update_other(ctx, ex, cache, seed):
    k, v = _kv(ex, seed, 2, ctx.device)
    return named(ctx.call(cache.update, 0, k, v))


@CHECKS.add("two DynamicKVCache instances share no storage: each holds its own tokens", uses="DynamicKVCache")
def dynamic_caches_apart(ctx):
    def body(c, ex):
        steps = ex["layers"] * len(ex["chunks"])
        c.differential(ex, protocol.interleaved(_own_cache, _update_in_turn(c), steps),
                       "two caches A and B, updated in turn (layer 0, 1, ... of A, then of B)")
        held = {}

        def first(api, e):
            held["A"], held["B"] = api.DynamicKVCache(), api.DynamicKVCache()
            return _update_other(c, e, held["A"], 1)

        c.differential(ex, protocol.kept(first, lambda api, e: _update_other(c, e, held["B"], 2),
                                         "cache A's update(0) result", "cache B's update(0)"),
                       "cache A's returned (K, V), held while another cache is updated")

    ctx.case({"layers": 2, "batch": 1, "heads": 2, "head_dim": 4, "chunks": [3, 1, 1], "dtype": torch.float32,
              "seed": 4}, body)
