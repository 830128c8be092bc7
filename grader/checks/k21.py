"""Hidden checks of kata 21 — eviction by attention score.

Tasks 1 and 2 (which tokens H2O and SnapKV keep, SnapKV's scores): grader.checks.k21_select. Task 3, the
cache, here: drawn operation sequences against the reference (grader.checks.k21_cache), an oracle built
from the raw keys at the positions the cache reports, an H2O decode that attends through the cache, bad
input, state and aliasing, and the device.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks import k21_cache as prog
from grader.checks.k21_select import CHECKS
from grader.checks.support import devices, envelope, protocol
from grader.checks.support.common import SEEDS, expect_value_error, randn, value_error_names
from grader.engine import report

__all__ = ["CHECKS"]

# Budget 3, recent 1, one KV head serving two query heads: a prompt of 5 evicts 2 at its observe; two decode
# steps evict one each; then the same cache is reset and read a second prompt.
PINNED = {"budget": 3, "recent": 1, "rope_base": 100.0, "batch": 1, "kv_heads": 1, "group": 2, "head_dim": 4,
          "ops": [("update", 5), ("observe",), ("update", 1), ("observe",), ("update", 1), ("observe",), ("reset",),
                  ("update", 2), ("observe",)], "dtype": torch.float64, "seed": 3}
# SnapKV's path: a prompt compressed once to 3 of 6, then decoding without votes.
PINNED_SNAP = {**PINNED, "kv_heads": 2, "group": 1, "budget": 4, "recent": 0,
               "ops": [("update", 6), ("compress", 3), ("update", 1), ("update", 2)], "seed": 4}
WIDE = {**PINNED, "batch": 2, "kv_heads": 2, "rope_base": None, "dtype": torch.float32, "seed": 21}
LARGE = {"budget": 64, "recent": 16, "kv_heads": 4, "group": 4, "head_dim": 16, "batch": 1,
         "ops": [("update", 300), ("observe",), ("update", 1), ("observe",), ("update", 1), ("observe",)]}


def _differential(c, ex):
    c.differential(ex, lambda api, e: prog.run_program(c, api, e), "a new ScoredKVCache, then the example's "
                   "operations: what each update returned, then len(cache), tokens_seen, positions() and scores()")


@CHECKS.add("ScoredKVCache: every step's kept tokens, positions and scores match the reference", uses="ScoredKVCache")
def cache_matches_reference(ctx):
    ctx.case(PINNED, _differential)
    ctx.case(PINNED_SNAP, _differential)
    ctx.forall(prog.programs(), _differential, max_examples=25)
    envelope.run(ctx, WIDE, ("large", "half", "strided"), _differential, large=LARGE)


def _oracle_visit(c, ex, since):
    """After each step: the held keys are the raw keys rotated at the positions the cache reports, values as
    written, positions increasing and below tokens_seen, tokens_seen the tokens added since the last reset."""
    def visit(step, op, returned, cache, raw, offset):
        since[0] = 0 if op[0] == "reset" else since[0] + (op[1] if op[0] == "update" else 0)
        what = f"step {step}, {prog.label(op)}"
        if cache.tokens_seen != since[0]:
            c.fail(f"{what}: tokens_seen is {cache.tokens_seen!r}, expected {since[0]}, the tokens added "
                   f"{'since reset()' if offset else 'so far'}", ex, ("tokens_seen", step, cache.tokens_seen))
        if not returned:
            return
        pos = c.call(cache.positions)
        n = returned["keys"].shape[2] if isinstance(returned["keys"], torch.Tensor) else -1
        if not isinstance(pos, torch.Tensor) or pos.dtype != torch.long or pos.dim() != 3 or pos.shape[2] != n:
            c.fail(f"{what}: positions() returned {report.describe(pos)}, expected a long tensor (batch, kv_heads, "
                   f"{n}) for the {n} keys update returned", ex, ("positions", report.describe(pos)))
        if (pos[..., 1:] <= pos[..., :-1]).any() or pos.min() < 0 or pos.max() >= since[0]:
            c.fail(f"{what}: positions() {pos.tolist()} should increase along each row and lie in 0 … "
                   f"{since[0] - 1}", ex, ("positions", pos.tolist()))
        idx = (pos + offset).cpu()
        want = {"keys": prog.true_keys(raw[0].cpu(), pos, offset, ex["rope_base"] or 10000.0).to(ex["dtype"]),
                "values": raw[1].cpu().gather(2, idx[..., None].expand(-1, -1, -1, ex["head_dim"]))}
        problem = report.compare(want, {k: v.cpu() for k, v in returned.items()}, what)
        if problem:
            c.fail(f"{what}: each held key should be its raw key rotated at its true position (the one positions() "
                   f"reports: {pos.tolist()}), never at its slot, and the next token at tokens_seen, never at "
                   f"len(cache)\n  {problem}", ex, ("oracle", step))
    return visit


@CHECKS.add("ScoredKVCache: kept keys keep the rotation of their true positions; the next position is tokens seen",
            uses="ScoredKVCache")
def cache_keys_at_true_positions(ctx):
    def body(c, ex):
        prog.run_program(c, c.t, ex, visit=_oracle_visit(c, ex, [0]))

    ctx.case(PINNED, body)
    ctx.case(PINNED_SNAP, body)
    ctx.forall(prog.programs(), body, max_examples=20)


@st.composite
def decodes(draw):
    budget = draw(st.integers(1, 6))
    return {"budget": budget, "recent": draw(st.integers(0, budget)), "rope_base": draw(prog.BASES),
            "batch": draw(st.integers(1, 2)), "kv_heads": draw(st.integers(1, 2)), "group": draw(st.integers(1, 3)),
            "head_dim": draw(st.sampled_from([2, 4, 8])), "prompt": draw(st.integers(1, budget + 4)),
            "decode": draw(st.integers(1, 8)), "dtype": torch.float64, "seed": draw(SEEDS)}


@CHECKS.add("H2O decoding through ScoredKVCache: every step's attention output matches the reference's",
            uses="ScoredKVCache.observe")
def decode_through_cache(ctx):
    def body(c, ex):
        c.differential(ex, lambda api, e: prog.decode(c, api, e), "a new ScoredKVCache; a prompt, then one token at "
                       "a time: update, attention over the returned keys with the query at its true position, "
                       "observe(those weights)")

    ctx.case({"budget": 4, "recent": 2, "rope_base": 100.0, "batch": 1, "kv_heads": 2, "group": 2, "head_dim": 4,
              "prompt": 6, "decode": 6, "dtype": torch.float64, "seed": 8}, body)
    ctx.forall(decodes(), body, max_examples=15)


def _held(c, cache) -> dict:
    return protocol.snapshot(prog.state(c, cache))


def _bad_cache_calls(c, cache, k, v):
    """(what, call, args, names) for each refused call on a cache holding 3 tokens of (1, 2, *, 4)."""
    n, probs = len(cache), torch.full((1, 4, 1, len(cache)), 0.25, dtype=torch.float64, device=c.device)
    good = torch.tensor([[[0, 2], [1, 2]]], device=c.device)
    return [
        ("update with k_new missing the head axis", cache.update, (k[:, 0], v[:, 0]), ("k_new",)),
        ("update with k_new = None", cache.update, (None, v), ("k_new",)),
        ("update with integer k_new and v_new", cache.update, (k.long(), v.long()), ("k_new",)),
        ("update with no new token (T = 0)", cache.update, (k[:, :, :0], v[:, :, :0]), ("k_new",)),
        ("update with v_new shaped unlike k_new", cache.update, (k, v[:, :, :, :2]), ("v_new",)),
        ("update with v_new holding one token more than k_new", cache.update, (k, torch.cat([v, v[:, :, :1]], 2)),
         ("v_new",)),
        ("update with v_new = None", cache.update, (k, None), ("v_new",)),
        ("update with twice the batch of the tokens held", cache.update, (torch.cat([k, k]), torch.cat([v, v])),
         ("k_new",)),
        ("update with one head fewer than the tokens held", cache.update, (k[:, :1], v[:, :1]), ("k_new",)),
        ("update with another head_dim than the tokens held", cache.update, (k[..., :2], v[..., :2]), ("k_new",)),
        (f"observe with probs over {n + 1} tokens when {n} are held", cache.observe,
         (torch.cat([probs, probs[..., :1]], -1),), ("probs",)),
        ("observe with probs of 3 query heads over 2 KV heads", cache.observe, (probs[:, :3],), ("probs",)),
        ("observe with probs of another batch", cache.observe, (torch.cat([probs, probs]),), ("probs",)),
        ("observe with probs missing the query axis", cache.observe, (probs[:, :, 0],), ("probs",)),
        ("observe with probs of no query (T = 0)", cache.observe, (probs[:, :, :0],), ("probs",)),
        ("observe with probs = None", cache.observe, (None,), ("probs",)),
        ("compress with float indices", cache.compress, (good.double(),), ("keep",)),
        ("compress with keep of shape (1, 2)", cache.compress, (good[:, :, 0],), ("keep",)),
        ("compress with keep for one head of two", cache.compress, (good[:, :1],), ("keep",)),
        ("compress with keep for three heads of two", cache.compress, (torch.cat([good, good[:, :1]], 1),), ("keep",)),
        ("compress with keep carrying an extra axis", cache.compress, (good[..., None],), ("keep",)),
        (f"compress with index {n} when {n} are held", cache.compress, (good + 1,), ("keep",)),
        ("compress with index -1", cache.compress, (good - 1,), ("keep",)),
        ("compress with an index twice in a row", cache.compress, (good * 0 + 1,), ("keep",)),
        ("compress with no index (an empty cache)", cache.compress, (good[:, :, :0],), ("keep",)),
        ("compress with a list", cache.compress, (good.tolist(),), ("keep",)),
    ]


@CHECKS.add("ScoredKVCache rejects bad input with a ValueError naming the argument, and changes nothing",
            uses="ScoredKVCache")
def cache_rejects_bad_input(ctx):
    def body(c, ex):
        for what, args, names in (("budget=0", (0, 0), ("budget",)), ("budget=2.5", (2.5, 1), ("budget",)),
                                  ("recent=-1", (3, -1), ("recent",)), ("recent=1.5", (3, 1.5), ("recent",)),
                                  ("recent=4 above budget=3", (3, 4), ("recent", "budget"))):
            expect_value_error(c, c.t.ScoredKVCache, *args, what=f"ScoredKVCache with {what}", names=names, example=ex)
        for base in (0.0, -10.0):  # refused when the cache is built, or at the latest by apply_rope on its update
            what = f"ScoredKVCache(3, 1, rope_base={base}), then update"
            kv = randn(ex["seed"], 1, 2, 2, 4, device=c.device)
            try:
                exc = c.raises(ValueError, c.t.ScoredKVCache(3, 1, base).update, kv, kv, what=what, example=ex)
            except ValueError as error:
                exc = error
            if not value_error_names(exc, ("rope_base", "base")):
                c.fail(f"{what} raised ValueError({str(exc)!r}); the message should name rope_base", ex,
                       ("unnamed", what))
        empty = c.t.ScoredKVCache(3, 1)
        for name in ("positions", "scores"):
            c.raises(ValueError, getattr(empty, name), what=f"{name}() of an empty cache", example=ex)
        k, v = (randn(ex["seed"] + j, 1, 2, 3, 4, device=c.device) for j in (0, 1))
        for what, fn, args, name in (("update with no new token (T = 0) on an empty cache", empty.update,
                                      (k[:, :, :0], v[:, :, :0]), "k_new"),
                                     ("observe on an empty cache", empty.observe, (k[:, :, None, :, 0],), "probs"),
                                     ("observe on an empty cache, probs over its 0 tokens", empty.observe,
                                      (k[:, :, None, :0, 0],), "probs"),
                                     ("compress on an empty cache", empty.compress,
                                      (torch.zeros(1, 2, 1, dtype=torch.long, device=c.device),), "keep")):
            expect_value_error(c, fn, *args, what=what, names=(name,), example=ex)
        cache = c.t.ScoredKVCache(3, 1)
        c.call(cache.update, k, v)
        before = _held(c, cache)
        for what, fn, args, names in _bad_cache_calls(c, cache, k, v):
            expect_value_error(c, fn, *args, what=what, names=names, example=ex)
            problem = report.compare(before, _held(c, cache), f"after the refused {what}")
            if problem:
                c.fail(f"a refused call changes nothing: check before you change the cache\n  {problem}", ex,
                       ("changed", what))

    ctx.case({"seed": 5, "dtype": torch.float64}, body)


def _turn(c):
    def step(api, ex, cache, i, n):
        k, v = (randn(ex["seed"] + 10 * n + 2 * i + j, 1, 2, 2 if n == 0 else 1, 4, device=c.device) for j in (0, 1))
        out = prog.snap(c.call(cache.update, k, v))
        T, held = k.shape[2], len(cache)
        c.call(cache.observe, prog.dyadic({**ex, "seed": ex["seed"] + i}, n, (1, 2, T, held), c.device))
        return {"(keys, values)": out, **prog.state(c, cache)}
    return step


def _inputs_scribbled(c, api, ex):
    cache = api.ScoredKVCache(3, 1)
    k, v = (randn(ex["seed"] + j, 1, 2, 2, 4, device=c.device) for j in (0, 1))
    c.call(cache.update, k, v)
    protocol.scribble((k, v))
    k, v = (randn(ex["seed"] + j, 1, 2, 1, 4, device=c.device) for j in (2, 3))
    return prog.snap(c.call(cache.update, k, v))


@CHECKS.add("positions() and scores() are the caller's copies; two caches share no storage", uses="ScoredKVCache")
def cache_results_are_the_callers(ctx):
    def body(c, ex):
        make = lambda api, e, i: api.ScoredKVCache(3, 1)  # noqa: E731
        c.differential(ex, protocol.interleaved(make, _turn(c), 5), "caches A and B (budget 3, recent 1), updated and "
                       "observed in turn: a prompt of 2, then one token at a time past the budget")
        held = {}

        def first(api, e, name):
            held["cache"] = make(api, e, 0)
            _turn(c)(api, e, held["cache"], 0, 0)
            return c.call(getattr(held["cache"], name))
        c.differential(ex, lambda api, e: _inputs_scribbled(c, api, e), "update(k_new, v_new), the caller then "
                       "overwrites k_new and v_new in place, then update again: what the cache holds is its own")
        for name in ("positions", "scores"):
            call = lambda api, e, name=name: c.call(getattr(held["cache"], name))  # noqa: E731
            c.differential(ex, protocol.changed_by_caller(lambda api, e, name=name: first(api, e, name), call,
                                                          f"{name}() again"),
                           f"{name}(), overwritten by the caller, then {name}() again")

    ctx.case({"seed": 6, "dtype": torch.float64}, body)


def _device_scenario(s):
    api = s.ctx.t
    scores = s.put(randn(1, 1, 2, 6))
    s.call("h2o_keep(scores, 3, 1)", api.h2o_keep, scores, 3, 1)
    s.call("snapkv_keep(scores, 3, 1)", api.snapkv_keep, scores, 3, 1)
    q, keys = s.put(randn(2, 1, 4, 2, 4)), s.put(randn(3, 1, 2, 8, 4))
    s.call("snapkv_scores(q_window, keys)", api.snapkv_scores, q, keys)
    k, v = s.put(randn(4, 1, 2, 5, 4)), s.put(randn(5, 1, 2, 5, 4))
    cache = api.ScoredKVCache(3, 1)
    s.call("ScoredKVCache(3, 1).update(k_new, v_new) with 4 tokens", cache.update, k[:, :, :4], v[:, :, :4])
    s.call("observe(probs)", cache.observe, s.put(torch.full((1, 4, 4, 4), 0.25, dtype=torch.float64)))
    s.call("update(k_new, v_new), token 5", cache.update, k[:, :, 4:], v[:, :, 4:])
    s.call("compress(keep)", cache.compress, s.put(torch.tensor([[[0, 3], [1, 2]]])))
    s.call("positions()", cache.positions)
    s.call("scores()", cache.scores)


@CHECKS.add("every function keeps the inputs' device (no tensor made on the CPU by accident)", uses="ScoredKVCache")
def keeps_the_device(ctx):
    ctx.case({"seed": 0}, lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))
