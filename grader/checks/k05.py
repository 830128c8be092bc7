"""Hidden checks of kata 05 — preallocation (a static KV cache).

Most checks draw a short program of operations (``update``, ``reset``), replay it on the learner's
cache and on a plain model (the chunks written to each layer, joined by torch.cat: the dynamic
cache of kata 01), and compare after every operation. The program is part of the printed input,
so a failure shows the operations that led to it, shrunk by Hypothesis to a short one.
"""
from __future__ import annotations

import traceback

import torch
from hypothesis import strategies as st

from grader.engine import report
from grader.checks.support import devices, envelope, protocol
from grader.checks.support.common import (DTYPES, SEEDS, attention, randn, value_error_names)
from grader.engine import Checks, Failure

CHECKS = Checks("05")
GARBAGE = 1e4  # scale of the junk written into unfilled slots before attending over whole buffers
KV = ("keys", "values")


@st.composite
def programs(draw, resets=False, overflow=False, max_ops=8):
    """Sizes plus ``ops``: ("update", layer, new tokens) or ("reset",). Updates fit unless ``overflow``."""
    n_layers, max_len = draw(st.integers(1, 3)), draw(st.integers(2, 8))
    # One (code, length) pair per operation: few choices, so failures shrink fast.
    steps = st.tuples(st.integers(0, 4 * n_layers - (not resets)), st.integers(1, 3))
    pos, ops, overflowed = [0] * n_layers, [], False
    for code, length in draw(st.lists(steps, min_size=1, max_size=max_ops)):
        layer = code % n_layers
        if code == 4 * n_layers:
            ops.append(("reset",))
            pos = [0] * n_layers
        elif overflow and pos[layer] + length > max_len:
            ops.append(("update", layer, length))
            overflowed = True
        elif pos[layer] < max_len:
            ops.append(("update", layer, min(length, max_len - pos[layer])))
            pos[layer] += ops[-1][2]
    if overflow and not overflowed:
        ops.append(("update", 0, max_len - pos[0] + 1))
    if resets and ("reset",) not in ops:  # a reset only lowers positions, so later updates still fit
        ops.insert(draw(st.integers(0, len(ops))), ("reset",))
    return {"n_layers": n_layers, "batch": draw(st.integers(1, 2)), "max_len": max_len,
            "n_kv_heads": draw(st.integers(1, 3)), "head_dim": draw(st.sampled_from([1, 2, 4])),
            "dtype": draw(DTYPES), "ops": ops, "seed": draw(SEEDS)}


def _kv(ex, index, length, device):
    shape = (ex["batch"], ex["n_kv_heads"], length, ex["head_dim"])
    return tuple(envelope.tensor(ex, ex["seed"] + 2 * index + j, *shape, device=device) for j in (0, 1))


class _Model:
    """The plain model: what each layer holds, as the list of (k, v) chunks written to it."""

    def __init__(self, ex, device):
        self.ex, self.device = ex, device
        self.chunks = [[] for _ in range(ex["n_layers"])]

    def seq_len(self, layer):
        return sum(k.shape[2] for k, _ in self.chunks[layer])

    def filled(self, layer):
        """(K, V) of ``layer``, each (B, H, seq_len, D): the concatenation of what was written."""
        ex = self.ex
        empty = torch.zeros(ex["batch"], ex["n_kv_heads"], 0, ex["head_dim"], dtype=ex["dtype"], device=self.device)
        return tuple(torch.cat([empty] + [kv[j] for kv in self.chunks[layer]], dim=2) for j in (0, 1))

    def mask(self, new_len, layer, width=None):
        """Row i is the token in slot past + i: it sees the filled slots up to its own, nothing else."""
        filled = self.seq_len(layer)
        rows = torch.arange(new_len, device=self.device)[:, None] + (filled - new_len)
        cols = torch.arange(self.ex["max_len"] if width is None else width, device=self.device)[None, :]
        return (cols < filled) & (cols <= rows)


