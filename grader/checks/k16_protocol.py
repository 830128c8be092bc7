"""Kata 16's first checks (task 1): the header and ``kv_messages``, pure functions checked in this
process against the reference and against the README's layout. ``grader.checks.k16`` adds the
checks of the workers to the same list."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks.k16_peers import CODES, MAGIC, VERSION
from grader.checks.k16_runs import DTYPES
from grader.checks.support.common import SEEDS, expect_value_error, randn
from grader.engine import Checks

CHECKS = Checks("16")
FIELDS = ("n_layers", "seq_len", "n_kv_heads", "head_dim")


# -- task 1: the header and the messages ----------------------------------------------------------------
def _view(h: torch.Tensor, how: str | None) -> torch.Tensor:
    """The header as decode_header receives it: a copy, or the same values as a view (README: a view is a
    header like any other) — ``offset``: a slice starting 3 elements into a longer buffer; ``strided``:
    every second element of one."""
    if h.dim() != 1:
        return h.clone()
    if how == "offset":
        return torch.cat([torch.full((3,), -7, dtype=h.dtype), h.clone()])[3:]
    if how == "strided":
        return torch.stack([h.clone(), torch.full_like(h, -7)], 1)[:, 0]  # stride 2
    return h.clone()


def _header_run(api, ex):
    h = api.encode_header(n_layers=ex["layers"], seq_len=ex["seq_len"], n_kv_heads=ex["kv"], head_dim=ex["dim"],
                          dtype=DTYPES[ex["dtype"]])
    back = api.decode_header(_view(h, ex.get("view"))) if isinstance(h, torch.Tensor) else None
    plain = {k: str(v).split(".")[-1] if isinstance(v, torch.dtype) else v for k, v in back.items()} \
        if isinstance(back, dict) else back
    return {"header": h, "decoded": plain}


@CHECKS.add("encode_header lays out the README's eight int64 fields; decode_header reads them back",
            uses="encode_header")
def header_round_trip(ctx):
    def body(c, ex):
        got = _header_run(c.t, ex)
        code = {d: k for k, d in CODES.items()}[DTYPES[ex["dtype"]]]
        want = [MAGIC, VERSION, ex["layers"], ex["seq_len"], ex["kv"], ex["dim"], code, 0]
        h = got["header"]
        if not isinstance(h, torch.Tensor) or h.dtype != torch.int64 or h.device.type != "cpu" or h.tolist() != want:
            c.fail(f"encode_header should give the int64 CPU tensor {want} (magic, version, n_layers, seq_len, "
                   f"n_kv_heads, head_dim, dtype code, 0); got {h!r}", ex, ("header", repr(h)))
        c.differential(ex, _header_run, "the header and what decode_header reads from it")

    ctx.case({"layers": 2, "seq_len": 5, "kv": 2, "dim": 8, "dtype": "float64"}, body)
    ctx.case({"layers": 1, "seq_len": 1, "kv": 1, "dim": 1, "dtype": "bfloat16"}, body)  # every size at its bound
    ctx.case({"layers": 80, "seq_len": 131072, "kv": 8, "dim": 128, "dtype": "float16"}, body)
    ctx.case({"layers": 3, "seq_len": 7, "kv": 4, "dim": 16, "dtype": "float32", "view": "offset"}, body)
    ctx.case({"layers": 3, "seq_len": 7, "kv": 4, "dim": 16, "dtype": "bfloat16", "view": "strided"}, body)
    ctx.forall(st.fixed_dictionaries({"layers": st.integers(1, 64), "seq_len": st.integers(1, 5000),
                                      "kv": st.integers(1, 16), "dim": st.integers(1, 256),
                                      "dtype": st.sampled_from(sorted(DTYPES))}), body, max_examples=8)


def _bad_headers():
    good = [MAGIC, VERSION, 2, 5, 2, 8, 2, 0]
    def t(values, dtype=torch.int64):
        return torch.tensor(values, dtype=dtype)
    return [("an int32 header", t(good, torch.int32)), ("7 fields", t(good[:7])), ("9 fields", t(good + [0])),
            ("a wrong magic", t([MAGIC + 1] + good[1:])), ("version 2", t(good[:1] + [2] + good[2:])),
            ("n_layers 0", t(good[:2] + [0] + good[3:])), ("seq_len -1", t(good[:3] + [-1] + good[4:])),
            ("n_kv_heads 0", t(good[:4] + [0] + good[5:])), ("head_dim 0", t(good[:5] + [0] + good[6:])),
            ("dtype code 9", t(good[:6] + [9, 0])), ("a last field of 1", t(good[:7] + [1])),
            ("a list", list(good)), ("a (1, 8) tensor", t([good]))]


@CHECKS.add("bad header fields and malformed headers raise ValueError naming them", uses="decode_header")
def header_rejects_bad_input(ctx):
    def body(c, ex):
        base = {"n_layers": 2, "seq_len": 5, "n_kv_heads": 2, "head_dim": 8, "dtype": torch.float32}
        for name in FIELDS:
            for bad in (0, -1, 2.0, True):
                expect_value_error(c, c.t.encode_header, **{**base, name: bad}, what=f"encode_header with {name}={bad!r}",
                                   names=(name,), example=ex)
        for bad in (torch.int64, torch.complex64, "float32"):
            expect_value_error(c, c.t.encode_header, **{**base, "dtype": bad}, what=f"encode_header with dtype={bad!r}",
                               names=("dtype",), example=ex)
        for what, header in _bad_headers():
            expect_value_error(c, c.t.decode_header, header, what=f"decode_header of {what}", names=("header",),
                               example=ex)

    ctx.case({"seed": 0}, body)


def _layers(ex, device="cpu"):
    """(K, V) per layer, (1, Hkv, P, D); ``strided``: transposed views of (1, P, Hkv, D) tensors."""
    L, H, P, D, dtype = ex["layers"], ex["kv"], ex["seq_len"], ex["dim"], DTYPES[ex["dtype"]]
    out = []
    for i in range(L):
        pair_ = []
        for j in range(2):
            x = randn(ex["seed"] * 31 + 2 * i + j, 1, P, H, D, dtype=dtype, device=device)
            pair_.append(x.transpose(1, 2) if ex.get("strided") else x.transpose(1, 2).contiguous())
        out.append(tuple(pair_))
    return out


def _messages_run(api, ex):
    got = api.kv_messages(_layers(ex))
    if not isinstance(got, list):
        return got
    return [{"tensor": m, "contiguous": m.is_contiguous(), "device": m.device.type}
            if isinstance(m, torch.Tensor) else m for m in got]


@CHECKS.add("kv_messages: K0, V0, K1, V1, … as contiguous CPU tensors (1, Hkv, P, D) in the cache's dtype",
            uses="kv_messages")
def messages_layout(ctx):
    def body(c, ex):
        c.differential(ex, _messages_run, "the messages of the layers, in order, each with its layout")

    base = {"layers": 2, "kv": 2, "seq_len": 3, "dim": 4, "dtype": "float64", "seed": 1}
    ctx.case(base, body)
    ctx.case({**base, "strided": True}, body)  # as projections make them: not contiguous
    ctx.case({**base, "layers": 3, "kv": 16, "seq_len": 260, "dim": 2, "dtype": "float32", "seed": 2}, body)
    for half in ("bfloat16", "float16"):
        ctx.case({**base, "dtype": half, "strided": True, "seed": 3}, body)
    ctx.forall(st.fixed_dictionaries({"layers": st.integers(1, 3), "kv": st.integers(1, 4),
                                      "seq_len": st.integers(1, 9), "dim": st.integers(1, 8), "seed": SEEDS,
                                      "dtype": st.sampled_from(["float32", "float64"]),
                                      "strided": st.booleans()}), body, max_examples=8)


@CHECKS.add("kv_messages refuses an empty list, a broken pair and layers that differ, naming layers",
            uses="kv_messages")
def messages_reject_bad_input(ctx):
    def body(c, ex):
        k = randn(1, 1, 2, 3, 4)
        tries = [("an empty list", []), ("None", None), ("a pair of one tensor", [(k,)]), ("a 3-D K", [(k[0], k[0])]),
                 ("V shorter than K", [(k, k[:, :, :2])]), ("a second layer of another dtype", [(k, k), (k.float(), k.float())]),
                 ("a second layer with more tokens", [(k, k), (randn(2, 1, 2, 4, 4),) * 2]),
                 ("batch 2", [(randn(3, 2, 2, 3, 4),) * 2]), ("a list in place of V", [(k, [1.0])]),
                 ("a triple (K, V, K)", [(k, k, k)]), ("a 5-D K and V", [(randn(4, 1, 1, 2, 3, 4),) * 2])]
        for what, layers in tries:
            expect_value_error(c, c.t.kv_messages, layers, what=f"kv_messages with {what}", names=("layers",), example=ex)

    ctx.case({"seed": 0}, body)


@CHECKS.add("the header and the messages are CPU tensors whatever device the cache is on (gloo sends CPU tensors)",
            uses="kv_messages")
def keeps_the_device(ctx):
    def body(c, ex):
        layers = _layers(ex, device=c.device)
        got = c.t.kv_messages(layers)
        want = [x.cpu() for pair_ in layers for x in pair_]
        if not isinstance(got, list) or len(got) != len(want) or any(
                not isinstance(m, torch.Tensor) or m.device.type != "cpu" or not torch.equal(m, w)
                for m, w in zip(got, want)):
            c.fail(f"kv_messages of a cache on {c.device} should give CPU copies of K0, V0, …; got "
                   f"{[(getattr(m, 'device', m), getattr(m, 'shape', None)) for m in got] if isinstance(got, list) else got}",
                   ex, ("device",))

    ctx.case({"layers": 2, "kv": 2, "seq_len": 3, "dim": 4, "dtype": "float32", "seed": 4}, body)
