"""Hidden checks of kata 07 — a sink-preserving sliding window.

The cache and the layer are checked against oracles built here from the raw inputs: the
kept tokens (from the reference's ``kept_positions``) with keys rotated at slots 0 … n-1.
That way any correct storage passes — raw keys rotated on read, or rotated keys re-rotated
when the window shifts — within the dtype's tolerance.
"""
from __future__ import annotations

import re

import torch
from hypothesis import strategies as st

from grader.engine import report
from grader.checks.support import devices, envelope, protocol
from grader.checks.support.common import DTYPES, SEEDS, attention, chunks, expect_no_bias, load_linears, randn
from grader.engine import Checks
from grader.nn import apply_rope

CHECKS = Checks("07")
BASES = st.sampled_from([10000.0, 100.0])  # a small base turns the rotations fast: slot errors show


# -- kept_positions -----------------------------------------------------------------------------

@st.composite
def sizes(draw):
    n_sink, window = draw(st.integers(0, 4)), draw(st.integers(1, 6))
    # Around the boundary where the cache fills up, often; far past it, sometimes.
    seq_len = draw(st.one_of(st.integers(0, n_sink + window + 2), st.integers(0, 40)))
    return {"seq_len": seq_len, "n_sink": n_sink, "window": window, "seed": 0}


# (seq_len, n_sink, window) -> kept, worked out by hand.
PINNED = [
    ((10, 2, 4), [0, 1, 6, 7, 8, 9]),  # past capacity: two sinks, the last four
    ((6, 2, 4), [0, 1, 2, 3, 4, 5]),  # exactly full: nothing evicted yet
    ((7, 2, 4), [0, 1, 3, 4, 5, 6]),  # one past full: token 2 is the first to go
    ((3, 4, 2), [0, 1, 2]),  # shorter than the sinks
    ((0, 2, 3), []),  # nothing seen
    ((9, 0, 3), [6, 7, 8]),  # no sinks: a plain sliding window
    ((6, 4, 1), [0, 1, 2, 3, 5]),  # a window of one: only the newest beside the sinks
    ((12, 1, 5), [0, 7, 8, 9, 10, 11]),
]


def _kept(ctx, api, ex):
    got = ctx.call(api.kept_positions, ex["seq_len"], ex["n_sink"], ex["window"])
    return list(got) if isinstance(got, (tuple, range)) else got


def _expect_kept(c, ex, expected):
    got = _kept(c, c.t, ex)
    call = f"kept_positions({ex['seq_len']}, {ex['n_sink']}, {ex['window']})"
    if not isinstance(got, list):
        c.fail(f"{call} returned {report.describe(got)}, expected the list {expected}", ex, got)
    if report.compare(expected, got) is not None:
        c.fail(f"{call} returned {got}, expected {expected}", ex, got)


@CHECKS.add("kept_positions keeps the sinks and the last `window` tokens", uses="kept_positions")
def kept_positions_matches(ctx):
    ctx.forall(sizes(), lambda c, ex: _expect_kept(c, ex, _kept(c, c.ref, ex)), max_examples=25)


@CHECKS.add("kept_positions on hand-worked cases (short, exactly full, one past full)", uses="kept_positions")
def kept_positions_pinned(ctx):
    for (seq_len, n_sink, window), expected in PINNED:
        ex = {"seq_len": seq_len, "n_sink": n_sink, "window": window, "seed": 0}
        ctx.case(ex, lambda c, e, expected=expected: _expect_kept(c, e, expected))