def _new_cache(c, ex):
    """The learner's cache for ``ex``, its buffers checked for count, shape, dtype and device first."""
    n, shape = ex["n_layers"], (ex["batch"], ex["n_kv_heads"], ex["max_len"], ex["head_dim"])
    cache = c.t.StaticKVCache(n, ex["batch"], ex["max_len"], ex["n_kv_heads"], ex["head_dim"],
                              dtype=ex["dtype"], device=c.device)
    want = f"a tensor of shape {shape}, {str(ex['dtype']).replace('torch.', '')} on {c.device.type}"
    for name in KV:
        buffers = getattr(cache, name, None)
        if not isinstance(buffers, (list, tuple)) or len(buffers) != n:
            c.fail(f"StaticKVCache(...).{name} is {report.describe(buffers)}; expected a list of {n} buffers, "
                   "one per layer", ex, ("buffers", name, report.describe(buffers)))
        for layer, buf in enumerate(buffers):
            if report.describe(buf) != want:
                c.fail(f"StaticKVCache(...).{name}[{layer}] is {report.describe(buf)}; expected {want} "
                       "(batch, n_kv_heads, max_len, head_dim)", ex, ("buffer", name, report.describe(buf)))
    return cache


def _same(c, ex, where, expected, got):
    problem = report.compare(expected, got)
    if problem:
        c.fail(f"after {where}:\n  {problem}", ex, (where, got))


def _run(c, ex, watch):
    """Replay ``ex["ops"]`` on the learner's cache and on the model, comparing what ``watch`` names."""
    n, ops = ex["n_layers"], ex["ops"]
    cache, model = _new_cache(c, ex), _Model(ex, c.device)
    born = [(name, l, buf, buf.data_ptr()) for name in KV for l, buf in enumerate(getattr(cache, name))]
    if "mask" in watch:
        _same(c, ex, "construction", {"attention_mask(0)": model.mask(0, 0)},
              {"attention_mask(0)": cache.attention_mask(0)})
    for i, op in enumerate(ops):
        where = f"op {i + 1} of {len(ops)}, " + ("reset()" if op[0] == "reset" else
                                                  f"update(layer={op[1]}, k_new, v_new) with {op[2]} new token(s)")
        if op[0] == "reset":
            cache.reset()
            model.chunks = [[] for _ in range(n)]
            _same(c, ex, where, {"seq_len of every layer": [0] * n},
                  {"seq_len of every layer": [cache.seq_len(l) for l in range(n)]})
            if "mask" in watch:  # an empty layer: zero rows, every slot still a column
                _same(c, ex, where, {f"attention_mask(0, layer={l})": model.mask(0, l) for l in range(n)},
                      {f"attention_mask(0, layer={l})": cache.attention_mask(0, layer=l) for l in range(n)})
        elif model.seq_len(op[1]) + op[2] > ex["max_len"]:
            _overflow(c, ex, where, cache, op, _kv(ex, i, op[2], c.device))
        else:
            _update(c, ex, i, where, cache, model, op, watch)
        for name, l, buf, ptr in born if "identity" in watch else ():
            now = getattr(cache, name)[l]
            if now is not buf or now.data_ptr() != ptr:
                how = "is a new tensor" if now is not buf else "moved to new memory (data_ptr changed)"
                c.fail(f"after {where}: {name}[{l}] {how}; a static cache allocates its buffers once in __init__ "
                       "and writes into them in place (slice assignment or copy_), also across reset()",
                       ex, (where, f"{name}[{l}]", how))


