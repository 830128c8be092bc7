"""Kata 20's bad inputs: every argument out of range or of the wrong type, a ValueError naming it, and a
refused call that changes nothing. The check bodies live here; grader.checks.k20 registers them."""
from __future__ import annotations

import torch

from grader.checks.support.common import expect_value_error, randn

SLIDING, FULL, SHARED, LINEAR = "sliding_attention", "full_attention", "shared", "linear_attention"
GOOD_BYTES = {"layer_types": [SLIDING, FULL, LINEAR], "seq_len": 10, "n_kv_heads": 2, "head_dim": 4, "window": 4,
              "state_bytes": 64, "dtype_bytes": 2, "batch": 1}
SIZES = {"seq_len": 0, "window": 1, "state_bytes": 0, "dtype_bytes": 1, "batch": 1, "n_kv_heads": 1, "head_dim": 1}


def _bad_sizes(arg: str, low: int) -> list:
    return [(f"{arg}={low - 1}", low - 1), (f"{arg}=2.5", 2.5), (f"{arg}='8'", "8"), (f"{arg}=True", True)]


def bytes_cases(ctx) -> None:
    cases = [(what, {arg: bad}, (arg,)) for arg, low in SIZES.items() for what, bad in _bad_sizes(arg, low)]
    cases += [("layer_types='sliding_attention'", {"layer_types": SLIDING}, ("layer_types",)),
              ("an unknown kind 'local'", {"layer_types": [SLIDING, "local"]}, ("layer_types",)),
              ("layer_types=None", {"layer_types": None}, ("layer_types",)),
              ("n_kv_heads without the full layers' entry", {"n_kv_heads": {SLIDING: 2}}, ("n_kv_heads",)),
              ("head_dim with a zero for the sliding layers", {"head_dim": {SLIDING: 0, FULL: 4}}, ("head_dim",))]

    def body(c, ex):
        for what, change, names in cases:
            kw = {**GOOD_BYTES, **change}
            expect_value_error(c, c.t.hybrid_cache_bytes, kw.pop("layer_types"), kw.pop("seq_len"), **kw,
                               what=f"hybrid_cache_bytes with {what}", names=names, example=ex)

    ctx.case({"seed": 0}, body)


def mask_cases(ctx) -> None:
    def body(c, ex):
        q, k = torch.arange(3, 5, device=c.device), torch.arange(0, 5, device=c.device)
        cases = [("kind='shared'", ("shared", q, k, 2), "kind"), ("kind='linear_attention'", (LINEAR, q, k, 2), "kind"),
                 ("kind='sliding'", ("sliding", q, k, 2), "kind"), ("window=0", (SLIDING, q, k, 0), "window"),
                 ("window=2.5", (SLIDING, q, k, 2.5), "window"), ("window=0 for a full layer", (FULL, q, k, 0), "window"),
                 ("q_pos as a list", (SLIDING, [3, 4], k, 2), "q_pos"), ("k_pos of floats", (SLIDING, q, k.double(), 2),
                                                                         "k_pos"),
                 ("q_pos 2-D", (SLIDING, q[None], k, 2), "q_pos"), ("k_pos int32", (SLIDING, q, k.int(), 2), "k_pos")]
        for what, args, name in cases:
            expect_value_error(c, c.t.window_mask, *args, what=f"window_mask with {what}", names=(name,), example=ex)

    ctx.case({"seed": 0}, body)


def _kv(c, T=2, B=1, H=2, D=4, Dv=3):
    return randn(1, B, H, T, D, device=c.device), randn(2, B, H, T, Dv, device=c.device)


