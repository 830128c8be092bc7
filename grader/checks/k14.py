"""Hidden checks of kata 14 — an offloaded cache with layer-ahead prefetch, then block swap.

The offloaded cache is judged three ways: a Llama through it gives the logits of a plain cache bit
for bit; programs of update calls give the reference's results, lengths, host copies, residency and
stats; and on the device stand-in (CUDA where present) every copy that crosses is counted
(``k14_moves.Crossings``), with the device memory the cache keeps. The swap half replays programs
of add / grow / fork / swap out / swap in / free on the shared paged cache (``k14_swap``).
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks import k14_swap as swap
from grader.checks.k14_moves import (STATS, Crossings, PlainCache, callers_values, excess_device_bytes, layer_bytes,
                                     new_kv, two_caches, update_programs)
from grader.checks.support import devices
from grader.checks.support.common import SEEDS, expect_value_error, randn, tiny_llama, value_error_names
from grader.checks.support.models import DEVICE_MODEL
from grader.engine import Checks
from grader.nn import Llama, LlamaConfig

CHECKS = Checks("14")
HALF = (torch.bfloat16, torch.float16)


# -- the values: a plain cache's, bit for bit ------------------------------------------------------
def _runs(draw_layers=(1, 4)):
    return st.fixed_dictionaries({
        "layers": st.integers(*draw_layers), "batch": st.integers(1, 2),
        "chunks": st.lists(st.integers(1, 5), min_size=1, max_size=5), "seed": SEEDS})


def _same_logits(c, ex):
    """Prefill and decode chunks through the learner's cache and a plain one: the same logits exactly."""
    over = ex.get("model", {})
    model = tiny_llama(ex["seed"], c.device, num_hidden_layers=ex["layers"], **over).to(ex.get("dtype", torch.float64))
    V = model.config.vocab_size
    ids = torch.randint(0, V, (ex["batch"], sum(ex["chunks"])), generator=torch.Generator().manual_seed(ex["seed"]))
    ids = ids.to(c.device)
    cache, plain, start = c.t.OffloadedKVCache(ex["layers"]), PlainCache(), 0
    with torch.no_grad():
        for n, T in enumerate(ex["chunks"]):
            positions = torch.arange(start, start + T, device=c.device).expand(ex["batch"], T)
            want = model(ids[:, start:start + T], positions, cache=plain)
            got = model(ids[:, start:start + T], positions, cache=cache)
            if not torch.equal(got, want):
                bad = (got != want).nonzero()[0].tolist()
                c.fail(f"forward {n} ({T} token(s) after {start} cached) through your cache gave logits that differ "
                       f"from a plain cache's, first at {bad}: {got[tuple(bad)].item()!r} instead of "
                       f"{want[tuple(bad)].item()!r}. Offloading moves data and never changes it: the logits must "
                       f"be equal bit for bit", ex, ("logits", n, got.detach().cpu()))
            start += T


LARGE = {"layers": 6, "batch": 1, "chunks": [260, 1, 1], "seed": 5,
         "model": {"num_attention_heads": 16, "num_key_value_heads": 16, "hidden_size": 64,
                   "intermediate_size": 32, "max_position_embeddings": 512}}


@CHECKS.add("a Llama through your cache gives a plain cache's logits, bit for bit (prefill, chunks, decode)",
            uses="OffloadedKVCache.update")
def same_logits_as_a_plain_cache(ctx):
    ctx.forall(_runs(), _same_logits, max_examples=15)
    ctx.case(LARGE, _same_logits)
    for dtype in HALF:
        ctx.case({"layers": 3, "batch": 2, "chunks": [5, 1, 2, 1], "seed": 9, "dtype": dtype}, _same_logits)