def _update(c, ex, i, where, cache, model, op, watch):
    _, layer, length = op
    k, v = _kv(ex, i, length, c.device)
    p, n = model.seq_len(layer) + length, ex["n_layers"]
    shape = (ex["batch"], ex["n_kv_heads"], ex["max_len"], ex["head_dim"])
    try:
        got = c.call(cache.update, layer, k, v)
    except (Failure, NotImplementedError):
        raise
    except Exception as exc:  # name the operation: the input alone lists a dozen of them
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if c.target.owns(f.filename)]
        c.fail(f"{where}: the tokens fit ({p - length} of max_len={ex['max_len']} slots filled), but your update "
               f"raised {type(exc).__name__}: {exc}\n" + "".join(traceback.format_list(frames)).rstrip(), ex,
               (where, "raised", type(exc).__name__, str(exc)))
    model.chunks[layer].append((k, v))
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        c.fail(f"{where} returned {report.describe(got)}; expected (keys[{layer}], values[{layer}])", ex,
               (where, "returned", report.describe(got)))
    K, V = got
    if tuple(K.shape) != shape or tuple(V.shape) != shape:
        c.fail(f"{where} returned tensors of shapes {tuple(K.shape)} and {tuple(V.shape)}; expected the whole "
               f"buffers {shape} = (batch, n_kv_heads, max_len, head_dim), unfilled slots included", ex,
               (where, "shapes", tuple(K.shape), tuple(V.shape)))
    if "identity" in watch and (K is not cache.keys[layer] or V is not cache.values[layer]):
        c.fail(f"{where} returned other tensors than keys[{layer}] and values[{layer}]; update must return "
               "the layer's buffers themselves, the same objects every time", ex, (where, "returned other tensors"))
    if "contents" in watch:
        lens = [model.seq_len(l) for l in range(n)]
        want, got = {"seq_len of every layer": lens, "seq_len()": lens[0]}, {
            "seq_len of every layer": [cache.seq_len(l) for l in range(n)], "seq_len()": cache.seq_len()}
        for j, name in enumerate(KV):  # the returned buffer, then every layer's, up to its seq_len
            want[f"returned {name}[:, :, :{p}]"] = model.filled(layer)[j]
            got[f"returned {name}[:, :, :{p}]"] = (K, V)[j][:, :, :p]
            for l in range(n):
                want[f"{name}[{l}][:, :, :{lens[l]}]"] = model.filled(l)[j]
                got[f"{name}[{l}][:, :, :{lens[l]}]"] = getattr(cache, name)[l][:, :, :lens[l]]
        _same(c, ex, where, want, got)
    if "mask" in watch:
        other = (layer + 1) % n
        asks = [(length, layer), (p, layer), (min(1, model.seq_len(other)), other)]
        _same(c, ex, where, {f"attention_mask({t}, layer={l})": model.mask(t, l) for t, l in asks},
              {f"attention_mask({t}, layer={l})": cache.attention_mask(t, layer=l) for t, l in asks})
    if "attention" in watch:
        _attention(c, ex, i, where, cache, model, layer, length, K, V)


def _attention(c, ex, i, where, cache, model, layer, length, K, V):
    """Junk in the unfilled slots, then attention over the whole buffers with the learner's mask."""
    p, B, H, L, D = model.seq_len(layer), ex["batch"], ex["n_kv_heads"], ex["max_len"], ex["head_dim"]
    seed = ex["seed"] + 7919 * (i + 1)
    with torch.no_grad():  # slots p … L-1 are unfilled: the SPEC lets anything live there
        K[:, :, p:] = randn(seed, B, H, L - p, D, dtype=ex["dtype"], device=c.device, scale=GARBAGE)
        V[:, :, p:] = randn(seed + 1, B, H, L - p, D, dtype=ex["dtype"], device=c.device, scale=GARBAGE)
    mask = cache.attention_mask(length, layer=layer)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (length, L):
        c.fail(f"after {where}, attention_mask({length}, layer={layer}) returned {report.describe(mask)}; expected "
               f"a bool tensor of shape ({length}, {L}) = (new_len, max_len) covering the whole buffer", ex,
               (where, "mask", report.describe(mask)))
    q, what = randn(seed + 2, B, H, length, D, dtype=ex["dtype"], device=c.device), "attention with your mask"
    _same(c, ex, f"{where} (unfilled slots then filled with values of size ~{GARBAGE:g})",
          {what: attention(q, *model.filled(layer), model.mask(length, layer, width=p))},
          {what: attention(q, K, V, mask.to(c.device))})