def _refused_updates(c, k, v):
    """(what, k, v, names) for a layer holding tokens of k and v's shapes."""
    return [("k without a head axis", k[:, 0], v, ("k",)), ("k = None", None, v, ("k",)),
            ("k and v with an extra axis", k[..., None], v[..., None], ("k", "v")),
            ("v = None", k, None, ("v",)), ("v with one token fewer than k", k, v[:, :, :1], ("v", "k")),
            ("twice the batch of the tokens held", torch.cat([k, k]), torch.cat([v, v]), ("k", "v")),
            ("one head fewer than the tokens held", k[:, :1], v[:, :1], ("k", "v")),
            ("a wider k than the tokens held", torch.cat([k, k], 3), v, ("k",)),
            ("a wider v than the tokens held", k, torch.cat([v, v], 3), ("v",))]


def window_cases(ctx) -> None:
    def body(c, ex):
        for what, bad in (("window=0", 0), ("window=-1", -1), ("window=2.5", 2.5), ("window=True", True)):
            expect_value_error(c, c.t.SlidingLayer, bad, what=f"SlidingLayer with {what}", names=("window",), example=ex)
        layer = c.t.SlidingLayer(3)
        k, v = _kv(c)
        c.call(layer.update, k, v)
        for what, bk, bv, names in _refused_updates(c, k, v):
            expect_value_error(c, layer.update, bk, bv, what=f"update with {what}", names=names, example=ex)
        state = (len(layer), layer.seen, layer.nbytes())
        if state != (2, 2, 224):
            c.fail(f"after 2 tokens and the refused updates, (len, seen, nbytes()) is {state}, expected "
                   "(2, 2, 224): a refused update changes nothing", ex, ("changed", state))

    ctx.case({"seed": 0}, body)


def hybrid_cases(ctx) -> None:
    def body(c, ex):
        kinds = [SLIDING, FULL, SHARED, LINEAR]
        for what, args, kw, name in (
                ("an unknown kind", ([SLIDING, "global"],), {"window": 2}, "layer_types"),
                ("layer_types as a string", (SLIDING,), {"window": 2}, "layer_types"),
                ("window=0", (kinds,), {"window": 0, "shared_from": {2: 0}}, "window"),
                ("window=1.5", (kinds,), {"window": 1.5, "shared_from": {2: 0}}, "window"),
                ("window=0 and no window layer", ([FULL, LINEAR],), {"window": 0}, "window"),
                ("window=True and no window layer", ([FULL],), {"window": True}, "window"),
                ("a producer at index -1", ([FULL, SHARED, FULL],), {"window": 2, "shared_from": {1: -1}},
                 "shared_from"),
                ("a shared layer without a producer", (kinds,), {"window": 2}, "shared_from"),
                ("a producer for a layer that is not shared", (kinds,), {"window": 2, "shared_from": {2: 0, 1: 0}},
                 "shared_from"),
                ("a later producer", ([SHARED, FULL],), {"window": 2, "shared_from": {0: 1}}, "shared_from"),
                ("a linear producer", ([LINEAR, SHARED],), {"window": 2, "shared_from": {1: 0}}, "shared_from"),
                ("a shared producer", ([FULL, SHARED, SHARED],), {"window": 2, "shared_from": {1: 0, 2: 1}},
                 "shared_from"),
                ("a producer for layer 9 of 4", (kinds,), {"window": 2, "shared_from": {2: 0, 9: 0}}, "shared_from")):
            expect_value_error(c, c.t.HybridKVCache, *args, **kw, what=f"HybridKVCache with {what}", names=(name,),
                               example=ex)
        cache = c.t.HybridKVCache(kinds, window=2, shared_from={2: 0})
        expect_value_error(c, cache.shared, 2, what="shared(2) before its producer was updated", names=("layer",),
                           example=ex)
        k, v = _kv(c)
        c.call(cache.update, 0, k, v)
        c.call(cache.update, 1, k, v)
        for what, fn, args in (("update(2, k, v) on the shared layer", cache.update, (2, k, v)),
                               ("update(3, k, v) on the linear layer", cache.update, (3, k, v)),
                               ("update(4, k, v) past the last layer", cache.update, (4, k, v)),
                               ("update(-1, k, v)", cache.update, (-1, k, v)),
                               ("update('0', k, v)", cache.update, ("0", k, v)),
                               ("shared(0) on a sliding layer", cache.shared, (0,)),
                               ("state(1) on a full layer", cache.state, (1,)), ("state(2) on a shared layer",
                                                                                 cache.state, (2,)),
                               ("stored(4)", cache.stored, (4,)), ("stored(-1)", cache.stored, (-1,)),
                               ("nbytes(7)", cache.nbytes, (7,)), ("nbytes(-4)", cache.nbytes, (-4,))):
            expect_value_error(c, fn, *args, what=f"HybridKVCache.{what}", names=("layer",), example=ex)
        for layer in (0, 1):  # a sliding layer and a full one
            for what, bk, bv, names in _refused_updates(c, k, v):
                expect_value_error(c, cache.update, layer, bk, bv, what=f"update({layer}, ...) with {what}",
                                   names=names, example=ex)
        state = (cache.seq_len(), cache.stored(0), cache.stored(1))
        if state != (2, 1, 2):
            c.fail(f"after 2 tokens and the refused calls, (seq_len(), stored(0), stored(1)) is {state}, expected "
                   "(2, 1, 2): a refused call changes nothing", ex, ("changed", state))

    ctx.case({"seed": 0}, body)


