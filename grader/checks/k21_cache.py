"""Programs that drive kata 21's ScoredKVCache: drawn operation sequences, the inputs each step takes,
and a decode loop that attends through the cache.

Attention weights handed to ``observe`` are multiples of 1/64 (``dyadic``): exact in every float dtype,
and their float64 sums exact in any order, so which tokens a correct cache keeps never depends on
rounding, while ties between totals are frequent.
"""
from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from grader.checks.support import envelope
from grader.checks.support.common import DTYPES, SEEDS
from grader.engine import Failure, report
from grader.nn import apply_rope

BASES = st.sampled_from([None, 100.0])  # None: the default rope_base; 100 turns fast, so a wrong position shows


@st.composite
def programs(draw, dtypes=DTYPES):
    """A cache and its operations: a prefill, then observe, compress or nothing, then short decode steps each
    followed by observe or not, sometimes a reset and a second prompt."""
    budget = draw(st.integers(1, 6))
    ops = [("update", draw(st.integers(1, budget + 4)))]
    ops.append(draw(st.sampled_from([("observe",), ("compress", draw(st.integers(1, 4))), None])))
    for _ in range(draw(st.integers(0, 6))):
        ops.append(("update", draw(st.sampled_from([1, 1, 2]))))
        ops.append(draw(st.sampled_from([("observe",), ("observe",), None])))
    if draw(st.booleans()):
        ops += [("reset",), ("update", draw(st.integers(1, 4))), ("observe",)]
    return {"budget": budget, "recent": draw(st.integers(0, budget)), "rope_base": draw(BASES),
            "batch": draw(st.integers(1, 2)), "kv_heads": draw(st.integers(1, 2)), "group": draw(st.integers(1, 2)),
            "head_dim": draw(st.sampled_from([2, 4, 6])), "ops": [op for op in ops if op], "dtype": draw(dtypes),
            "seed": draw(SEEDS)}


def base(ex) -> dict:
    return {} if ex["rope_base"] is None else {"rope_base": ex["rope_base"]}