def _overflow(c, ex, where, cache, op, kv):
    """An update that does not fit: CacheFullError naming the argument, nothing written, nothing moved."""
    layer, n = op[1], ex["n_layers"]
    before, lens = [t.clone() for t in (*cache.keys, *cache.values)], [cache.seq_len(l) for l in range(n)]
    what = f"{where}, after {lens[layer]} of max_len={ex['max_len']} slots are filled"
    try:
        c.call(cache.update, layer, *kv)
    except (Failure, NotImplementedError):
        raise
    except Exception as exc:
        error = exc
    else:
        c.fail(f"{what}: expected CacheFullError, your update raised nothing (the tokens do not fit)", ex,
               (where, "no error"))
    if not isinstance(error, c.t.CacheFullError):
        c.fail(f"{what}: expected CacheFullError, your update raised {type(error).__name__}: {error}", ex,
               (where, "raised", type(error).__name__))
    if not value_error_names(error, ("k_new", "v_new", "max_len")):
        c.fail(f"{what}: CacheFullError({str(error)!r}) should name k_new (or max_len)", ex, (where, "unnamed"))
    names, changed = [f"{name}[{l}]" for name in KV for l in range(n)], []
    for name, a, b in zip(names, (*cache.keys, *cache.values), before):
        diff = (a != b) & ~(a.isnan() & b.isnan())  # (B, H, L, D); NaN may well sit in unfilled slots
        if diff.any():
            changed.append(f"{name} slots {diff.any(-1).any(0).any(0).nonzero().flatten().tolist()}")
    if changed:
        c.fail(f"{what}: your update raised CacheFullError but had already written into {', '.join(changed)}; "
               "a failed update must change nothing, so check that the tokens fit before writing", ex,
               (where, "wrote", changed))
    lens_after = [cache.seq_len(l) for l in range(n)]
    if lens_after != lens:
        c.fail(f"{what}: your update raised CacheFullError but seq_len of the layers went from {lens} to "
               f"{lens_after}; a failed update must change nothing", ex, (where, "seq_len", lens_after))


# -- the checks, in the order of the README's tasks ------------------------------------------------------------


@st.composite
def sizes(draw):
    return {"n_layers": draw(st.integers(1, 3)), "batch": draw(st.integers(1, 2)), "max_len": draw(st.integers(1, 8)),
            "n_kv_heads": draw(st.integers(1, 3)), "head_dim": draw(st.sampled_from([1, 2, 4, 8])),
            "dtype": draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))}


@CHECKS.add("StaticKVCache allocates one key and one value buffer per layer, as asked", uses="StaticKVCache")
def buffers_as_asked(ctx):
    def body(c, ex):
        cache = _new_cache(c, ex)
        buffers = [*cache.keys, *cache.values]
        if len({b.data_ptr() for b in buffers}) != len(buffers):
            c.fail("two of keys[0 …], values[0 …] share memory; every layer needs its own key buffer and its own "
                   "value buffer", ex, ("shared memory",))
        _same(c, ex, "construction", {"seq_len of every layer": [0] * ex["n_layers"]},
              {"seq_len of every layer": [cache.seq_len(l) for l in range(ex["n_layers"])]})
        plain = c.t.StaticKVCache(ex["n_layers"], ex["batch"], ex["max_len"], ex["n_kv_heads"], ex["head_dim"])
        _same(c, ex, "StaticKVCache(...) without dtype or device", {"keys[0] dtype": "torch.float32", "on": "cpu"},
              {"keys[0] dtype": str(plain.keys[0].dtype), "on": plain.keys[0].device.type})

    ctx.forall(sizes(), body, max_examples=10)


@CHECKS.add("update writes at each layer's own position; seq_len counts per layer", uses="StaticKVCache.update")
def update_writes_per_layer(ctx):
    ctx.forall(programs(max_ops=10), lambda c, ex: _run(c, ex, ("contents",)), max_examples=20)
    envelope.run(ctx, WIDE, ("large", "half", "strided"), lambda c, ex: _run(c, ex, ("contents",)), large=LARGE)


@CHECKS.add("the buffers are allocated once: update and reset keep the same tensors and memory",
            uses="StaticKVCache.update")
def buffers_allocated_once(ctx):
    ctx.forall(programs(resets=True), lambda c, ex: _run(c, ex, ("identity",)), max_examples=12)


@CHECKS.add("attention_mask hides unfilled slots and later tokens, exactly", uses="StaticKVCache.attention_mask")
def attention_mask_exact(ctx):
    ctx.forall(programs(resets=True), lambda c, ex: _run(c, ex, ("mask",)), max_examples=15)


@CHECKS.add("attention over the whole buffers with the mask equals attention over the concatenated cache",
            uses="StaticKVCache.attention_mask")
def attention_over_whole_buffers(ctx):
    ctx.forall(programs(resets=True), lambda c, ex: _run(c, ex, ("attention",)), max_examples=15)
    envelope.run(ctx, WIDE, ("large", "magnitude"), lambda c, ex: _run(c, ex, ("attention",)), large=LARGE)


