"""Programs for kata 17's cache checks: drawn sequences of ``update`` (every layer, T new tokens),
``set_cross`` (one layer, S_enc frames), ``crop``, ``reorder`` (repeats and dropped rows) and ``reset`` (the
next request in another batch),
run on the learner's ``EncoderDecoderKVCache`` and on the reference's, every result and the whole
state (``seq_len``, ``cross_len``, ``cross`` of every layer, ``nbytes``) compared after every call.
The driver keeps its own count of the batch, the self length and the layers whose cross part is set,
so both caches get the same calls whatever either does. Also here: two caches in turn, and bad calls.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks.support import envelope, protocol
from grader.checks.support.common import DTYPES, SEEDS, expect_value_error, named, randn, value_error_names


@st.composite
def programs(draw, max_ops=9):
    """Drawn programs with the shapes they use (layers, batch, heads, head width, dtype)."""
    ex = {"layers": draw(st.integers(1, 3)), "batch": draw(st.integers(1, 3)), "heads": draw(st.integers(1, 2)),
          "head_dim": draw(st.sampled_from([2, 4])), "dtype": draw(DTYPES)}
    op = st.one_of(st.tuples(st.just("update"), st.integers(1, 4)),
                   st.tuples(st.just("cross"), st.integers(0, 2), st.integers(1, 6)),
                   st.tuples(st.just("crop"), st.integers(0, 9)),
                   st.tuples(st.just("reorder"), st.lists(st.integers(0, 5), min_size=1, max_size=4)),
                   st.tuples(st.just("reset"), st.integers(1, 3)))  # the next request's batch
    ex["ops"] = draw(st.lists(op, min_size=2, max_size=max_ops))
    ex["seed"] = draw(SEEDS)
    return ex


def _state(cache, layers: int) -> dict:
    return {"seq_len(layer) of every layer": [cache.seq_len(layer) for layer in range(layers)],
            "cross_len(layer) of every layer": [cache.cross_len(layer) for layer in range(layers)],
            "cross(layer) of every layer": [_cross(cache.cross(layer)) for layer in range(layers)],
            "seq_len() and cross_len() (layer 0 by default)": [cache.seq_len(), cache.cross_len()],
            "nbytes()": cache.nbytes()}


def _cross(pair):
    return None if pair is None else named(pair)


class Driver:
    """What the program knows of the cache without asking it: batch, self length, layers with a cross part."""

    def __init__(self, ex: dict):
        self.ex, self.batch, self.length, self.crossed = ex, ex["batch"], 0, set()

    def kv(self, seed: int, T: int, device):
        ex = self.ex
        return tuple(envelope.tensor(ex, seed + s, self.batch, ex["heads"], T, ex["head_dim"], device=device)
                     for s in (0, 500_000))

    def step(self, cache, step: int, op: tuple, device):
        """Run one op on ``cache``; returns (what was called, what it returned)."""
        layers, seed = self.ex["layers"], self.ex["seed"] * 1000 + step * 10
        if op[0] == "update":
            self.length += op[1]
            return (f"update(layer, k, v) with {op[1]} new tokens, every layer",
                    [named(cache.update(layer, *self.kv(seed + layer, op[1], device))) for layer in range(layers)])
        if op[0] == "cross":
            layer = op[1] % layers
            if layer in self.crossed:
                return f"(layer {layer}'s cross part is set: nothing called)", None
            self.crossed.add(layer)
            return (f"set_cross({layer}, k, v) with {op[2]} frames",
                    named(cache.set_cross(layer, *self.kv(seed + 7, op[2], device))))
        if op[0] == "crop":
            n = min(op[1], self.length)
            self.length = n
            return f"crop({n})", cache.crop(n)
        if op[0] == "reorder":
            if not (self.length or self.crossed):  # no token, no frame: the README leaves the rows open
                return "(the cache holds no token and no frame: reorder not called)", None
            rows = [r % self.batch for r in op[1]]
            self.batch = len(rows)
            return f"reorder(tensor({rows}))", cache.reorder(torch.tensor(rows, device=device))
        self.length, self.crossed = 0, set()
        if len(op) > 1:  # the next request may bring another batch
            self.batch = op[1]
        return "reset()", cache.reset()


def run_program(api, ex: dict) -> dict:
    """The program on ``api``'s cache: every call's result and the whole state after it."""
    cache, driver, seen = api.EncoderDecoderKVCache(), Driver(ex), {}
    seen["a fresh cache"] = protocol.snapshot(_state(cache, ex["layers"]))
    for step, op in enumerate(ex["ops"]):
        what, result = driver.step(cache, step, op, ex["device"])
        # copied at once: a cache may return views of its storage, valid until its next change (SPEC)
        seen[f"step {step + 1}: {what}"] = protocol.snapshot({"returned": result, **_state(cache, ex["layers"])})
    return seen


def new_cache(api, ex, i):
    return api.EncoderDecoderKVCache()


def cache_step(api, ex, cache, i, n):
    """Step n of cache i (A or B, each with its own shapes and contents): an update, a set_cross on the first
    step, a crop on the third, a reorder on the fourth; the returned pair and the state are compared."""
    B, H, D, device = 1 + i, 2 - i, 4, ex["device"]
    k, v = (randn(ex["seed"] * 100 + i * 10 + n + s, B, H, 2 + i, D, device=device) for s in (0, 50))
    out = {"update(0, k, v)": named(cache.update(0, k, v))}
    if n == 0:
        kc, vc = (randn(ex["seed"] * 100 + i * 10 + 70 + s, B, H, 3 + 2 * i, D, device=device) for s in (0, 50))
        out["set_cross(0, k, v)"] = named(cache.set_cross(0, kc, vc))
    if n == 2:
        cache.crop(cache.seq_len() - 1)
    if n == 3:
        cache.reorder(torch.arange(B - 1, -1, -1, device=device))
    return {**out, **_state(cache, 1)}


def bad_calls(cache, k: torch.Tensor, kc: torch.Tensor, wide: torch.Tensor) -> list:
    """(what, call, names) for each bad call on a cache holding 3 tokens in layers 0 and 1 (batch 1, 2 heads,
    width 4) and a cross part of 5 frames in layer 0; ``wide`` is (2, 3, 3, 8): another batch, heads and width."""
    v = k.clone()
    calls = [
        ("update(-1, k, v)", lambda: cache.update(-1, k, v), ("layer",)),
        ("update('0', k, v)", lambda: cache.update("0", k, v), ("layer",)),
        ("update(0, k, v) with a 3-D k", lambda: cache.update(0, k[0], v[0]), ("k",)),
        ("update(0, k, v) with a 5-D k", lambda: cache.update(0, k[None], v[None]), ("k",)),
        ("update(2, k, v) (a layer not seen yet) with a 5-D k", lambda: cache.update(2, k[None], v[None]), ("k",)),
        ("update(0, k, v) with k a list", lambda: cache.update(0, k.tolist(), v), ("k",)),
        ("update(0, k, None)", lambda: cache.update(0, k, None), ("v",)),
        ("update(0, k, v) with v one token shorter", lambda: cache.update(0, k, v[:, :, :-1]), ("v",)),
        ("update(0, k, v) with v one token longer", lambda: cache.update(0, k, torch.cat([v, v[:, :, :1]], 2)),
         ("v",)),
        ("update(0, k, v) with 3 heads for 2", lambda: cache.update(0, wide[:1, :, :, :4], wide[:1, :, :, :4]), ("k",)),
        ("update(0, k, v) with 1 head for 2", lambda: cache.update(0, k[:, :1], v[:, :1]), ("k",)),
        ("update(0, k, v) with width 8 for 4", lambda: cache.update(0, wide[:1, :2], wide[:1, :2]), ("k",)),
        ("update(0, k, v) with width 2 for 4", lambda: cache.update(0, k[..., :2], v[..., :2]), ("k",)),
        ("update(0, k, v) with batch 2 for 1", lambda: cache.update(0, wide[:, :2, :, :4], wide[:, :2, :, :4]), ("k",)),
        ("update(2, k, v) (a layer not seen yet) with batch 2 for the cache's 1",
         lambda: cache.update(2, wide[:, :2, :, :4], wide[:, :2, :, :4]), ("k",)),
        ("set_cross(0, k, v) on layer 0, whose cross part is set", lambda: cache.set_cross(0, kc, kc.clone()),
         ("layer",)),
        ("set_cross(-1, k, v)", lambda: cache.set_cross(-1, kc, kc.clone()), ("layer",)),
        ("set_cross(1, k, v) with a 3-D k", lambda: cache.set_cross(1, kc[0], kc[0]), ("k",)),
        ("set_cross(1, k, v) with a 5-D k", lambda: cache.set_cross(1, kc[None], kc[None]), ("k",)),
        ("set_cross(1, k, v) with v of other frames", lambda: cache.set_cross(1, kc, kc[:, :, :-1]), ("v",)),
        ("set_cross(1, k, v) with batch 2 for the cache's 1", lambda: cache.set_cross(1, wide, wide), ("k",)),
        ("cross(-1)", lambda: cache.cross(-1), ("layer",)),
        ("cross('1')", lambda: cache.cross("1"), ("layer",)),
        ("seq_len(-1)", lambda: cache.seq_len(-1), ("layer",)),
        ("cross_len(-1)", lambda: cache.cross_len(-1), ("layer",)),
        ("cross_len(0.5)", lambda: cache.cross_len(0.5), ("layer",)),
        ("crop(-1)", lambda: cache.crop(-1), ("n",)),
        ("crop(4) with 3 tokens cached", lambda: cache.crop(4), ("n",)),
        ("crop(1.5)", lambda: cache.crop(1.5), ("n",)),
        ("reorder(tensor([1])) for a batch of 1", lambda: cache.reorder(torch.tensor([1], device=k.device)),
         ("index",)),
        ("reorder(tensor([-1]))", lambda: cache.reorder(torch.tensor([-1], device=k.device)), ("index",)),
        ("reorder(tensor([[0]])) (2-D)", lambda: cache.reorder(torch.tensor([[0]], device=k.device)), ("index",)),
        ("reorder(tensor([0.0])) (float)", lambda: cache.reorder(torch.tensor([0.0], device=k.device)), ("index",)),
        ("reorder(tensor([], dtype=long)) (empty)",
         lambda: cache.reorder(torch.zeros(0, dtype=torch.long, device=k.device)), ("index",)),
        ("reorder([0]) (a list)", lambda: cache.reorder([0]), ("index",)),
    ]
    return calls


def only_cross(c, ex) -> None:
    """A cache whose only part is layer 0's cross part (batch 1): the batch is that part's (README: "in either
    part"), so a k of batch 2 is refused, by update as by set_cross, and nothing changes."""
    cache = c.t.EncoderDecoderKVCache()
    kc = randn(ex["seed"], 1, 2, 5, 4, device=c.device)
    wide = randn(ex["seed"] + 1, 2, 2, 3, 4, device=c.device)
    cache.set_cross(0, kc, kc.clone())
    for what, call in (("update(0, k, v) with batch 2 where only a cross part of batch 1 is held",
                        lambda: cache.update(0, wide, wide.clone())),
                       ("set_cross(1, k, v) with batch 2 where only a cross part of batch 1 is held",
                        lambda: cache.set_cross(1, wide, wide.clone()))):
        expect_value_error(c, call, what=what, names=("k",), example=ex)
        held = (cache.seq_len(0), cache.cross_len(0), cache.cross_len(1), cache.nbytes())
        if held != (0, 5, 0, 2 * 2 * 5 * 4 * 8):
            c.fail(f"after the refused {what}, (seq_len(0), cross_len(0), cross_len(1), nbytes()) = {held} instead "
                   f"of {(0, 5, 0, 2 * 2 * 5 * 4 * 8)}", ex, ("changed", what))
    K, _ = cache.update(0, wide[:1], wide[:1].clone())  # batch 1 is the cache's: accepted
    if tuple(K.shape) != (1, 2, 3, 4):
        c.fail(f"update(0, k, v) of batch 1 next to a cross part of batch 1 returned K of shape {tuple(K.shape)}, "
               "expected (1, 2, 3, 4)", ex, ("shape", tuple(K.shape)))


def empty_reorder(c, ex) -> None:
    """reorder of a cache holding nothing (fresh, or after reset): the README leaves it open whether that is a
    ValueError naming index (no row is in 0 … B-1) or nothing at all; either way the cache stays empty and
    takes the next request's batch."""
    cache = c.t.EncoderDecoderKVCache()
    for when in ("a fresh cache", "a cache after reset()"):
        what = f"reorder(tensor([0])) of {when}"
        try:
            cache.reorder(torch.tensor([0], device=c.device))
        except ValueError as exc:
            if not value_error_names(exc, ("index",)):
                c.fail(f"{what} raised ValueError({str(exc)!r}); a refusal should name index", ex, ("unnamed", what))
        held = (cache.seq_len(), cache.cross_len(), cache.cross(0), cache.nbytes())
        if held != (0, 0, None, 0):
            c.fail(f"after {what}, (seq_len(), cross_len(), cross(0), nbytes()) = {held}; expected (0, 0, None, 0)",
                   ex, ("not empty", when))
        k = randn(ex["seed"], 2, 1, 2, 4, device=c.device)  # batch 2
        K, _ = cache.update(0, k, k.clone())
        if tuple(K.shape) != (2, 1, 2, 4):
            c.fail(f"after {what}, update(0, k, v) of batch 2 returned K of shape {tuple(K.shape)}, expected "
                   "(2, 1, 2, 4)", ex, ("shape", when))
        cache.reset()