@CHECKS.add("kept_positions rejects bad sizes with a ValueError naming the argument", uses="kept_positions")
def kept_positions_rejects_bad_input(ctx):
    def body(c, ex):
        cases = [("seq_len=-1", (-1, 2, 3), "seq_len"), ("n_sink=-1", (5, -1, 3), "n_sink"),
                 ("window=0", (5, 2, 0), "window"), ("window=-2", (5, 2, -2), "window"),
                 ("seq_len=2.5", (2.5, 2, 3), "seq_len"), ("n_sink=1.5", (5, 1.5, 3), "n_sink"),
                 ("window=2.5", (5, 2, 2.5), "window"), ("window='3'", (5, 2, "3"), "window"),
                 ("seq_len='5'", ("5", 2, 3), "seq_len")]
        for what, args, name in cases:
            exc = c.raises(ValueError, c.t.kept_positions, *args, what=f"kept_positions with {what}", example=ex)
            _named_in(c, exc, name, f"kept_positions with {what}", ex)

    ctx.case({"seed": 0}, body)


def _names(exc, *names):
    """Whether the message names one of ``names`` as a word (so "x" is not found inside "expected")."""
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", str(exc)) for n in names)


def _named_in(c, exc, name, what, ex):
    if not _names(exc, name):
        c.fail(f"{what} raised ValueError({str(exc)!r}); the message should name {name}", ex, ("unnamed", what))


# -- SinkKVCache -----------------------------------------------------------------------------------

@st.composite
def streams(draw):
    n_sink, window = draw(st.integers(0, 3)), draw(st.integers(1, 4))
    capacity = n_sink + window
    # A prefill in chunks that may fill the cache exactly ...
    prefill = draw(st.one_of(st.just(capacity), st.integers(1, capacity)))
    pieces = draw(st.lists(st.integers(1, capacity), min_size=1, max_size=3))
    return {
        "n_sink": n_sink, "window": window, "rope_base": draw(BASES),
        "batch": draw(st.integers(1, 2)), "heads": draw(st.integers(1, 2)),
        "head_dim": draw(st.sampled_from([2, 4, 6])),
        # ... then one token at a time up to capacity and 0 to 6 evictions past it.
        "chunks": chunks(prefill, pieces) + [1] * (capacity - prefill + draw(st.integers(0, 6))),
        "dtype": draw(DTYPES), "seed": draw(SEEDS),
    }


# Two sinks and a window of three: a prefill of 2 + 3 tokens fills the cache exactly, then three
# one-token steps each evict the oldest window token (2, then 3, then 4).
PINNED_STREAM = {"n_sink": 2, "window": 3, "rope_base": 100.0, "batch": 1, "heads": 2, "head_dim": 4,
                 "chunks": [2, 3, 1, 1, 1], "dtype": torch.float64, "seed": 11}


def _raw_kv(ex, total, device):
    shape = (ex["batch"], ex["heads"], total, ex["head_dim"])
    return (randn(ex["seed"], *shape, dtype=ex["dtype"], device=device),
            randn(ex["seed"] + 1, *shape, dtype=ex["dtype"], device=device))