@CHECKS.add("an update that does not fit raises CacheFullError and writes nothing", uses="StaticKVCache.update")
def overflow_writes_nothing(ctx):
    def body(c, ex):
        if not issubclass(c.t.CacheFullError, ValueError):
            c.fail("CacheFullError must be a subclass of ValueError: class CacheFullError(ValueError)", ex,
                   ("CacheFullError base",))
        _run(c, ex, ("contents",))

    ctx.forall(programs(overflow=True), body, max_examples=15)


@CHECKS.add("reset empties every layer and keeps the buffers", uses="StaticKVCache.reset")
def reset_keeps_buffers(ctx):
    ctx.forall(programs(resets=True), lambda c, ex: _run(c, ex, ("contents", "identity")), max_examples=12)


@CHECKS.add("a long mixed run matches the plain model (updates, overflows, resets, masks)", uses="StaticKVCache")
def mixed_run(ctx):
    ctx.forall(programs(resets=True, overflow=True, max_ops=14),
               lambda c, ex: _run(c, ex, ("contents", "identity", "mask", "attention")), max_examples=12)


def _rejects(c, ex, what, names, fn, *args, **kwargs):
    """``fn(*args)`` must raise ValueError naming one of ``names``; a failure says which call it was."""
    try:
        exc = c.raises(ValueError, fn, *args, what=what, example=ex, **kwargs)
    except Failure as failure:  # the engine's observed value does not say which call; add it
        raise Failure(failure.message, (what, failure.observed)) from None
    if not value_error_names(exc, names):
        c.fail(f"{what} raised ValueError({str(exc)!r}); the message should name {' or '.join(names)}", ex,
               (what, "unnamed"))


@CHECKS.add("bad input raises ValueError naming the argument, and changes nothing", uses="StaticKVCache.update")
def rejects_bad_input(ctx):
    def body(c, ex):
        n, kv, wide = ex["n_layers"], ("k_new", "v_new"), lambda t, dim: torch.cat([t, t], dim)
        fewer = lambda t, dim: t.narrow(dim, 0, t.shape[dim] - 1)  # noqa: E731
        _rejects(c, ex, "StaticKVCache(...) with max_len=-1", ("max_len",), c.t.StaticKVCache,
                 n, ex["batch"], -1, ex["n_kv_heads"], ex["head_dim"], dtype=ex["dtype"], device=c.device)
        cache = _new_cache(c, ex)
        k, v = _kv(ex, 0, 1, c.device)
        cache.update(0, k, v)
        for what, names, fn, *args in [
            ("update(0, k_new without its head axis, v_new)", ("k_new",), cache.update, 0, k[:, 0], v),
            ("update(0, k_new, v_new with 5 axes)", ("v_new",), cache.update, 0, k, v[None]),
            ("update(0, k_new, v_new holding twice the tokens of k_new)", kv, cache.update, 0, k, wide(v, 2)),
            ("update(0, k_new, v_new) with twice the batch", kv, cache.update, 0, wide(k, 0), wide(v, 0)),
            ("update(0, k_new, v_new) with twice the KV heads", kv, cache.update, 0, wide(k, 1), wide(v, 1)),
            ("update(0, k_new, v_new) with twice the head_dim", kv, cache.update, 0, wide(k, 3), wide(v, 3)),
            ("update(0, k_new, v_new holding fewer tokens than k_new)", kv, cache.update, 0, k, v[:, :, :0]),
            ("update(0, k_new, v_new) with one batch row fewer", kv, cache.update, 0, fewer(k, 0), fewer(v, 0)),
            ("update(0, k_new, v_new) with one KV head fewer", kv, cache.update, 0, fewer(k, 1), fewer(v, 1)),
            ("update(0, k_new, v_new) with a head_dim one smaller", kv, cache.update, 0, fewer(k, 3), fewer(v, 3)),
            (f"update(layer={n}, ...) on a cache of {n} layer(s)", ("layer",), cache.update, n, k, v),
            ("update(layer=-1, ...)", ("layer",), cache.update, -1, k, v),
            (f"seq_len({n}) on a cache of {n} layer(s)", ("layer",), cache.seq_len, n),
            ("seq_len(-1)", ("layer",), cache.seq_len, -1),
            ("attention_mask(-1) with 1 token in layer 0", ("new_len",), cache.attention_mask, -1),
            ("attention_mask(2) with 1 token in layer 0", ("new_len",), cache.attention_mask, 2),
            (f"attention_mask(0, layer={n})", ("layer",), cache.attention_mask, 0, n),
            ("attention_mask(0, layer=-1)", ("layer",), cache.attention_mask, 0, -1),
            ("attention_mask(1.0), a float new_len", ("new_len",), cache.attention_mask, 1.0),
            ("update(layer=0.0, ...), a float layer", ("layer",), cache.update, 0.0, k, v),
            ("seq_len(0.0), a float layer", ("layer",), cache.seq_len, 0.0),
            ("update(0, k_new as a nested list, v_new)", ("k_new",), cache.update, 0, k.tolist(), v),
            ("update(0, k_new, None)", ("v_new",), cache.update, 0, k, None),
        ]:
            _rejects(c, ex, what, names, fn, *args)
            lens = [cache.seq_len(l) for l in range(n)]
            if lens != [1] + [0] * (n - 1):
                c.fail(f"after the rejected {what}, seq_len of the layers is {lens}; a rejected call must change "
                       f"nothing (expected {[1] + [0] * (n - 1)})", ex, (what, "changed", lens))
        # Another dtype: converting to the buffers' dtype or rejecting are both fine; anything else is not.
        other = torch.float64 if ex["dtype"] == torch.float32 else torch.float32
        k2, v2 = (t.to(other) for t in _kv(ex, 1, 1, c.device))
        try:
            cache.update(0, k2, v2)
        except ValueError:
            return
        K, V = cache.keys[0], cache.values[0]
        _same(c, ex, f"update(0, k_new, v_new) with k_new, v_new in {other} (convert or reject)",
              {"keys[0] dtype": str(ex["dtype"]), "keys[0][:, :, 1]": k2[:, :, 0].to(ex["dtype"]),
               "values[0][:, :, 1]": v2[:, :, 0].to(ex["dtype"])},
              {"keys[0] dtype": str(K.dtype), "keys[0][:, :, 1]": K[:, :, 1], "values[0][:, :, 1]": V[:, :, 1]})

    ctx.forall(programs(), body, max_examples=4)