# -- programs of update calls, against the reference --------------------------------------------------
def _program(api, ex, device="cpu", spy: Crossings | None = None):
    """Run ex["calls"]; after each: what update returned, the lengths, host copies, resident(), stats, and
    (with ``spy``) the bytes that crossed each way and the device memory held beyond the resident layers."""
    seen, cache = {}, api.OffloadedKVCache(ex["layers"], device=device if spy else None)
    shape = (ex["batch"], ex["heads"], ex["head_dim"])
    for n, (layer, T) in enumerate(ex["calls"]):
        k, v = new_kv(ex, n, T)
        k, v = (devices.put(k), devices.put(v)) if spy and device == devices.STAND_IN else (k.to(device), v.to(device))
        before = (spy.h2d, spy.d2h) if spy else None
        K, V = cache.update(layer, k, v)
        row = {"K": devices.take(K), "V": devices.take(V),
               "seq_len": [cache.seq_len(i) for i in range(ex["layers"])],
               "resident": list(cache.resident()), "stats": {s: cache.stats[s] for s in STATS}}
        if spy is None:
            row["host_keys"] = list(cache.host_keys)
            row["host_values"] = list(cache.host_values)
        else:
            moved = {"h2d_bytes": spy.h2d - before[0], "d2h_bytes": spy.d2h - before[1]}
            row["bytes that crossed in this update"] = moved
            row["device bytes held beyond the resident layers"] = excess_device_bytes(
                cache, spy.device_type, shape, ex["dtype"])
        seen[f"call {n}: update({layer}, {T} token(s))"] = row
    return seen


@CHECKS.add("update programs (in order and out of order): returned K and V, lengths, host copies, resident(), stats",
            uses="OffloadedKVCache.update")
def update_programs_match(ctx):
    def body(c, ex):
        c.differential(ex, lambda api, e: _program(api, e), "after each update")

    ctx.forall(update_programs(), body, max_examples=30)
    ctx.case({"layers": 1, "batch": 1, "heads": 2, "head_dim": 2, "dtype": torch.float64,
              "calls": [(0, 3), (0, 1), (0, 1)], "strided": False, "seed": 1}, body)  # L = 1 prefetches itself
    for dtype in HALF:
        ctx.case({"layers": 2, "batch": 2, "heads": 2, "head_dim": 4, "dtype": dtype,
                  "calls": [(0, 3), (1, 3), (0, 1), (1, 1), (1, 1), (0, 2)], "strided": True, "seed": 2}, body)


def _placed(api, ex):
    """``_program`` with the device played by the stand-in (CUDA where the grading runs on it)."""
    if ex["device"] == "cuda":
        spy = Crossings("cuda")
        with spy:
            return _program(api, ex, torch.device("cuda"), spy)
    spy = Crossings(devices.STAND_IN.type)
    with devices.StandIn(), spy:
        return _program(api, ex, devices.STAND_IN, spy)


@CHECKS.add("bytes that cross each way, resident() and stats after every update, with a real device boundary",
            uses="OffloadedKVCache.update")
def counts_what_crosses(ctx):
    def body(c, ex):
        c.differential({**ex, "device": c.device.type}, _placed, "on the device stand-in, after each update")

    ctx.forall(update_programs(max_calls=9), body, max_examples=15)
    ctx.case({"layers": 3, "batch": 1, "heads": 2, "head_dim": 2, "dtype": torch.float32,
              "calls": [(0, 4), (1, 4), (2, 4), (0, 1), (1, 1), (2, 1), (0, 1), (1, 1), (2, 1)],
              "strided": False, "seed": 3}, body)


