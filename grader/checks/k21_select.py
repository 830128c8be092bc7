"""Hidden checks of kata 21, tasks 1 and 2: which tokens H2O and SnapKV keep, and SnapKV's scores.

Kept index sets are integers: they are compared exactly with the reference, on scores full of exact
ties and of float64 near-ties (``NEAR``: distinct in float64, merged by a cast to float32), so the
README's tie rule (the lower index wins) and "compare the scores as given" both decide results.
SnapKV's float scores are judged against the reference run in float64 on the same inputs.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks.support import envelope
from grader.checks.support.common import DTYPES, SEEDS, expect_value_error
from grader.engine import Checks, report

CHECKS = Checks("21")
NEAR = 1e-12  # float64 resolves it next to 1; float32 does not
SCORE_KINDS = ("ties", "near", "noise")


def drawn_scores(ex: dict, device, S: int | None = None) -> torch.Tensor:
    """Scores (B, H, S) of the example's kind: small integers (exact ties), integers plus multiples of
    NEAR (float64 near-ties), or noise; as a transposed view when the example is strided."""
    S = ex["S"] if S is None else S
    shape = (ex["batch"], ex["heads"], S)
    g = torch.Generator().manual_seed(ex["seed"])
    if ex["kind"] == "noise":
        return envelope.tensor(ex, ex["seed"], *shape, device=device)
    base = torch.randint(0, 3, shape, generator=g).to(torch.float64)
    if ex["kind"] == "near":
        base = base + NEAR * torch.randint(0, 3, shape, generator=g)
    x = base.transpose(1, 2).contiguous().transpose(1, 2) if ex.get("strided") else base
    return x.to(device=device, dtype=ex["dtype"])


@st.composite
def keep_cases(draw, window_least: int = 0):
    S = draw(st.integers(1, 14))
    budget = draw(st.integers(max(1, window_least + 1), S + 2))
    lo = window_least
    kind = draw(st.sampled_from(SCORE_KINDS))
    dtype = torch.float64 if kind == "near" else draw(DTYPES)
    return {"batch": draw(st.integers(1, 2)), "heads": draw(st.integers(1, 3)), "S": S, "budget": budget,
            "tail": draw(st.integers(lo, budget - (1 if window_least else 0))), "kind": kind, "dtype": dtype,
            "seed": draw(SEEDS)}


def _kept(c, api, ex, fn: str):
    scores = drawn_scores(ex, c.device)
    got = c.call(getattr(api, fn), scores, ex["budget"], ex["tail"])
    return {f"{fn}(scores, budget={ex['budget']}, {'recent' if fn == 'h2o_keep' else 'window'}={ex['tail']})": got}


# (scores, budget, recent) -> kept, worked out by hand.
H2O_PINNED = [
    ([3.1, 0.2, 0.9, 1.7, 0.1, 0.4, 2.2, 0.3, 0.5, 0.1], 6, 2, [0, 2, 3, 6, 8, 9]),  # the README's picture
    ([0.5, 0.9, 0.5, 0.9, 0.1], 3, 0, [0, 1, 3]),  # the two 0.9s, then the older 0.5
    ([1.0, 1.0, 1.0, 1.0, 1.0], 3, 1, [0, 1, 4]),  # all tied: the oldest, then the recent one
    ([1.0, 1.0 + NEAR, 0.5], 1, 0, [1]),  # a float64 near-tie decides
    ([0.2, 0.1, 0.3], 5, 2, [0, 1, 2]),  # fewer tokens than the budget: all of them
    ([0.2, 0.1, 0.3, 0.0], 4, 0, [0, 1, 2, 3]),  # exactly the budget
    ([9.0, 8.0, 1.0, 2.0, 3.0], 3, 3, [2, 3, 4]),  # budget == recent: a plain window, whatever the scores
    ([0.0, 0.0, 5.0, 0.0], 1, 1, [3]),  # one token: the newest
    ([5.0, 0.0, 0.0, 9.0, 0.0], 2, 0, [0, 3]),  # no recent window: the two best
]
SNAP_PINNED = [
    ([0.3, 0.1, 0.7, 0.2], 4, 2, [0, 2, 4, 5]),  # 2 best of the prefix, then the window 4, 5
    ([0.5, 0.5, 0.5], 3, 1, [0, 1, 3]),  # ties: the older prefix tokens
    ([0.5, 0.5 + NEAR, 0.5], 2, 1, [1, 3]),  # a float64 near-tie decides
    ([0.4, 0.2], 8, 3, [0, 1, 2, 3, 4]),  # all of a short prompt
    ([], 2, 1, [0]),  # a prompt that is all window
]


def _pinned(ctx, table, fn: str, tail: str):
    def body(c, ex):
        scores = torch.tensor([[ex["scores"]]], dtype=torch.float64, device=c.device)
        got = c.call(getattr(c.t, fn), scores, ex["budget"], ex["tail"])
        want = torch.tensor([[ex["kept"]]], dtype=torch.long, device=c.device)
        problem = report.compare(want, got, "kept indices")
        if problem:
            c.fail(f"{fn}(scores={ex['scores']}, budget={ex['budget']}, {tail}={ex['tail']}) should keep {ex['kept']}"
                   f"\n  {problem}", ex, got)

    for scores, budget, t, kept in table:
        ctx.case({"scores": scores, "budget": budget, "tail": t, "kept": kept, "dtype": torch.float64, "seed": 0}, body)


WIDE_KEEP = {"batch": 2, "heads": 3, "S": 9, "budget": 5, "tail": 2, "kind": "noise", "dtype": torch.float32, "seed": 5}
LARGE_KEEP = {"batch": 1, "heads": 16, "S": 300, "budget": 100, "tail": 20}


@CHECKS.add("h2o_keep keeps the recent tokens and the best scored of the rest, ties to the older token",
            uses="h2o_keep")
def h2o_keep_matches(ctx):
    _pinned(ctx, H2O_PINNED, "h2o_keep", "recent")
    ctx.forall(keep_cases(), lambda c, ex: c.differential(ex, lambda api, e: _kept(c, api, e, "h2o_keep")),
               max_examples=40)
    envelope.run(ctx, WIDE_KEEP, ("large", "half", "strided"), lambda c, ex: c.differential(
        ex, lambda api, e: _kept(c, api, e, "h2o_keep")), large=LARGE_KEEP)


@CHECKS.add("snapkv_keep keeps the best scored prefix tokens and the whole window, ties to the older token",
            uses="snapkv_keep")
def snapkv_keep_matches(ctx):
    _pinned(ctx, SNAP_PINNED, "snapkv_keep", "window")
    ctx.forall(keep_cases(window_least=1), lambda c, ex: c.differential(
        ex, lambda api, e: _kept(c, api, e, "snapkv_keep")), max_examples=40)
    envelope.run(ctx, {**WIDE_KEEP, "budget": 6}, ("large", "half", "strided"), lambda c, ex: c.differential(
        ex, lambda api, e: _kept(c, api, e, "snapkv_keep")), large={**LARGE_KEEP, "tail": 32})


@CHECKS.add("the indices h2o_keep and snapkv_keep return are the caller's to overwrite", uses="h2o_keep")
def keep_results_are_the_callers(ctx):
    def body(c, ex):
        scores = torch.tensor([[[0.3, 0.1, 0.2], [0.1, 0.2, 0.3]]], dtype=torch.float64, device=c.device)
        for fn, args in (("h2o_keep", (5, 1)), ("h2o_keep", (2, 1)), ("snapkv_keep", (5, 1)), ("snapkv_keep", (3, 1))):
            call = f"{fn}(scores, {args[0]}, {args[1]})"
            got, want = c.call(getattr(c.t, fn), scores, *args), getattr(c.ref, fn)(scores, *args)
            if report.compare(want, got) is None:
                got[0, 0] = -7  # the caller writes into head 0's row only
                if report.compare(want[0, 1], got[0, 1]) is not None:
                    c.fail(f"{call}: writing -7 into head 0's row of the result changed head 1's row to "
                           f"{got[0, 1].tolist()}: the rows share memory (an expanded view?); return a tensor of "
                           "its own", ex, ("shared rows", call))
            again = c.call(getattr(c.t, fn), scores, *args)
            problem = report.compare(want, again, f"{call} again")
            if problem:
                c.fail(f"{call}, its result overwritten by the caller, then again\n  {problem}", ex, again)

    ctx.case({"seed": 0}, body)


# -- snapkv_scores ---------------------------------------------------------------------------------

@st.composite
def score_cases(draw):
    S = draw(st.integers(1, 14))
    kv = draw(st.integers(1, 3))
    return {"batch": draw(st.integers(1, 2)), "kv_heads": kv, "q_heads": kv * draw(st.sampled_from([1, 2, 4])),
            "S": S, "W": draw(st.integers(1, S)), "head_dim": draw(st.sampled_from([2, 4, 8])),
            "kernel_size": draw(st.sampled_from([None, 1, 3, 5, 7])), "dtype": draw(DTYPES), "seed": draw(SEEDS)}


def _snap_scores(c, api, ex):
    q = envelope.tensor(ex, ex["seed"], ex["batch"], ex["q_heads"], ex["W"], ex["head_dim"], device=c.device)
    k = envelope.tensor(ex, ex["seed"] + 1, ex["batch"], ex["kv_heads"], ex["S"], ex["head_dim"], device=c.device)
    size = {} if ex["kernel_size"] is None else {"kernel_size": ex["kernel_size"]}
    return {"snapkv_scores(q_window, keys" + "".join(f", kernel_size={v}" for v in size.values()) + ")":
            c.call(api.snapkv_scores, q, k, **size)}


# The pinned case: one query head, one key head, W = 1, keys that make the vote easy to follow by hand.
# The query (1, 0) against keys (0,0) (1,0) (0,0) (0,0) (0,0) and itself (0,0): logits 0 1 0 0 0 | 0, so the
# weights are e/(e+5) for key 1 and 1/(e+5) elsewhere; pooling of width 3 averages each with its neighbours.
def _hand_pooled() -> torch.Tensor:
    e = torch.exp(torch.tensor(1.0, dtype=torch.float64))
    w = torch.tensor([1.0, e, 1.0, 1.0, 1.0], dtype=torch.float64) / (e + 5)
    padded = torch.cat([torch.zeros(1, dtype=torch.float64), w, torch.zeros(1, dtype=torch.float64)])
    return ((padded[:-2] + padded[1:-1] + padded[2:]) / 3).view(1, 1, 5)


@CHECKS.add("snapkv_scores: the window's causal softmax over every key, averaged, pooled, one score per KV head",
            uses="snapkv_scores")
def snapkv_scores_match(ctx):
    def pinned(c, ex):
        q = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64, device=c.device) * 2 ** 0.5  # sqrt(D) undone
        keys = torch.zeros(1, 1, 6, 2, dtype=torch.float64, device=c.device)
        keys[0, 0, 1, 0] = 1.0
        got = c.call(c.t.snapkv_scores, q, keys, kernel_size=3)
        problem = report.compare(_hand_pooled().to(c.device), got, "scores")
        if problem:
            c.fail("snapkv_scores of one window query (1, 0)·sqrt(2) over keys 0 (1,0) 0 0 0 and its own 0, "
                   f"kernel_size=3: softmax over all 6 keys, the 5 prefix columns, each averaged with its "
                   f"neighbours (zeros past the ends, divided by 3)\n  {problem}", ex, got)

    ctx.case({"dtype": torch.float64, "seed": 0}, pinned)
    for S, W in ((3, 3), (1, 1)):  # a prompt that is all window: nothing to score
        ctx.case({"batch": 2, "kv_heads": 1, "q_heads": 2, "S": S, "W": W, "head_dim": 4, "kernel_size": None,
                  "dtype": torch.float64, "seed": 2}, lambda c, ex: c.differential(ex, lambda api, e: _snap_scores(c, api, e)))
    ctx.forall(score_cases(), lambda c, ex: c.differential(ex, lambda api, e: _snap_scores(c, api, e)),
               max_examples=30)
    base = {"batch": 2, "kv_heads": 2, "q_heads": 4, "S": 12, "W": 4, "head_dim": 8, "kernel_size": None,
            "dtype": torch.float32, "seed": 9}
    envelope.run(ctx, base, ("large", "half", "strided", "magnitude"), lambda c, ex: c.differential(
        ex, lambda api, e: _snap_scores(c, api, e)),
        large={"batch": 1, "kv_heads": 4, "q_heads": 16, "S": 300, "W": 32, "head_dim": 16})


# -- bad input ---------------------------------------------------------------------------------------

def _bad_keep_calls(c):
    s = torch.rand(1, 2, 6, dtype=torch.float64, device=c.device)
    table = []
    for fn, tail in (("h2o_keep", "recent"), ("snapkv_keep", "window")):
        f = fn
        table += [
            (f"{fn} with scores of shape (2, 6)", f, (s[0], 3, 1), ("scores",)),
            (f"{fn} with scores of shape (1, 1, 2, 6)", f, (s[None], 3, 1), ("scores",)),
            (f"{fn} with long scores", f, (s.long(), 3, 1), ("scores",)),
            (f"{fn} with a list as scores", f, (s.tolist(), 3, 1), ("scores",)),
            (f"{fn} with budget=0", f, (s, 0, 0), ("budget",) if fn == "h2o_keep" else ("budget", "window")),
            (f"{fn} with budget=2.5", f, (s, 2.5, 1), ("budget",)),
            (f"{fn} with {tail}=-1", f, (s, 3, -1), (tail,)),
            (f"{fn} with {tail}=1.5", f, (s, 3, 1.5), (tail,)),
            (f"{fn} with {tail}=4 above budget=3", f, (s, 3, 4), (tail, "budget")),
        ]
    table += [("snapkv_keep with budget=3 equal to window=3", "snapkv_keep", (s, 3, 3), ("budget", "window")),
              ("snapkv_keep with window=0", "snapkv_keep", (s, 3, 0), ("window",))]
    return table


def _bad_score_calls(c):
    q = torch.rand(1, 4, 2, 8, dtype=torch.float64, device=c.device)
    k = torch.rand(1, 2, 6, 8, dtype=torch.float64, device=c.device)
    f = "snapkv_scores"
    return [
        ("snapkv_scores with q_window of shape (4, 2, 8)", f, (q[0], k), ("q_window",)),
        ("snapkv_scores with keys of shape (2, 6, 8)", f, (q, k[0]), ("keys",)),
        ("snapkv_scores with keys of a narrower head_dim", f, (q, k[..., :4]), ("keys", "q_window")),
        ("snapkv_scores with keys of a wider head_dim", f, (q, torch.cat([k, k], -1)), ("keys", "q_window")),
        ("snapkv_scores with keys of no head", f, (q, k[:, :0]), ("keys",)),
        ("snapkv_scores with keys of another batch", f, (q, torch.cat([k, k])), ("keys", "q_window")),
        ("snapkv_scores with 3 KV heads for 4 query heads", f, (q, torch.cat([k, k[:, :1]], 1)), ("keys", "q_window")),
        ("snapkv_scores with a window longer than the keys", f, (q, k[:, :, :1]), ("keys", "q_window")),
        ("snapkv_scores with an empty window", f, (q[:, :, :0], k), ("q_window",)),
        ("snapkv_scores with kernel_size=4", f, (q, k, 4), ("kernel_size",)),
        ("snapkv_scores with kernel_size=0", f, (q, k, 0), ("kernel_size",)),
        ("snapkv_scores with kernel_size=3.0", f, (q, k, 3.0), ("kernel_size",)),
    ]


def _rejects(ctx, calls, prefix: str):
    def body(c, ex):
        for what, fn, args, names in calls(c):
            if what.startswith(prefix):
                expect_value_error(c, getattr(c.t, fn), *args, what=what, names=names, example=ex)

    ctx.case({"seed": 0}, body)


@CHECKS.add("h2o_keep rejects bad input with a ValueError naming the argument", uses="h2o_keep")
def h2o_keep_rejects_bad_input(ctx):
    _rejects(ctx, _bad_keep_calls, "h2o_keep ")


@CHECKS.add("snapkv_keep rejects bad input with a ValueError naming the argument", uses="snapkv_keep")
def snapkv_keep_rejects_bad_input(ctx):
    _rejects(ctx, _bad_keep_calls, "snapkv_keep ")


@CHECKS.add("snapkv_scores rejects bad input with a ValueError naming the argument", uses="snapkv_scores")
def snapkv_scores_rejects_bad_input(ctx):
    _rejects(ctx, _bad_score_calls, "snapkv_scores ")