@CHECKS.add("StaticKVCache rejects sizes that are not positive ints, naming the argument", uses="StaticKVCache")
def rejects_bad_sizes(ctx):
    def body(c, ex):
        good = {"n_layers": 2, "batch": 1, "max_len": 4, "n_kv_heads": 2, "head_dim": 2}
        for name in good:
            for bad in (0, -1, 2.0):  # 2.0: a float where an int is asked
                args = {**good, name: bad}
                what = f"StaticKVCache({', '.join(f'{k}={v!r}' for k, v in args.items())})"
                _rejects(c, ex, what, (name,), c.t.StaticKVCache, *args.values(), device=c.device)

    ctx.case({"seed": 0}, body)


# The envelope's base (two layers, a chunk, a decode step, a reset) and its large case: 16 heads, 300 slots.
WIDE = {"n_layers": 2, "batch": 2, "max_len": 8, "n_kv_heads": 2, "head_dim": 4, "dtype": torch.float32,
        "ops": [("update", 0, 3), ("update", 1, 2), ("update", 0, 1), ("reset",), ("update", 1, 4)], "seed": 8}
LARGE = {"batch": 1, "max_len": 300, "n_kv_heads": 16, "head_dim": 8,
         "ops": [("update", 0, 280), ("update", 1, 1), ("update", 0, 20), ("reset",), ("update", 1, 299)]}


# Worked by hand: each layer is filled in one update of exactly max_len tokens (the last slot fits),
# then one more token overflows a full layer; after a reset the same buffers take max_len tokens again.
EDGES = [{"n_layers": 2, "batch": 2, "max_len": 3, "n_kv_heads": 2, "head_dim": 2, "dtype": torch.float64,
          "ops": [("update", 0, 3), ("update", 0, 1), ("update", 1, 1), ("update", 1, 2), ("update", 1, 1),
                  ("reset",), ("update", 1, 3), ("update", 0, 2), ("update", 0, 1), ("update", 0, 1)], "seed": 3},
         {"n_layers": 1, "batch": 1, "max_len": 1, "n_kv_heads": 1, "head_dim": 4, "dtype": torch.float32,
          "ops": [("update", 0, 1), ("update", 0, 1), ("reset",), ("reset",), ("update", 0, 1)], "seed": 4}]