def _run_forwards(s, ex, note=None):
    """Llama forwards (ex["chunks"]: a prefill, then decodes) through the learner's cache on the session's
    device; ``note(cache, layer, n, shape, device_type)`` after every update of forward n."""
    config = dict(DEVICE_MODEL, num_hidden_layers=ex["layers"])
    model = devices.module_on(s, lambda: Llama(LlamaConfig(**config)), dtype=torch.float64)
    cache = s.ctx.t.OffloadedKVCache(ex["layers"], device=s.device)
    shape = (1, config["num_key_value_heads"], config["hidden_size"] // config["num_attention_heads"])
    start = 0
    for n, T in enumerate(ex["chunks"]):
        spy = cache if note is None else _Noting(cache, lambda layer, n=n: note(cache, layer, n, shape,
                                                                               s.device.type))
        ids = s.put(torch.arange(start, start + T).remainder(config["vocab_size"])[None])
        positions = s.put(torch.arange(start, start + T)[None])
        s.call(f"forward {n} of the model through OffloadedKVCache({ex['layers']}, device=...)", model, ids,
               positions, cache=spy)
        start += T


def _forwards(c, ex, note):
    devices.keeps_the_device(c, ex, lambda s: _run_forwards(s, ex, note))


def _device_scenario(s):
    """Three layers through a prefill and a decode, then a paged sequence swapped out and back."""
    _run_forwards(s, {"layers": 3, "chunks": [3, 1]})
    swap.device_scenario(s)


class _Noting:
    def __init__(self, cache, after):
        self._cache, self._after = cache, after

    def update(self, layer, k, v):
        out = self._cache.update(layer, k, v)
        self._after(layer)
        return out


@CHECKS.add("in-order forwards never miss, the wrap-around to layer 0 included", uses="OffloadedKVCache.update")
def in_order_forwards_never_miss(ctx):
    def body(c, ex):
        def note(cache, layer, n, shape, device_type):
            misses = cache.stats["misses"]
            if misses:
                c.fail(f"forward {n}, update({layer}): stats['misses'] = {misses} after forwards that call the "
                       f"layers in order; every layer should have been prefetched by the update before it (layer 0 "
                       f"by the last layer of the forward before)", ex, ("misses", n, layer, misses))

        _forwards(c, ex, note)

    for layers in (1, 2, 4):
        ctx.case({"layers": layers, "chunks": [3, 1, 1, 2]}, body)


@CHECKS.add("at most two layers on the device, and no device memory beyond the layers resident() lists",
            uses="OffloadedKVCache.update")
def holds_two_layers_at_most(ctx):
    def body(c, ex):
        def note(cache, layer, n, shape, device_type):
            resident = list(cache.resident())
            if len(set(resident)) > 2:
                c.fail(f"forward {n}, after update({layer}): resident() = {resident}; the device holds the layer "
                       f"being computed and the next one, no more", ex, ("resident", n, layer, tuple(resident)))
            excess = excess_device_bytes(cache, device_type, shape, torch.float64)
            if excess:
                held = sum(layer_bytes(cache, i, shape, torch.float64) for i in set(resident))
                c.fail(f"forward {n}, after update({layer}): your cache keeps {excess} bytes on the device beyond "
                       f"the K and V of the layers resident() = {resident} lists ({held} bytes)", ex,
                       ("excess", n, layer, excess))

        _forwards(c, ex, note)

    for layers in (1, 3):
        ctx.case({"layers": layers, "chunks": [4, 1, 2]}, body)


@CHECKS.add("the cache works on the device it is given (no tensor made on the CPU by accident)", uses="OffloadedKVCache")
def keeps_the_device(ctx):
    def body(c, ex):
        devices.keeps_the_device(c, ex, _device_scenario)

    ctx.case({"layers": 3, "chunks": [3, 1]}, body)


# -- state and aliasing ----------------------------------------------------------------------------
@CHECKS.add("two caches driven in turn keep apart; resident() and stats are the caller's", uses="OffloadedKVCache")
def caches_keep_apart(ctx):
    ex = {"batch": 1, "heads": 2, "head_dim": 2, "dtype": torch.float64, "seed": 4}
    ctx.case({**ex, "program": "two caches in turn"}, lambda c, e: c.differential(e, two_caches, e["program"]))
    ctx.case({**ex, "program": "overwritten reads"}, lambda c, e: c.differential(e, callers_values, e["program"]))


# -- bad input ---------------------------------------------------------------------------------------
def _bad_updates(c, ex):
    Cache, k = c.t.OffloadedKVCache, randn(1, 1, 3, 2, 4)  # (B, Hkv, T, D) = (1, 3, 2, 4)
    cases = [("OffloadedKVCache(0)", Cache, (0,), {}, ("n_layers",)),
             ("OffloadedKVCache(-1)", Cache, (-1,), {}, ("n_layers",)),
             ("OffloadedKVCache(2.0)", Cache, (2.0,), {}, ("n_layers",)),
             ("OffloadedKVCache('2')", Cache, ("2",), {}, ("n_layers",)),
             ("OffloadedKVCache(2, device='nowhere')", Cache, (2,), {"device": "nowhere"}, ("device",)),
             ("OffloadedKVCache(2, device='')", Cache, (2,), {"device": ""}, ("device",)),
             ("OffloadedKVCache(2, offload_device='nowhere')", Cache, (2,), {"offload_device": "nowhere"},
              ("offload_device",)),
             ("OffloadedKVCache(2, pin_memory='yes')", Cache, (2,), {"pin_memory": "yes"}, ("pin_memory",)),
             ("OffloadedKVCache(2, pin_memory='')", Cache, (2,), {"pin_memory": ""}, ("pin_memory",))]
    if not torch.cuda.is_available():
        cases.append(("OffloadedKVCache(2, pin_memory=True) without CUDA", Cache, (2,), {"pin_memory": True},
                      ("pin_memory",)))
    cache = Cache(2)
    cache.update(0, k, k)
    meta = torch.empty(1, 2, 1, 4, device="meta")
    for layer in (-1, 2, 1.0, "0", None):
        cases.append((f"update({layer!r}, k, v)", cache.update, (layer, k[:, :, :1], k[:, :, :1]), {}, ("layer",)))
    given = Cache(2, device="meta")
    cases += [("update(0, k, v) with k of 3 dimensions", cache.update, (0, k[0], k[0]), {}, ("k",)),
              ("update(1, k, v) with k of 5 dimensions", cache.update, (1, k[None], k[None]), {}, ("k",)),
              ("update(0, k, v) with v of 5 dimensions", cache.update, (0, k, k[None]), {}, ("v",)),
              ("update(0, k, v) with v one token shorter", cache.update, (0, k, k[:, :, :1]), {}, ("v",)),
              ("OffloadedKVCache(2, device='meta').update(0, k, v) with k on the CPU", given.update, (0, k, k), {},
               ("k",)),
              ("update(0, k, v) with k a list", cache.update, (0, k.tolist(), k), {}, ("k",)),
              ("update(0, k, v) with v of 3 dimensions", cache.update, (0, k, k[0]), {}, ("v",)),
              ("update(0, k, v) with v one token longer", cache.update, (0, k, torch.cat([k, k[:, :, :1]], 2)), {},
               ("v",)),
              ("update(0, k, v) with v in float32, k in float64", cache.update, (0, k, k.float()), {}, ("v",)),
              ("update(0, k, v) with k, v in float32 where layer 0 holds float64", cache.update, (0, k.float(),
               k.float()), {}, ("k",)),
              ("update(0, k, v) with 2 heads where layer 0 holds 3", cache.update, (0, k[:, :2], k[:, :2]), {}, ("k",)),
              ("update(0, k, v) with head width 2 where layer 0 holds 4", cache.update, (0, k[..., :2], k[..., :2]),
               {}, ("k",)),
              ("update(0, k, v) with batch 2 where layer 0 holds 1", cache.update, (0, torch.cat([k, k]),
               torch.cat([k, k])), {}, ("k",)),
              ("update(1, k, v) with k on another device (meta) than the cache's (cpu)", cache.update,
               (1, meta, meta), {}, ("k",))]
    for what, fn, args, kwargs, names in cases:
        expect_value_error(c, fn, *args, what=what, names=names, example=ex, **kwargs)
    return cache, k


def _layer_past_the_end(c, ex, one) -> None:
    """seq_len(1) of a one-layer cache: the README accepts 0 (the layer holds nothing) or a ValueError naming layer."""
    what = "seq_len(1) on OffloadedKVCache(1)"
    try:
        got = one.seq_len(1)
    except ValueError as exc:
        if not value_error_names(exc, ("layer",)):
            c.fail(f"{what} raised ValueError({str(exc)!r}); the message should name layer", ex, ("unnamed", what))
        return
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the learner's code may raise anything
        c.fail(f"{what} raised {type(exc).__name__}: {exc}; expected 0 (the layer holds nothing) or a ValueError "
               "naming layer", ex, ("raised", type(exc).__name__))
    if isinstance(got, bool) or got != 0:
        c.fail(f"{what} returned {got!r}; expected 0 (the layer holds nothing) or a ValueError naming layer", ex,
               ("seq_len past the end", repr(got)))


@CHECKS.add("bad input raises ValueError naming the argument; a refused update changes nothing; L = 1 and T = 1 work",
            uses="OffloadedKVCache")
def rejects_bad_input(ctx):
    def body(c, ex):
        cache, k = _bad_updates(c, ex)
        K, _ = cache.update(0, k[:, :, :1], k[:, :, :1])  # the first valid values: one token, layer 0
        lengths = [cache.seq_len(0), cache.seq_len(1), cache.seq_len()]
        if lengths != [3, 0, 3] or tuple(K.shape) != (1, 3, 3, 4):
            c.fail(f"after refused updates, one of 2 tokens and one of 1 token to layer 0: seq_len(0), seq_len(1), "
                   f"seq_len() = {lengths} and K of shape {tuple(K.shape)}; expected [3, 0, 3] and (1, 3, 3, 4)", ex,
                   ("after refusals", tuple(lengths)))
        one = c.t.OffloadedKVCache(1)
        expect_value_error(c, one.update, 1, k, k, what="update(1, k, v) on OffloadedKVCache(1)", names=("layer",),
                           example=ex)
        _layer_past_the_end(c, ex, one)

    ctx.case({"case": "bad arguments"}, body)


swap.register(CHECKS)
