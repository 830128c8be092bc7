"""Runs for kata 19's checks of ``MLAttention``.

The layer is built by its README's names and shapes and given seeded weights (each drawn from the
seed and the parameter's name, so the reference and the learner's layer hold the same numbers). It
is driven over chunks of tokens with ``Recorder``, the checks' own latent cache: a dict of
concatenated tensors that notes what each ``update`` was handed, so the layer's checks do not lean
on the learner's ``LatentKVCache`` and can see the latent and the rotary key the layer stores.
``flops_of`` counts the FLOPs of the matrix products torch runs (2 per multiply-add).
"""
from __future__ import annotations

import math
import zlib

import torch
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from grader.checks.support import envelope
from grader.checks.support.common import DTYPES, SEEDS, chunks, randn
from grader.engine import Failure, report


@st.composite
def layers(draw, min_calls: int = 1, decode: bool = False):
    """A layer's sizes (heads, widths: N, R, V and C unlike one another and hidden / heads), the calls'
    token counts, each call's path (naive or absorbed) and where the positions start."""
    heads = draw(st.integers(1, 4))
    total = draw(st.integers(1, 6))
    lengths = chunks(total, draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    lengths += [1] * draw(st.integers(max(0, min_calls - len(lengths)), 3 if decode else 2))
    return {"batch": draw(st.integers(1, 2)), "hidden": draw(st.sampled_from([8, 12, 16])), "heads": heads,
            "rank": draw(st.sampled_from([4, 6, 10])), "nope": draw(st.sampled_from([2, 3, 4])),
            "rope": draw(st.sampled_from([2, 4, 6])), "v": draw(st.sampled_from([2, 3, 5])),
            "q_rank": draw(st.sampled_from([None, 6])), "base": draw(st.sampled_from([None, 100.0])),
            "lengths": lengths, "absorbed": [draw(st.booleans()) for _ in lengths],
            "start": draw(st.sampled_from([0, 5, 40])), "layer": draw(st.integers(0, 2)),
            "dtype": draw(DTYPES), "seed": draw(SEEDS)}


def shapes(ex: dict) -> dict[str, tuple[int, ...]]:
    """Every parameter of the README's table, by its state-dict name."""
    H, hidden, C, N, R, V = ex["heads"], ex["hidden"], ex["rank"], ex["nope"], ex["rope"], ex["v"]
    q = {"q_proj.weight": (H * (N + R), hidden)} if ex["q_rank"] is None else {
        "q_a_proj.weight": (ex["q_rank"], hidden), "q_a_layernorm.weight": (ex["q_rank"],),
        "q_b_proj.weight": (H * (N + R), ex["q_rank"])}
    return {**q, "kv_a_proj_with_mqa.weight": (C + R, hidden), "kv_a_layernorm.weight": (C,),
            "kv_b_proj.weight": (H * (N + V), C), "o_proj.weight": (hidden, H * V)}


def described(ex: dict) -> str:
    return (f"MLAttention(hidden_size={ex['hidden']}, n_heads={ex['heads']}, kv_lora_rank={ex['rank']}, "
            f"qk_nope_dim={ex['nope']}, qk_rope_dim={ex['rope']}, v_head_dim={ex['v']}, q_lora_rank={ex['q_rank']})")


def build(api, ex: dict, device):
    """``api.MLAttention`` of the example's sizes on ``device`` in its dtype, with the seeded weights."""
    with torch.random.fork_rng(devices=[]):
        base = {} if ex["base"] is None else {"rope_base": ex["base"]}  # None: the default base
        layer = api.MLAttention(ex["hidden"], ex["heads"], ex["rank"], ex["nope"], ex["rope"], ex["v"],
                                q_lora_rank=ex["q_rank"], **base)
    layer = layer.to(device=device, dtype=ex["dtype"])
    held = dict(layer.state_dict())
    want = shapes(ex)
    for name, shape in want.items():
        got = held.get(name)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape:
            seen = "nothing" if got is None else f"shape {tuple(got.shape)}"
            raise Failure(f"{described(ex)} has {seen} under `{name}`, expected shape {shape} (the README's table: "
                          "transformers' names, so a DeepseekV3Attention state dict loads as it is)",
                          ("parameter", name, None if got is None else tuple(got.shape)))
    extra = sorted(set(held) - set(want))
    if extra:
        raise Failure(f"{described(ex)}'s state dict also holds {', '.join(extra)}: a DeepseekV3Attention state dict "
                      "(attention_bias=False) would not load as it is", ("extra", tuple(extra)))
    with torch.no_grad():
        for name in want:
            p = layer.get_parameter(name)
            drawn = ex["seed"] * 7919 + zlib.crc32(name.encode()) % 100003
            scale = 0.1 if name.endswith("norm.weight") else 1 / math.sqrt(p.shape[-1])
            value = randn(drawn, *p.shape, dtype=p.dtype, device=p.device, scale=scale)
            p.copy_(value + 1 if name.endswith("norm.weight") else value)
    return layer


def inputs(ex: dict, device):
    """x (B, T, hidden) and positions (B, T): row b's positions start at ``start + 3b``."""
    total = sum(ex["lengths"])
    x = envelope.tensor(ex, ex["seed"] + 1, ex["batch"], total, ex["hidden"], device=device)
    rows = torch.arange(ex["batch"], device=device)[:, None] * 3 + ex["start"]  # (B, 1)
    return x, rows + torch.arange(total, device=device)  # (B, T)


class Recorder:
    """The checks' latent cache: per layer the concatenated latents and rotary keys; ``handed`` notes
    (layer, c_kv, k_pe) of every update, copied. Empty, it is false (it has a length, as transformers' caches do)."""

    def __init__(self):
        self.held: dict = {}
        self.handed: list = []

    def __len__(self):  # like transformers' caches it has a length, so an empty one is false: test `is None`
        return sum(c.shape[1] for c, _ in self.held.values())

    def update(self, layer, c_kv, k_pe):
        if not (isinstance(c_kv, torch.Tensor) and isinstance(k_pe, torch.Tensor) and c_kv.dim() == k_pe.dim() == 3):
            raise Failure(f"the layer called cache.update({layer!r}, {report.describe(c_kv)}, {report.describe(k_pe)}); "
                          "expected the latents (B, T, kv_lora_rank) and rotary keys (B, T, qk_rope_dim)",
                          ("update", report.describe(c_kv), report.describe(k_pe)))
        self.handed.append((layer, c_kv.detach().clone(), k_pe.detach().clone()))
        if layer in self.held:
            old_c, old_k = self.held[layer]
            if old_c.shape[2] != c_kv.shape[2] or old_k.shape[2] != k_pe.shape[2]:
                raise Failure("the layer handed cache.update widths that changed between calls",
                              ("update", "widths"))
            c_kv, k_pe = torch.cat([old_c, c_kv], 1), torch.cat([old_k, k_pe], 1)
        self.held[layer] = (c_kv.detach().clone(), k_pe.detach().clone())
        return self.held[layer]


def spans(lengths):
    start = 0
    for n in lengths:
        yield start, n
        start += n


def chunked(api, ctx, ex: dict, record: bool = True) -> dict:
    """The example's calls through one layer and a ``Recorder``, then one uncached forward over all tokens."""
    layer, (x, pos) = build(api, ex, ctx.device), inputs(ex, ctx.device)
    cache, seen = Recorder(), {}
    for (start, n), flag in zip(spans(ex["lengths"]), ex["absorbed"]):
        what = f"{'absorbed' if flag else 'naive'} call with {n} token(s) after {start}"
        seen[f"output of the {what}"] = ctx.call(layer, x[:, start:start + n], pos[:, start:start + n], cache,
                                                 **call_options(ex["layer"], flag))
        if record and cache.handed:
            _, c_kv, k_pe = cache.handed[-1]
            seen[f"c_kv handed to cache.update by the {what}"] = c_kv
            seen[f"k_pe handed to cache.update by the {what}"] = k_pe
    if not cache.handed and ex["lengths"]:
        raise Failure("the layer never called cache.update(layer, c_kv, k_pe) on the cache it was given",
                      ("update", "never"))
    seen["layer numbers handed to cache.update"] = [h[0] for h in cache.handed]
    seen["output of one uncached forward over all the tokens"] = ctx.call(layer, x, pos, absorbed=ex["absorbed"][0])
    return seen


def call_options(layer: int, absorbed: bool) -> dict:
    """forward's layer and absorbed, each left to its default (0, True) where it has that value."""
    return {**({"layer": layer} if layer else {}), **({} if absorbed else {"absorbed": False})}


def flops_of(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` and the FLOPs of the matrix products torch ran inside it."""
    counter = FlopCounterMode(display=False)
    with counter:
        result = fn(*args, **kwargs)
    return result, counter.get_total_flops()


def projection_flops(ex: dict) -> int:
    """FLOPs of one new token's projections: q (direct or through q_lora_rank), kv_a_proj_with_mqa, o_proj."""
    H, hidden, C, N, R, V = ex["heads"], ex["hidden"], ex["rank"], ex["nope"], ex["rope"], ex["v"]
    q = hidden * H * (N + R) if ex["q_rank"] is None else ex["q_rank"] * (hidden + H * (N + R))
    return 2 * (q + hidden * (C + R) + H * V * hidden)


def own_tensors(module: nn.Module) -> list[tuple[str, int]]:
    """(name, bytes) of tensors a module keeps in plain attributes (parameters and buffers left out)."""
    found = []

    def walk(name, value, depth):
        if isinstance(value, torch.Tensor):
            found.append((name, value.numel() * value.element_size()))
        elif depth < 3 and isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(f"{name}[{i}]", item, depth + 1)
        elif depth < 3 and isinstance(value, dict):
            for key, item in value.items():
                walk(f"{name}[{key!r}]", item, depth + 1)

    for sub_name, sub in module.named_modules():
        for key, value in vars(sub).items():
            if key not in ("_parameters", "_modules", "_buffers"):
                walk(f"{sub_name + '.' if sub_name else ''}{key}", value, 0)
    return found
