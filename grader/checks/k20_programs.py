"""Kata 20's shared programs: the inputs drawn for the checks, and the runs every check compares with
the reference (a window layer fed chunk after chunk, a hybrid cache driven layer by layer as a model
drives it, a linear state stepped). grader.checks.k20 registers the checks."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks.support import envelope
from grader.checks.support.common import DTYPES, SEEDS
from grader.engine import report

ATTENTION = ("full_attention", "sliding_attention", "chunked_attention")


def snap(value):
    """What the learner returned, copied: a later update may rewrite a buffer in place."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(snap(v) for v in value)
    return value


def triple(c, value, call: str, ex):
    """A returned (K, V, k_pos), copied; a failure naming the call when it is not a triple."""
    if not (isinstance(value, (tuple, list)) and len(value) == 3):
        c.fail(f"{call} returned {report.describe(value)}, expected a triple (K, V, k_pos)", ex,
               ("returned", report.describe(value)))
    return {"K": snap(value[0]), "V": snap(value[1]), "k_pos": snap(value[2])}


# -- a window layer ---------------------------------------------------------------------------------
@st.composite
def window_streams(draw):
    window = draw(st.integers(1, 6))
    return {"window": window, "batch": draw(st.integers(1, 2)), "heads": draw(st.integers(1, 2)),
            "head_dim": draw(st.sampled_from([2, 4])), "v_dim": draw(st.sampled_from([2, 3])),
            "chunks": draw(st.lists(st.integers(1, window + 3), min_size=1, max_size=5)),
            "dtype": draw(DTYPES), "seed": draw(SEEDS)}


def kv(c, ex, seed: int, T: int):
    """One chunk's (k, v): (B, H, T, D) and (B, H, T, Dv), honouring the case's dtype and layout."""
    B, H = ex["batch"], ex["heads"]
    return (envelope.tensor(ex, seed, B, H, T, ex["head_dim"], device=c.device),
            envelope.tensor(ex, seed + 1, B, H, T, ex["v_dim"], device=c.device))


def window_stream(c, api, ex) -> dict:
    """Every update of a new SlidingLayer over the example's chunks: its triple and counts."""
    layer = api.SlidingLayer(ex["window"])
    got = {"new": {"len(layer)": len(layer), "seen": layer.seen, "nbytes()": layer.nbytes()}}
    for step, T in enumerate(ex["chunks"], start=1):
        k, v = kv(c, ex, ex["seed"] + 2 * step, T)
        out = triple(c, c.call(layer.update, k, v), f"SlidingLayer({ex['window']}).update", ex)
        got[f"step {step} (+{T})"] = {**out, "len(layer)": len(layer), "seen": layer.seen, "nbytes()": layer.nbytes()}
    return got


# -- a hybrid cache ---------------------------------------------------------------------------------
@st.composite
def layouts(draw):
    """Layer kinds with producers for the shared ones: an attention layer first, then anything."""
    kinds = [draw(st.sampled_from(ATTENTION))]
    shared_from = {}
    for layer in range(1, draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(ATTENTION + ("shared", "linear_attention")))
        if kind == "shared":
            producers = [i for i, k in enumerate(kinds) if k in ATTENTION]
            shared_from[layer] = draw(st.sampled_from(producers))
        kinds.append(kind)
    return kinds, shared_from


@st.composite
def programs(draw):
    kinds, shared_from = draw(layouts())
    window = draw(st.integers(1, 5))
    chunks = draw(st.lists(st.integers(1, window + 3), min_size=1, max_size=5))
    return {"layer_types": kinds, "shared_from": shared_from, "window": window, "chunks": chunks,
            "reset_after": draw(st.one_of(st.none(), st.integers(1, len(chunks)))),
            "batch": draw(st.integers(1, 2)), "heads": draw(st.integers(1, 2)), "head_dim": 2,
            "v_dim": draw(st.sampled_from([2, 3])), "dtype": draw(DTYPES), "seed": draw(SEEDS)}


def _layer_call(c, api, cache, ex, layer: int, T: int, seed: int):
    kind = ex["layer_types"][layer]
    if kind in ATTENTION:
        k, v = kv(c, ex, seed, T)
        return triple(c, c.call(cache.update, layer, k, v), f"cache.update({layer}, k, v)", ex)
    if kind == "shared":
        return triple(c, c.call(cache.shared, layer), f"cache.shared({layer})", ex)
    state = c.call(cache.state, layer)
    q, k = (envelope.tensor(ex, seed + j, ex["batch"], ex["heads"], T, ex["head_dim"], device=c.device)
            for j in (0, 1))
    v = envelope.tensor(ex, seed + 2, ex["batch"], ex["heads"], T, ex["v_dim"], device=c.device)
    decay = torch.sigmoid(envelope.tensor(ex, seed + 3, ex["batch"], ex["heads"], T, device=c.device))
    return {"step(q, k, v, decay)": snap(c.call(state.step, q, k, v, decay)), "seen": state.seen}


def _counts(c, cache, ex) -> dict:
    n = len(ex["layer_types"])
    return {"seq_len()": c.call(cache.seq_len), "stored(layer)": [c.call(cache.stored, i) for i in range(n)],
            "nbytes(layer)": [c.call(cache.nbytes, i) for i in range(n)], "nbytes()": c.call(cache.nbytes)}


def hybrid_program(c, api, ex) -> dict:
    """A new HybridKVCache driven as a model drives it: each chunk through every layer in order, the counts
    after each chunk; ``reset_after`` chunks, a reset and the stream again from position 0."""
    cache = api.HybridKVCache(ex["layer_types"], window=ex["window"], shared_from=ex["shared_from"])
    got, seen = {"new": _counts(c, cache, ex)}, 0
    for step, T in enumerate(ex["chunks"], start=1):
        for layer in range(len(ex["layer_types"])):
            got[f"chunk {step} (+{T}), layer {layer}"] = _layer_call(c, api, cache, ex, layer, T, 100 * step + 10 * layer)
        seen += T
        got[f"after chunk {step} ({seen} seen)"] = _counts(c, cache, ex)
        if ex.get("reset_after") == step:
            c.call(cache.reset)
            seen = 0
            got[f"after reset (chunk {step})"] = _counts(c, cache, ex)
    return got


# -- a linear state ---------------------------------------------------------------------------------
@st.composite
def linear_streams(draw):
    return {"batch": draw(st.integers(1, 2)), "heads": draw(st.integers(1, 2)),
            "head_dim": draw(st.sampled_from([1, 2, 4])), "v_dim": draw(st.sampled_from([1, 3])),
            "chunks": draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)),
            "dtype": draw(DTYPES), "seed": draw(SEEDS)}


def linear_stream(c, api, ex) -> dict:
    """Every step of a new LinearState over the example's chunks: its output, state and counts."""
    state, got = api.LinearState(), {}
    B, H, Dk, Dv = ex["batch"], ex["heads"], ex["head_dim"], ex["v_dim"]
    for step, T in enumerate(ex["chunks"], start=1):
        s = ex["seed"] + 10 * step
        q, k = (envelope.tensor(ex, s + j, B, H, T, Dk, device=c.device) for j in (0, 1))
        v = envelope.tensor(ex, s + 2, B, H, T, Dv, device=c.device)
        decay = torch.sigmoid(envelope.tensor({**ex, "scale": 1.0, "strided": False}, s + 3, B, H, T,
                                              device=c.device))
        out = snap(c.call(state.step, q, k, v, decay))
        got[f"step {step} (+{T})"] = {"out": out, "state": snap(state.state), "seen": state.seen,
                                      "nbytes()": state.nbytes()}
    return got