def raw_kv(ex, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Unrotated keys and values for every update of the program, (B, Hkv, total, D) each."""
    total = sum(op[1] for op in ex["ops"] if op[0] == "update")
    shape = (ex["batch"], ex["kv_heads"], total, ex["head_dim"])
    return tuple(envelope.tensor(ex, ex["seed"] + j, *shape, device=device) for j in (0, 1))


def dyadic(ex, step: int, shape, device) -> torch.Tensor:
    """Attention weights of a step: multiples of 1/64 in [0, 1), the same in every dtype."""
    g = torch.Generator().manual_seed(ex["seed"] * 1000 + step)
    return (torch.randint(0, 64, shape, generator=g).to(torch.float64) / 64).to(device=device, dtype=ex["dtype"])


def drawn_keep(ex, step: int, n: int, m: int, device) -> torch.Tensor:
    """long (B, Hkv, min(m, n)): distinct held indices per row, in a drawn (unsorted) order."""
    g = torch.Generator().manual_seed(ex["seed"] * 1000 + step)
    rows = [torch.randperm(n, generator=g)[:min(m, n)] for _ in range(ex["batch"] * ex["kv_heads"])]
    return torch.stack(rows).view(ex["batch"], ex["kv_heads"], -1).to(device)


def snap(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(snap(v) for v in value)
    return value


def pair(value, call: str):
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value
    raise Failure(f"{call} returned {report.describe(value)}, expected a pair (keys, values)",
                  ("returned", report.describe(value)))


def state(c, cache) -> dict:
    n = len(cache)
    got = {"len(cache)": n, "tokens_seen": cache.tokens_seen}
    if n:
        got["positions()"] = c.call(cache.positions)
        got["scores()"] = c.call(cache.scores)
    return got


def run_program(c, api, ex, visit=None) -> dict:
    """Every step of the example's operations through a new cache: what update returned, then the state.
    ``visit(step, op, returned, cache, raw, offset)`` sees each step (the oracle checks use it)."""
    cache = api.ScoredKVCache(ex["budget"], ex["recent"], **base(ex))
    K, V = raw_kv(ex, c.device)
    drawn, last_T, offset, got = 0, 0, 0, {}
    for step, op in enumerate(ex["ops"], start=1):
        returned = {}
        if op[0] == "update":
            last_T = op[1]
            out = snap(pair(c.call(cache.update, K[:, :, drawn:drawn + last_T], V[:, :, drawn:drawn + last_T]),
                            "update(k_new, v_new)"))
            returned = {"keys": out[0], "values": out[1]}
            drawn += last_T
        elif op[0] == "observe":
            shape = (ex["batch"], ex["kv_heads"] * ex["group"], last_T, len(cache))
            c.call(cache.observe, dyadic(ex, step, shape, c.device))
        elif op[0] == "compress":
            c.call(cache.compress, drawn_keep(ex, step, len(cache), op[1], c.device))
        else:
            c.call(cache.reset)
            offset = drawn
        if visit is not None:
            visit(step, op, returned, cache, (K, V), offset)
        got[f"step {step}: {label(op)}"] = {**returned, **state(c, cache)}
    return got


def label(op) -> str:
    return {"update": lambda: f"update with {op[1]} new token{'s' if op[1] > 1 else ''}",
            "observe": lambda: "observe(probs)", "compress": lambda: f"compress(keep) of {op[1]} per head",
            "reset": lambda: "reset()"}[op[0]]()


def true_keys(raw: torch.Tensor, positions: torch.Tensor, offset: int, base_: float) -> torch.Tensor:
    """The raw keys of the held tokens, each rotated at its own position: (B, Hkv, n, D) in float64."""
    B, H, n = positions.shape
    out = torch.empty(B, H, n, raw.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            pos = positions[b, h].cpu()
            out[b, h] = apply_rope(raw[b, h, pos + offset].cpu().double(), pos, base_)
    return out


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor):
    """Each query head reads its group's KV head; a query sees the held keys at positions up to its own.
    q (B, Hq, T, D), keys and values (B, Hkv, n, D), q_pos (T,), k_pos (B, Hkv, n) -> (out, probs)."""
    G = q.shape[1] // keys.shape[1]
    K, V = keys.repeat_interleave(G, 1), values.repeat_interleave(G, 1)  # (B, Hq, n, D)
    seen = k_pos.repeat_interleave(G, 1)[:, :, None, :] <= q_pos[None, None, :, None]  # (B, Hq, T, n)
    logits = (q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~seen, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return probs @ V, probs


def decode(c, api, ex) -> dict:
    """H2O through the cache: a prompt, then one token at a time; each step attends with the keys and
    values the cache returned (queries at true positions), then observes its own weights."""
    cache = api.ScoredKVCache(ex["budget"], ex["recent"], **base(ex))
    B, Hkv, D, Hq = ex["batch"], ex["kv_heads"], ex["head_dim"], ex["kv_heads"] * ex["group"]
    steps = [ex["prompt"]] + [1] * ex["decode"]
    total = sum(steps)
    K, V, Q = (envelope.tensor(ex, ex["seed"] + j, B, h, total, D, device=c.device) for j, h in
               ((0, Hkv), (1, Hkv), (2, Hq)))
    got, seen = {}, 0
    for i, T in enumerate(steps, start=1):
        keys, values = pair(c.call(cache.update, K[:, :, seen:seen + T], V[:, :, seen:seen + T]), "update")
        q_pos = torch.arange(seen, seen + T, device=c.device)
        q = apply_rope(Q[:, :, seen:seen + T], q_pos, ex["rope_base"] or 10000.0)
        out, probs = attend(q, keys, values, q_pos, c.call(cache.positions))
        seen += T
        got[f"step {i} ({T} token{'s' if T > 1 else ''}, {seen} seen): attention output"] = out
        c.call(cache.observe, probs)
        got[f"step {i}: after observe"] = state(c, cache)
    return got