def _snap(value):
    """What the learner returned, copied: a later update may rewrite a buffer in place."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_snap(v) for v in value)
    return value


def _slots(kept, T=None):
    n = len(kept)
    where = {0: "no tokens", 1: f"token {kept[:1]} at slot 0"}.get(n, f"tokens {kept} at slots 0 … {n - 1}")
    if T is None:
        return where
    return f"{where}; the new query at " + (f"slot {n - 1}" if T == 1 else f"slots {n - T} … {n - 1}")


@CHECKS.add("SinkKVCache.update returns the kept tokens, keys rotated at slots 0 … n-1", uses="SinkKVCache")
def cache_update_matches_oracle(ctx):
    def body(c, ex):
        K, V = _raw_kv(ex, sum(ex["chunks"]), c.device)
        cache = c.t.SinkKVCache(ex["n_sink"], ex["window"], ex["rope_base"])
        label, seen, kept = "before any update", 0, []
        got = {label: {"len(cache)": len(cache), "tokens_seen": cache.tokens_seen}}
        expected = {"len(cache)": 0, "tokens_seen": 0}
        for step, T in enumerate(ex["chunks"] + [0], start=1):
            problem = report.compare(expected, got[label], label)
            if problem:
                c.fail("a new SinkKVCache, then update(k_new, v_new) with unrotated keys, chunk after chunk; "
                       f"expected, after {seen} tokens, {_slots(kept)}\n  {problem}", ex, got)
            if T == 0:
                break
            out = _snap(c.call(cache.update, K[:, :, seen:seen + T], V[:, :, seen:seen + T]))
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                c.fail(f"update returned {report.describe(out)}, expected a pair (keys, values)", ex,
                       ("returned", report.describe(out)))
            seen += T
            kept = c.ref.kept_positions(seen, ex["n_sink"], ex["window"])
            slots = torch.arange(len(kept), device=c.device)
            label = f"step {step} (+{T} token{'s' if T > 1 else ''}, {seen} seen)"
            expected = {"keys": apply_rope(K[:, :, kept], slots, ex["rope_base"]), "values": V[:, :, kept],
                        "len(cache)": len(kept), "tokens_seen": seen}
            got[label] = {"keys": out[0], "values": out[1], "len(cache)": len(cache), "tokens_seen": cache.tokens_seen}

    ctx.case(PINNED_STREAM, body)
    ctx.forall(streams(), body, max_examples=20)
    envelope.run(ctx, WIDE_STREAM, ("large", "half", "strided"), lambda c, ex: c.differential(
        ex, lambda api, e: _stream(api, c, e), "a new SinkKVCache with the default rope_base, then update chunk "
        "after chunk: every step's (keys, values), len(cache) and tokens_seen"), large=LARGE_STREAM)
    # The README's warning, checked: keys stored rotated in the half type and re-rotated at every eviction
    # drift by a rounding each time; a window turned over once leaves its oldest key re-rotated 127 times.
    for dtype in envelope.HALF:
        ctx.case({**LONG_HALF_STREAM, "dtype": dtype}, lambda c, ex: c.differential(
            ex, lambda api, e: _stream(api, c, e), "a new SinkKVCache, a prefill that fills it, then one token "
            "at a time until the window has turned over once: every step's (keys, values), len(cache) and "
            "tokens_seen"))


# The envelope's base: two sinks, a window of three, the default rope_base, a prefill in two chunks and three
# evicting steps; its large case holds 4 + 300 tokens of 16 heads and evicts twice.
WIDE_STREAM = {"n_sink": 2, "window": 3, "rope_base": None, "batch": 2, "heads": 2, "head_dim": 4,
               "chunks": [3, 2, 1, 1, 1], "dtype": torch.float32, "seed": 21}
LARGE_STREAM = {"n_sink": 4, "window": 300, "batch": 1, "heads": 16, "chunks": [300, 4, 1, 1]}
# One sink and a window of 128, filled by one prefill, then 128 evicting steps of one token (in each half type).
LONG_HALF_STREAM = {**WIDE_STREAM, "n_sink": 1, "window": 128, "batch": 1, "heads": 2, "head_dim": 8,
                    "chunks": [129], "then_one_at_a_time": 128}


def _base(ex) -> dict:
    """The rope_base keyword of the example (None: left out, so the default 10000.0 applies)."""
    return {} if ex["rope_base"] is None else {"rope_base": ex["rope_base"]}


def _stream(api, c, ex):
    """Every update of the example's chunks (then ``then_one_at_a_time`` single tokens) through a new cache:
    its (keys, values), copied, and the counts."""
    chunks = ex["chunks"] + [1] * ex.get("then_one_at_a_time", 0)
    shape = (ex["batch"], ex["heads"], sum(chunks), ex["head_dim"])
    K, V = (envelope.tensor(ex, ex["seed"] + j, *shape, device=c.device) for j in (0, 1))
    cache, got, seen = api.SinkKVCache(ex["n_sink"], ex["window"], **_base(ex)), {}, 0
    for step, T in enumerate(chunks, start=1):
        out = _snap(c.call(cache.update, K[:, :, seen:seen + T], V[:, :, seen:seen + T]))
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            c.fail(f"update returned {report.describe(out)}, expected a pair (keys, values)", ex,
                   ("returned", report.describe(out)))
        seen += T
        got[f"step {step} (+{T}, {seen} seen)"] = {"keys": out[0], "values": out[1], "len(cache)": len(cache),
                                                   "tokens_seen": cache.tokens_seen}
    return got


@CHECKS.add("SinkKVCache.update refuses a multi-token update that would evict", uses="SinkKVCache")
def cache_refuses_evicting_chunk(ctx):
    def body(c, ex):
        capacity = ex["n_sink"] + ex["window"]
        K, V = _raw_kv(ex, 2 * capacity + 2, c.device)
        cache = c.t.SinkKVCache(ex["n_sink"], ex["window"], ex["rope_base"])
        held = ex["held"]
        if held:
            c.call(cache.update, K[:, :, :held], V[:, :, :held])
        T = max(2, capacity - held + 1)  # at least one token too many, and more than one token
        what = f"update with {T} new tokens when the cache holds {held} of {capacity}"
        exc = c.raises(ValueError, cache.update, K[:, :, held:held + T], V[:, :, held:held + T], what=what, example=ex)
        if not _names(exc, "k_new", "v_new"):
            c.fail(f"{what} raised ValueError({str(exc)!r}); the message should name k_new", ex, ("unnamed", what))
        state = (len(cache), cache.tokens_seen)
        if state != (held, held):
            c.fail(f"after the refused {what}, len(cache) and tokens_seen are {state}, expected {(held, held)}: "
                   "check before you change anything", ex, ("changed", state))

    for n_sink, window, held in ((2, 3, 0), (2, 3, 3), (0, 4, 2), (3, 1, 3), (1, 2, 3)):
        ctx.case({"n_sink": n_sink, "window": window, "held": held, "rope_base": 10000.0, "batch": 1, "heads": 2,
                  "head_dim": 4, "dtype": torch.float64, "seed": 7 + held}, body)


@CHECKS.add("SinkKVCache rejects bad input with a ValueError naming the argument", uses="SinkKVCache")
def cache_rejects_bad_input(ctx):
    def body(c, ex):
        for what, args, name in (("n_sink=-1", (-1, 3), "n_sink"), ("window=0", (2, 0), "window")):
            exc = c.raises(ValueError, c.t.SinkKVCache, *args, what=f"SinkKVCache with {what}", example=ex)
            _named_in(c, exc, name, f"SinkKVCache with {what}", ex)
        K, V = _raw_kv(ex, 2, c.device)
        cache = c.t.SinkKVCache(ex["n_sink"], ex["window"])
        for what, args, name in (("k_new without a head axis", (K[:, 0], V), "k_new"),
                                 ("k_new and v_new with an extra axis", (K[..., None], V[..., None]), "k_new"),
                                 ("v_new shaped unlike k_new", (K, V[:, :, :1]), "v_new"),
                                 ("v_new with more tokens than k_new", (K[:, :, :1], V), "v_new")):
            exc = c.raises(ValueError, cache.update, *args, what=f"update with {what}", example=ex)
            _named_in(c, exc, name, f"update with {what}", ex)
        for what, args, name in (("n_sink=1.5", (1.5, 3), "n_sink"), ("window=2.5", (1, 2.5), "window")):
            exc = c.raises(ValueError, c.t.SinkKVCache, *args, what=f"SinkKVCache with {what}", example=ex)
            _named_in(c, exc, name, f"SinkKVCache with {what}", ex)
        c.call(cache.update, K[:, :, :1], V[:, :, :1])  # one token held: the next ones must be shaped alike
        k, v = K[:, :, 1:], V[:, :, 1:]
        for what, args in (("k_new = None", (None, v)), ("v_new = None", (k, None)),
                           ("twice the batch of the token held", (torch.cat([k, k], 0), torch.cat([v, v], 0))),
                           ("twice the heads of the token held", (torch.cat([k, k], 1), torch.cat([v, v], 1))),
                           ("twice the head_dim of the token held", (torch.cat([k, k], 3), torch.cat([v, v], 3))),
                           ("one head fewer than the token held", (k[:, :1], v[:, :1])),
                           ("half the head_dim of the token held", (k[..., :2], v[..., :2]))):
            exc = c.raises(ValueError, cache.update, *args, what=f"update with {what}", example=ex)
            if not _names(exc, "k_new", "v_new"):
                c.fail(f"update with {what} raised ValueError({str(exc)!r}); the message should name k_new or "
                       "v_new", ex, ("unnamed", what))
        state = (len(cache), cache.tokens_seen)
        if state != (1, 1):
            c.fail(f"after one token and the refused updates, len(cache) and tokens_seen are {state}, expected "
                   "(1, 1): a refused update changes nothing", ex, ("changed", state))
        for base in (0.0, -10.0):  # refused when the cache is built, or at the latest by apply_rope on its update
            what = f"SinkKVCache(1, 3, rope_base={base}), then update"
            try:
                exc = c.raises(ValueError, c.t.SinkKVCache(1, 3, base).update, k, v, what=what, example=ex)
            except ValueError as error:
                exc = error
            if not _names(exc, "rope_base", "base"):
                c.fail(f"{what} raised ValueError({str(exc)!r}); the message should name rope_base", ex,
                       ("unnamed", what))

    ctx.case({"n_sink": 1, "window": 3, "batch": 1, "heads": 2, "head_dim": 4, "dtype": torch.float32, "seed": 3}, body)


# -- SinkAttention ---------------------------------------------------------------------------------

@st.composite
def attention_runs(draw):
    ex = draw(streams())
    heads = ex.pop("heads")
    ex.update(n_heads=heads, d_model=heads * ex.pop("head_dim"))
    return ex


def _layer(api, ex, device):
    d = ex["d_model"]
    layer = api.SinkAttention(d, ex["n_heads"], ex["n_sink"], ex["window"], **_base(ex))
    layer = layer.to(device=device, dtype=ex["dtype"])
    load_linears(layer, {name: (d, d) for name in ("wq", "wk", "wv", "wo")}, ex["seed"], "SinkAttention")
    return layer


def _oracle(ex, x, weights, kept, seen, T):
    """From scratch: the kept tokens projected again, keys at their slots, the new queries at theirs."""
    B, H, D = ex["batch"], ex["n_heads"], ex["d_model"] // ex["n_heads"]
    wq, wk, wv, wo = (w.double() for w in weights)
    n, xs = len(kept), x.double()

    def heads(h):  # (B, L, d_model) -> (B, H, L, D)
        return h.view(B, -1, H, D).transpose(1, 2)

    keys = apply_rope(heads(xs[:, kept] @ wk.T), torch.arange(n), ex["rope_base"])
    values = heads(xs[:, kept] @ wv.T)
    slots = torch.arange(n - T, n)
    q = apply_rope(heads(xs[:, seen - T:seen] @ wq.T), slots, ex["rope_base"])
    causal = torch.arange(n)[None, :] <= slots[:, None]  # (T, n): the query at slot s sees slots <= s
    out = attention(q, keys, values, causal).transpose(1, 2).reshape(B, T, H * D)
    return (out @ wo.T).to(x.dtype)


@CHECKS.add("SinkAttention matches attention from scratch over the kept tokens at every step",
            uses="SinkAttention.forward")
def attention_matches_oracle(ctx):
    def body(c, ex):
        layer = _layer(c.t, ex, c.device)
        weights = [getattr(layer, n).weight.detach().cpu().clone() for n in ("wq", "wk", "wv", "wo")]
        x = randn(ex["seed"] + 5, ex["batch"], sum(ex["chunks"]), ex["d_model"], dtype=ex["dtype"], device=c.device)
        cache = c.t.SinkKVCache(ex["n_sink"], ex["window"], ex["rope_base"])
        got, seen = {}, 0
        for step, T in enumerate(ex["chunks"], start=1):
            out = _snap(c.call(layer, x[:, seen:seen + T], cache))
            seen += T
            label = f"step {step} output (+{T} token{'s' if T > 1 else ''}, {seen} seen)"
            kept = c.ref.kept_positions(seen, ex["n_sink"], ex["window"])
            got[label] = out
            problem = report.compare(_oracle(ex, x.cpu(), weights, kept, seen, T).to(c.device), out, label)
            if problem:
                c.fail("a new SinkKVCache, then layer(x_chunk, cache) step after step; expected attention over "
                       f"{_slots(kept, T)}\n  {problem}", ex, got)

    pinned = {**PINNED_STREAM, "n_heads": 2, "d_model": 8}
    del pinned["heads"], pinned["head_dim"]
    ctx.case(pinned, body)
    ctx.forall(attention_runs(), body, max_examples=15)
    base = {**WIDE_STREAM, "n_heads": 2, "d_model": 8}
    del base["heads"], base["head_dim"]
    large = {**LARGE_STREAM, "n_heads": 16, "d_model": 64}
    del large["heads"]
    envelope.run(ctx, base, ("large", "half", "strided", "magnitude"), lambda c, ex: c.differential(
        ex, lambda api, e: _attention_stream(api, c, e), "a new SinkKVCache and a SinkAttention with the default "
        "rope_base, then layer(x_chunk, cache) chunk after chunk: every step's output"), large=large)


def _attention_stream(api, c, ex):
    """Every step's output of the layer over the example's chunks, through a new cache."""
    layer = _layer(api, ex, c.device)
    x = envelope.tensor(ex, ex["seed"] + 5, ex["batch"], sum(ex["chunks"]), ex["d_model"], device=c.device)
    cache, got, seen = api.SinkKVCache(ex["n_sink"], ex["window"], **_base(ex)), {}, 0
    for step, T in enumerate(ex["chunks"], start=1):
        got[f"step {step} output (+{T}, {seen + T} seen)"] = _snap(c.call(layer, x[:, seen:seen + T], cache))
        seen += T
    return got


@CHECKS.add("SinkAttention rejects bad input with a ValueError naming the argument", uses="SinkAttention.forward")
def attention_rejects_bad_input(ctx):
    def body(c, ex):
        layer = _layer(c.t, ex, c.device)
        x = randn(ex["seed"], 1, 2, ex["d_model"], dtype=ex["dtype"], device=c.device)
        expect_no_bias(c, layer, ex)
        for what, arg in (("x missing the batch axis", x[0]), ("x wider than d_model", torch.cat([x, x], -1)),
                          ("x narrower than d_model", x[..., :ex["d_model"] // 2]), ("x carrying an extra axis", x[None])):
            cache = c.t.SinkKVCache(ex["n_sink"], ex["window"])
            exc = c.raises(ValueError, layer, arg, cache, what=f"forward with {what}", example=ex)
            _named_in(c, exc, "x", f"forward with {what}", ex)
        what = "forward(x, cache) with a (K, V) pair as the cache, as katas 01 to 03 pass it"
        exc = c.raises(ValueError, layer, x, (x, x), what=what, example=ex)
        _named_in(c, exc, "cache", what, ex)
        for what, args, names in (("n_heads=3 for d_model=8", (8, 3, 1, 2), ("n_heads", "d_model")),
                                  ("d_model=0", (0, 2, 1, 2), ("d_model", "n_heads")),
                                  ("n_heads=0", (8, 0, 1, 2), ("n_heads",)),
                                  ("n_heads=2 for d_model=6 (an odd head width of 3)", (6, 2, 1, 2),
                                   ("n_heads", "d_model", "head_dim")),
                                  ("n_sink=-1", (8, 2, -1, 2), ("n_sink",)), ("window=0", (8, 2, 1, 0), ("window",))):
            exc = c.raises(ValueError, c.t.SinkAttention, *args, what=f"SinkAttention with {what}", example=ex)
            if not _names(exc, *names):
                c.fail(f"SinkAttention with {what} raised ValueError({str(exc)!r}); the message should name "
                       f"{' or '.join(names)}", ex, ("unnamed", what))
        what = "SinkAttention(8, 2, 1, 2, rope_base=0.0), then forward"
        try:
            bad = c.t.SinkAttention(8, 2, 1, 2, 0.0).to(device=c.device, dtype=ex["dtype"])
            exc = c.raises(ValueError, bad, x, c.t.SinkKVCache(1, 2), what=what, example=ex)
        except ValueError as error:
            exc = error
        if not _names(exc, "rope_base", "base"):
            c.fail(f"{what} raised ValueError({str(exc)!r}); the message should name rope_base", ex, ("unnamed", what))

    ctx.case({"n_sink": 1, "window": 2, "rope_base": 10000.0, "batch": 1, "n_heads": 2, "d_model": 8,
              "dtype": torch.float32, "seed": 4}, body)


@CHECKS.add("kept_positions returns a list of Python ints", uses="kept_positions")
def kept_positions_returns_ints(ctx):
    def body(c, ex):
        got = c.call(c.t.kept_positions, ex["seq_len"], ex["n_sink"], ex["window"])
        kinds = sorted({type(i).__name__ for i in got}) if isinstance(got, (list, tuple, range)) else []
        if not isinstance(got, list) or kinds not in ([], ["int"]):
            c.fail(f"kept_positions({ex['seq_len']}, {ex['n_sink']}, {ex['window']}) returned {report.describe(got)}"
                   f"{' of ' + ', '.join(kinds) if kinds else ''}; expected a list of int (not a range, a tuple or "
                   "a tensor)", ex, ("type", report.describe(got), tuple(kinds)))

    for seq_len, n_sink, window in ((10, 2, 4), (3, 4, 2), (9, 0, 3), (0, 1, 1)):
        ctx.case({"seq_len": seq_len, "n_sink": n_sink, "window": window, "seed": 0}, body)


# Two streams through one layer, in turn: a prefill that fills the cache, then one token at a time,
# against a second stream that starts with one token. Each output must be its own stream's.
TWO_STREAMS = {"n_sink": 1, "window": 3, "rope_base": 100.0, "batch": 1, "n_heads": 2, "d_model": 8,
               "turns": [(0, 4), (1, 1), (0, 1), (1, 2), (0, 1), (1, 1), (1, 1), (0, 1)], "dtype": torch.float64,
               "seed": 13}


@CHECKS.add("one SinkAttention serves two caches in turn: what a stream needs lives in its cache, not the layer",
            uses="SinkAttention.forward")
def layer_keeps_no_state(ctx):
    def body(c, ex):
        layer = _layer(c.t, ex, c.device)
        weights = [getattr(layer, n).weight.detach().cpu().clone() for n in ("wq", "wk", "wv", "wo")]
        totals = [sum(T for s, T in ex["turns"] if s == stream) for stream in (0, 1)]
        xs = [randn(ex["seed"] + 5 + s, ex["batch"], totals[s], ex["d_model"], dtype=ex["dtype"], device=c.device)
              for s in (0, 1)]
        caches = [c.t.SinkKVCache(ex["n_sink"], ex["window"], ex["rope_base"]) for _ in (0, 1)]
        got, seen = {}, [0, 0]
        for step, (s, T) in enumerate(ex["turns"], start=1):
            got[f"step {step}, stream {s}"] = _snap(c.call(layer, xs[s][:, seen[s]:seen[s] + T], caches[s]))
            seen[s] += T
            kept = c.ref.kept_positions(seen[s], ex["n_sink"], ex["window"])
            want = _oracle(ex, xs[s].cpu(), weights, kept, seen[s], T).to(c.device)
            problem = report.compare(want, got[f"step {step}, stream {s}"], f"step {step} output")
            if problem:
                c.fail(f"one layer, two caches (streams 0 and 1), used in turn {ex['turns']} as (stream, new tokens); "
                       f"at step {step} stream {s} has seen {seen[s]} tokens, so the new query sits at "
                       f"{_slots(kept, T)} of ITS cache. Read positions from the cache, never from a count kept in "
                       f"the layer\n  {problem}", ex, got)

    ctx.case(TWO_STREAMS, body)
    ctx.case({**TWO_STREAMS, "n_sink": 0, "window": 2, "turns": [(1, 2), (0, 1), (1, 1), (0, 1), (1, 1), (0, 1)],
              "seed": 14}, body)


@CHECKS.add("kept_positions returns the caller's list: changing it changes no later answer", uses="kept_positions")
def kept_positions_list_is_the_callers(ctx):
    def body(c, ex):
        call = f"kept_positions({ex['seq_len']}, {ex['n_sink']}, {ex['window']})"
        same = lambda api, e: _kept(c, api, e)  # noqa: E731
        c.differential(ex, protocol.twice(same, call), f"{call} twice")
        c.differential(ex, protocol.changed_by_caller(same, same, f"{call} again"),
                       f"{call}, the list overwritten by the caller, then {call} again (a memoized list?)")

    ctx.case({"seq_len": 10, "n_sink": 2, "window": 4, "seed": 0}, body)


def _cache_turn(c):
    def turn(api, ex, cache, i, n):
        k, v = (envelope.tensor(ex, ex["seed"] + 10 * n + 2 * i + j, ex["batch"], ex["heads"], ex["chunks"][n],
                                ex["head_dim"], device=c.device) for j in (0, 1))
        return {"(keys, values)": c.call(cache.update, k, v), "len(cache)": len(cache), "tokens_seen": cache.tokens_seen}
    return turn


@CHECKS.add("two SinkKVCache instances share no storage: each keeps its own tokens", uses="SinkKVCache")
def caches_share_no_storage(ctx):
    def body(c, ex):
        make = lambda api, e, i: api.SinkKVCache(e["n_sink"], e["window"], e["rope_base"])  # noqa: E731
        c.differential(ex, protocol.interleaved(make, _cache_turn(c), len(ex["chunks"])),
                       "caches A and B, updated in turn: a prefill, then one token at a time past capacity")
        held, turn = {}, _cache_turn(c)

        def first(api, e):
            held["A"], held["B"] = make(api, e, 0), make(api, e, 1)
            return turn(api, e, held["A"], 0, 0)
        c.differential(ex, protocol.kept(first, lambda api, e: turn(api, e, held["B"], 1, 0),
                                         "cache A's returned (keys, values)", "cache B's update"),
                       "cache A's returned (keys, values), held while another cache is updated")

    ctx.case({**PINNED_STREAM, "dtype": torch.float32}, body)


def _device_scenario(s):
    api, kv = s.ctx.t, [s.put(randn(i, 1, 2, 5, 4)) for i in range(2)]  # (B=1, H=2, T=5, D=4)
    cache = api.SinkKVCache(1, 2)
    s.call("SinkKVCache(1, 2).update(k_new, v_new) with 2 tokens", cache.update, kv[0][:, :, :2], kv[1][:, :, :2])
    for t in range(2, 5):  # the cache holds 3: from the 4th token on, one is evicted per update
        s.call(f"SinkKVCache(1, 2).update(k_new, v_new), token {t + 1}", cache.update,
               kv[0][:, :, t:t + 1], kv[1][:, :, t:t + 1])
    layer = devices.module_on(s, lambda: api.SinkAttention(8, 2, 1, 2))
    x, cache = s.put(randn(2, 1, 5, 8, dtype=torch.float32)), api.SinkKVCache(1, 2)  # (B=1, T=5, d_model=8)
    s.call("SinkAttention.forward(x, cache), a prefill of 2 tokens", layer, x[:, :2], cache)
    for t in range(2, 5):
        s.call(f"SinkAttention.forward(x, cache), token {t + 1}", layer, x[:, t:t + 1], cache)


@CHECKS.add("every function keeps the inputs' device (no tensor made on the CPU by accident)",
            uses="SinkKVCache.update")
def keeps_the_device(ctx):
    ctx.case({"n_sink": 1, "window": 2, "d_model": 8, "n_heads": 2},
             lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))
