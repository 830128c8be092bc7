"""Programs for kata 09's checks: drawn sequences of ``update`` calls on several layers, the keys
and values they feed (keys with outlier channels), and the replay that checks the learner's
``QuantizedKVCache`` after every call against what the SPEC promises.

The replay never asks for particular codes (the rounding mode is free). It checks, for every
quantized group, that each element is within half a step of its input *and* lies on the grid
``zero + j * scale`` (j an integer in [0, 2**n_bits - 1]) with the group's own min and max;
the residual tail must come back bit for bit; ``nbytes`` must equal the SPEC's formula.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.engine import report
from grader.checks.support.common import DTYPES, SEEDS, randn
from grader.engine import Failure

EPS = {torch.float64: 2.0 ** -52, torch.float32: 2.0 ** -23, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}
D_CHOICES = {2: [4, 8], 4: [2, 4, 8], 8: [1, 3, 4, 8]}  # head widths, multiples of 8 // n_bits
R_CHOICES = {2: [4, 8], 4: [2, 4, 6], 8: [1, 3, 4, 5]}  # residual lengths, multiples of 8 // n_bits


@st.composite
def programs(draw, max_ops: int = 6, layers: tuple[int, int] = (1, 3)):
    """An example dict: cache sizes, dtype and ``ops``, a list of (layer, new tokens)."""
    n_bits = draw(st.sampled_from([2, 4, 8]))
    R = draw(st.sampled_from(R_CHOICES[n_bits]))
    n_layers = draw(st.integers(*layers))
    ops = draw(st.lists(st.tuples(st.integers(0, n_layers - 1), st.integers(1, 2 * R + 1)), min_size=1,
                        max_size=max_ops))
    return {"n_bits": n_bits, "residual_len": R, "layers": n_layers, "batch": draw(st.integers(1, 2)),
            "heads": draw(st.integers(1, 2)), "head_dim": draw(st.sampled_from(D_CHOICES[n_bits])),
            "dtype": draw(DTYPES), "ops": ops, "seed": draw(SEEDS)}


def stream(ex: dict, layer: int, total: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Every key and value ``layer`` will receive, (B, Hkv, total, D). Keys: outlier channels."""
    B, H, D, seed = ex["batch"], ex["heads"], ex["head_dim"], ex["seed"] + 101 * layer
    channel_scale = torch.ones(D, dtype=torch.float64)
    channel_scale[seed % D] = 25.0  # one outlier channel, as real keys have (and a shifted one)
    offset = torch.zeros(D, dtype=torch.float64)
    offset[(seed // 7) % D] = 8.0
    k = randn(seed, B, H, total, D) * channel_scale + offset
    v = randn(seed + 1, B, H, total, D)
    return k.to(device=device, dtype=ex["dtype"]), v.to(device=device, dtype=ex["dtype"])


def formula_nbytes(ex: dict, S: int) -> int:
    """The SPEC's bytes of one layer holding S tokens."""
    B, H, D, R, bits = ex["batch"], ex["heads"], ex["head_dim"], ex["residual_len"], ex["n_bits"]
    e = torch.empty(0, dtype=ex["dtype"]).element_size()
    group = 2 * B * H * R * D * bits // 8 + 2 * e * B * H * D + 2 * e * B * H * R
    return (S // R) * group + 2 * e * B * H * (S % R) * D


def grid_problem(x: torch.Tensor, got: torch.Tensor, dim: int, n_bits: int) -> tuple | None:
    """Whether ``got`` is a min-max quantization of ``x`` with statistics over ``dim``.

    None when it is; else (index, error, bound, why). The bound allows float rounding.
    """
    x64, g64 = x.detach().double().cpu(), got.detach().double().cpu()
    qmax = 2 ** n_bits - 1
    lo, hi = x64.amin(dim, keepdim=True), x64.amax(dim, keepdim=True)
    scale = (hi - lo) / qmax
    slack = 16 * EPS[x.dtype] * (x64.abs().amax(dim, keepdim=True) + hi - lo)  # float rounding
    error = (g64 - x64).abs()
    over = error > scale / 2 + slack
    steps = (g64 - lo) / torch.where(scale > 0, scale, torch.ones_like(scale))
    tol = slack / torch.where(scale > 0, scale, torch.ones_like(scale))
    off_grid = ((steps - steps.round()).abs() > tol) | (steps < -tol) | (steps > qmax + tol)
    off_grid &= (scale > 0).expand_as(steps)  # a constant slice only has to round-trip (caught by over)
    for bad, why in ((over, "farther than scale / 2 from the input"),
                     (off_grid, "not on the grid zero + j * scale of its slice (is it quantized at all?)")):
        if bad.any():
            index = tuple(int(i) for i in bad.nonzero()[0])
            bound = (scale / 2).expand_as(x64)[index].item()
            return index, error[index].item(), bound, why
    return None


TIE_UNITS = 4  # units of float32 (float64) in (x - zero) / scale: another order of the same operations


def codes_problem(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                  n_bits: int) -> tuple | None:
    """Whether ``codes`` are the README's ``round((x - zero) / scale)``, computed in float32 (float64 for
    float64 ``x``) from the given ``scale`` and ``zero``, clamped to [0, 2**n_bits - 1], wherever scale > 0.

    The rounding mode is free, so where that value lies within ``TIE_UNITS`` float32 units of a tie
    (… .5) either neighbour passes; everywhere else the code is exact. Where scale is 0 every code
    dequantizes to zero: a constant slice's codes 0 are judged by quantize_constant_slices, and a spread
    that underflows to scale 0 (float16 subnormals) leaves the code free. None when they are; else
    (index, got, expected, the value).
    """
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    qmax = 2 ** n_bits - 1
    s, z = scale.detach().cpu().to(work), zero.detach().cpu().to(work)
    positive = s > 0
    y = (x.detach().cpu().to(work) - z) / torch.where(positive, s, torch.ones_like(s))  # in work, as the README
    y = torch.where(positive.expand_as(y), y, torch.zeros_like(y)).double()
    nearest = y.round().clamp(0, qmax)
    below, above = y.floor().clamp(0, qmax), y.ceil().clamp(0, qmax)
    tie = ((y - y.floor()) - 0.5).abs() <= TIE_UNITS * EPS[work] * (y.abs() + 1)
    got = codes.detach().cpu().double()
    bad = ~((got == nearest) | (tie & ((got == below) | (got == above))) | ~positive.expand_as(got))
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        return index, int(got[index].item()), int(nearest[index].item()), y[index].item()
    return None


def trailing_exact(V: torch.Tensor, v_in: torch.Tensor) -> int:
    """How many of the last tokens of V equal the input bit for bit (all of B, Hkv, D)."""
    n = 0
    while n < V.shape[2] and torch.equal(V[:, :, V.shape[2] - 1 - n], v_in[:, :, V.shape[2] - 1 - n]):
        n += 1
    return n


class Replay:
    """Runs ``ex["ops"]`` (then R + 1 and 3R + 1 more tokens on the first layer used), checking every step.

    The first problem found is raised at the end, with ``observed`` = (what failed, the offending
    value, and every step's (S, tokens returned bit for bit, nbytes)), so a known mistake is recognised by
    its whole behaviour, not by one step that several mistakes share.
    """

    def __init__(self, ctx, ex: dict):
        self.ctx, self.ex = ctx, ex
        R, first = ex["residual_len"], ex["ops"][0][0]
        self.ops = list(ex["ops"]) + [(first, R + 1), (first, 3 * R + 1)]  # the tail: past R, then many groups
        totals = {}
        for layer, n in self.ops:
            totals[layer] = totals.get(layer, 0) + n
        self.inputs = {layer: stream(ex, layer, n, ctx.device) for layer, n in totals.items()}
        self.lens = {layer: 0 for layer in range(ex["layers"])}
        self.cache = ctx.t.QuantizedKVCache(n_bits=ex["n_bits"], residual_len=ex["residual_len"])
        self.problem: tuple | None = None
        self.flushes: list[tuple[int, int]] = []

    def note(self, step: int, what: str, observed: tuple) -> None:
        if self.problem is None:
            self.problem = (step, what, observed)

    def run(self) -> "Replay":
        for step, (layer, n) in enumerate(self.ops):
            start = self.lens[layer]
            k_all, v_all = self.inputs[layer]
            k_new, v_new = k_all[:, :, start:start + n], v_all[:, :, start:start + n]
            out = self.ctx.call(self.cache.update, layer, k_new, v_new)
            self.lens[layer] = S = start + n
            self.check_step(step, layer, out, k_all[:, :, :S], v_all[:, :, :S])
        if self.problem is not None:
            self.fail(*self.problem)
        return self

    def check_step(self, step, layer, out, k_in, v_in):
        ex, S, R = self.ex, k_in.shape[2], self.ex["residual_len"]
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            self.fail(step, f"update returned {report.describe(out)}; expected a pair (K, V)",
                      ("returned", report.describe(out)))
        want = tuple(k_in.shape)
        for name, t in zip("KV", out):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want or t.dtype != ex["dtype"]:
                self.fail(step, f"update returned {name} = {report.describe(t)}; expected the whole layer, "
                          f"{want} = (B, Hkv, S, D), in the inputs' dtype {ex['dtype']}", ("returned", name))
        K, V = out
        self.flushes.append((S, trailing_exact(V, v_in), self.cache.nbytes(layer)))
        Q = R * (S // R)
        if not (torch.equal(K[:, :, Q:], k_in[:, :, Q:]) and torch.equal(V[:, :, Q:], v_in[:, :, Q:])):
            self.note(step, f"the last S % R = {S - Q} token(s) (positions {Q} … {S - 1}) must come back bit "
                            "for bit: they wait in the full-precision residual", ("residual",))
        for g in range(S // R):
            part = slice(g * R, (g + 1) * R)
            for name, got, x, dim, how in (("keys", K, k_in, 2, "per channel: one scale and zero per (B, Hkv, D) "
                                            "over the group's R tokens"),
                                           ("values", V, v_in, 3, "per token: one scale and zero per (B, Hkv, "
                                            "token) over the D channels")):
                found = grid_problem(x[:, :, part], got[:, :, part], dim, ex["n_bits"])
                if found:
                    index, error, bound, why = found
                    at = list(index[:2]) + [g * R + index[2], index[3]]
                    detail = (f"error {error:.3g}, half a step {bound:.3g}" if why.startswith("farther")
                              else f"a step is {2 * bound:.3g}")
                    self.note(step, f"{name} of group {g} (positions {g * R} … {(g + 1) * R - 1}) at {at}: "
                                    f"{got[tuple(at)].item():.6g} (input {x[tuple(at)].item():.6g}) is {why} "
                                    f"({detail}); {name} are quantized {how}",
                              (name, got[:, :, part].detach().cpu()))
        self.check_counts(step, layer, S)

    def check_counts(self, step, layer, S):
        for other in range(self.ex["layers"]):
            seq_len = self.cache.seq_len(other)
            if seq_len != self.lens[other]:
                self.note(step, f"seq_len({other}) is {seq_len!r}, expected {self.lens[other]}", ("seq_len",))
        got, want = self.cache.nbytes(layer), formula_nbytes(self.ex, S)
        if got != want or isinstance(got, bool) or not isinstance(got, int):
            R = self.ex["residual_len"]
            self.note(step, f"nbytes({layer}) is {got!r}, expected {want}: {S // R} group(s) of packed codes "
                            f"(n_bits / 8 byte per code) + their scales and zeros, and {S % R} residual token(s)",
                      ("nbytes", tuple(self.cache.nbytes(lay) for lay in self.lens)))
        total = sum(formula_nbytes(self.ex, n) for n in self.lens.values())
        if self.cache.nbytes() != total:
            self.note(step, f"nbytes() is {self.cache.nbytes()!r}, expected {total}, the sum over the layers "
                            "(a layer never updated holds 0)", ("nbytes()", self.cache.nbytes()))

    def fail(self, step: int, what: str, observed: tuple):
        lines = []
        for i, (layer, n) in enumerate(self.ops[: step + 1]):
            tail = "   (the checks' extra step)" if i >= len(self.ex["ops"]) else ""
            lines.append(f"    {'→' if i == step else ' '} {i:2d}  update(layer={layer}, {n} new token(s)){tail}")
        head = {k: v for k, v in self.ex.items() if k != "ops"}
        raise Failure(f"on input {report.describe_input(head)}, the calls (→ marks the failing one):\n"
                      + "\n".join(lines) + f"\n  after call {step}: {what}",
                      observed=observed + (tuple(self.flushes),))