def linear_cases(ctx) -> None:
    def body(c, ex):
        B, H, T, Dk, Dv = 1, 2, 3, 4, 2
        q, k = randn(1, B, H, T, Dk, device=c.device), randn(2, B, H, T, Dk, device=c.device)
        v, decay = randn(3, B, H, T, Dv, device=c.device), torch.full((B, H, T), 0.5, dtype=torch.float64,
                                                                       device=c.device)
        wide = lambda x: torch.cat([x, x], 3)  # noqa: E731
        for what, args, names in (("k narrower than q", (q, k[..., :2], v, decay), ("k", "q")),
                                  ("k wider than q", (q, wide(k), v, decay), ("k", "q")),
                                  ("v with one token more", (q, k, torch.cat([v, v[:, :, :1]], 2), decay), ("v",)),
                                  ("decay with one token more", (q, k, v, torch.cat([decay, decay[..., :1]], 2)),
                                   ("decay",)),
                                  ("q, k and v with an extra axis", (q[..., None], k[..., None], v[..., None], decay),
                                   ("q", "k", "v"))):
            expect_value_error(c, c.t.LinearState().step, *args, what=f"a new LinearState's step with {what}",
                               names=names, example=ex)
        state = c.t.LinearState()
        c.call(state.step, q, k, v, decay)
        held = state.state.clone()
        for what, args, names in (("q without a head axis", (q[:, 0], k, v, decay), ("q",)),
                                  ("k narrower than q", (q, k[..., :2], v, decay), ("k", "q")),
                                  ("v with one token fewer", (q, k, v[:, :, :2], decay), ("v",)),
                                  ("v = None", (q, k, None, decay), ("v",)),
                                  ("decay (B, H) without the token axis", (q, k, v, decay[..., 0]), ("decay",)),
                                  ("decay = 0.5, a float", (q, k, v, 0.5), ("decay",)),
                                  ("keys wider than the state held", (torch.cat([q, q], 3), torch.cat([k, k], 3), v,
                                                                      decay), ("k", "q")),
                                  ("values wider than the state held", (q, k, torch.cat([v, v], 3), decay), ("v",)),
                                  ("keys narrower than the state held", (q[..., :2], k[..., :2], v, decay), ("k", "q")),
                                  ("values narrower than the state held", (q, k, v[..., :1], decay), ("v",))):
            expect_value_error(c, state.step, *args, what=f"LinearState.step with {what}", names=names, example=ex)
        if state.seen != T or not torch.equal(state.state, held):
            c.fail(f"after one step of {T} tokens and the refused steps, seen is {state.seen} and the state "
                   "changed: a refused step changes nothing", ex, ("changed", state.seen))

    ctx.case({"seed": 0}, body)