@CHECKS.add("edge states: an empty cache, an update that fills the last slot, a full cache, reset and refill",
            uses="StaticKVCache.update")
def full_and_empty_edges(ctx):
    for ex in EDGES:
        ctx.case(ex, lambda c, e: _run(c, e, ("contents", "identity", "mask", "attention")))


SIZES = {"n_layers": 2, "batch": 1, "max_len": 6, "n_kv_heads": 2, "head_dim": 4, "dtype": torch.float32}
TURNS = [(0, 2), (1, 3), (0, 1), (1, 1), (0, 2)]  # (layer, new tokens) of each instance's update, in turn


def _static(api, ex, device):
    return api.StaticKVCache(ex["n_layers"], ex["batch"], ex["max_len"], ex["n_kv_heads"], ex["head_dim"],
                             dtype=ex["dtype"], device=device)


def _filled(ctx, cache, layer, kv):
    """update(layer, k, v), as the filled slots of what it returned, with the layer's seq_len."""
    K, V = ctx.call(cache.update, layer, *kv)
    p = cache.seq_len(layer)
    return {"keys filled": K[:, :, :p], "values filled": V[:, :, :p], "seq_len": p}


@CHECKS.add("two caches share no storage, and a returned mask is the caller's", uses="StaticKVCache")
def caches_share_no_storage(ctx):
    def body(c, ex):
        def turn(api, e, cache, i, n):
            layer, length = TURNS[n]
            return _filled(c, cache, layer, _kv(e, 10 * n + i, length, c.device))
        c.differential(ex, protocol.interleaved(lambda api, e, i: _static(api, e, c.device), turn, len(TURNS)), "caches A and B, updated in turn")
        held = {}

        def first(api, e):
            held["A"], held["B"] = _static(api, e, c.device), _static(api, e, c.device)
            return _filled(c, held["A"], 0, _kv(e, 1, 3, c.device))
        c.differential(ex, protocol.kept(first, lambda api, e: _filled(c, held["B"], 0, _kv(e, 2, 4, c.device)),
                                         "the filled slots cache A returned", "cache B's update(0)"),
                       "cache A's returned buffers, held while another cache writes (two caches never share storage)")

        def mask(api, e):
            if "cache" not in held:
                held["cache"] = _static(api, e, c.device)
                c.call(held["cache"].update, 1, *_kv(e, 3, 4, c.device))
            return c.call(held["cache"].attention_mask, 3, layer=1)

        def fresh(program):
            def run(api, e):
                held.pop("cache", None)
                return program(api, e)
            return run
        c.differential(ex, fresh(protocol.twice(mask, "attention_mask(3, layer=1)")), "attention_mask twice")
        c.differential(ex, fresh(protocol.changed_by_caller(mask, mask, "attention_mask(3, layer=1) again")),
                       "attention_mask(3, layer=1), the mask overwritten by the caller, then asked again")

    ctx.case({**SIZES, "seed": 6}, body)


def _device_scenario(s):
    api, where = s.ctx.t, "StaticKVCache(2, 1, 6, 2, 4, device=<the test device>)"
    cache = s.call(where, api.StaticKVCache, 2, 1, 6, 2, 4, dtype=torch.float64, device=s.device)
    s.expect_on([cache.keys, cache.values], f"{where}.keys/.values", "holds")
    kv = [s.put(randn(i, 1, 2, 3, 4)) for i in range(4)]  # (B=1, Hkv=2, T=3, D=4)
    for layer in (0, 1):
        s.call(f"update({layer}, k_new, v_new) with 3 tokens", cache.update, layer, kv[0], kv[1])
    s.call("attention_mask(3)", cache.attention_mask, 3)
    s.call("update(0, k_new, v_new) with 1 token", cache.update, 0, kv[2][:, :, :1], kv[3][:, :, :1])
    s.call("attention_mask(1)", cache.attention_mask, 1)
    cache.reset()
    s.call("update(1, k_new, v_new) after reset()", cache.update, 1, kv[2], kv[3])
    s.call("attention_mask(2, layer=1) after reset()", cache.attention_mask, 2, layer=1)


@CHECKS.add("the cache lives on its device= and keeps every result there", uses="StaticKVCache")
def keeps_the_device(ctx):
    ctx.case({"n_layers": 2, "batch": 1, "max_len": 6, "n_kv_heads": 2, "head_dim": 4},
             lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))
