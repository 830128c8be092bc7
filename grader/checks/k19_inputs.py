"""Inputs of kata 19's checks: the formulas' sizes, ``LatentKVCache`` programs, the bad calls each API
must refuse, and the device scenario."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks.support import envelope
from grader.checks.support.devices import module_on
from grader.checks.support.common import DTYPES, SEEDS, randn
from grader.engine import Failure

DEEPSEEK = {"model": "DeepSeek-V2 (60 layers) and V3 (61 layers): kv_lora_rank 512, qk_rope_dim 64, head_dim 128"}
CACHE = {"batch": 2, "rank": 6, "rope": 4, "updates": [(0, 3), (1, 2), (0, 1), (0, 2)], "dtype": torch.float32,
         "seed": 5}
LAYER = {"batch": 2, "hidden": 16, "heads": 4, "rank": 10, "nope": 4, "rope": 6, "v": 3, "q_rank": None,
         "base": None, "lengths": [5, 1, 1], "absorbed": [False, True, True], "start": 0, "layer": 1,
         "dtype": torch.float64, "seed": 3}


@st.composite
def formula_sizes(draw):
    return {"layers": draw(st.integers(1, 95)), "seq": draw(st.integers(0, 5000)), "rank": draw(st.integers(1, 1024)),
            "rope": draw(st.integers(1, 128)), "bytes": draw(st.sampled_from([1, 2, 4, 0.5, 0.75])),
            "batch": draw(st.integers(1, 8)), "head_dim": draw(st.integers(1, 256))}


@st.composite
def flops_sizes(draw, tensors: bool = False):
    if tensors:  # small, for split_kv_b's weights
        return {"heads": draw(st.integers(1, 4)), "nope": draw(st.integers(1, 4)), "v": draw(st.integers(1, 4)),
                "rank": draw(st.integers(1, 6)), "dtype": draw(DTYPES), "seed": draw(SEEDS)}
    return {"seq": draw(st.integers(1, 5000)), "heads": draw(st.integers(1, 128)), "rank": draw(st.integers(1, 1024)),
            "nope": draw(st.integers(1, 192)), "rope": draw(st.integers(1, 128)), "v": draw(st.integers(1, 192))}


@st.composite
def cache_programs(draw):
    updates = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3)), min_size=1, max_size=6))
    return {"batch": draw(st.integers(1, 3)), "rank": draw(st.integers(1, 6)), "rope": draw(st.sampled_from([2, 4])),
            "updates": updates, "dtype": draw(DTYPES), "seed": draw(SEEDS)}


def _pair(ex: dict, i: int, T: int, device):
    c_kv = envelope.tensor(ex, ex["seed"] * 13 + 2 * i, ex["batch"], T, ex["rank"], device=device)
    k_pe = envelope.tensor(ex, ex["seed"] * 13 + 2 * i + 1, ex["batch"], T, ex["rope"], device=device)
    return c_kv, k_pe


def run_program(api, ctx, ex: dict, keep: list | None = None) -> dict:
    """The example's updates on a fresh cache; after each, what it returned (copied at once), every layer's
    seq_len and nbytes(). The tensors handed in are overwritten after each call, as a caller reusing its
    buffers would. ``keep``: gets the cache."""
    cache, seen = api.LatentKVCache(), {}
    for i, (layer, T) in enumerate(ex["updates"]):
        c_kv, k_pe = _pair(ex, i, T, ctx.device)
        out = ctx.call(cache.update, layer, c_kv, k_pe)
        what = f"update #{i + 1} (layer {layer}, {T} token(s))"
        ok = isinstance(out, (tuple, list)) and len(out) == 2
        seen[f"what {what} returned"] = tuple(t.detach().clone() if isinstance(t, torch.Tensor) else t for t in out) if ok else out
        c_kv.fill_(float("nan")), k_pe.fill_(float("nan"))  # the caller reuses its buffers
        seen[f"seq_len(layer) for layers 0, 1, 2 after {what}"] = [ctx.call(cache.seq_len, n) for n in range(3)]
        seen[f"nbytes() after {what}"] = ctx.call(cache.nbytes)
    seen["seq_len() (layer 0 by default)"] = ctx.call(cache.seq_len)
    if keep is not None:
        keep.append(cache)
    return seen


def _storages(value, found: dict, depth: int = 0) -> None:
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        found[storage.data_ptr()] = storage.nbytes()
    elif depth < 5 and isinstance(value, (list, tuple, set)):
        for item in value:
            _storages(item, found, depth + 1)
    elif depth < 5 and isinstance(value, dict):
        for item in value.values():
            _storages(item, found, depth + 1)
    elif depth < 5 and hasattr(value, "__dict__") and not isinstance(value, type):
        _storages(vars(value), found, depth + 1)


def bytes_held(c, ex: dict) -> None:
    """The learner's cache, after the program, holds storages of exactly the bytes of its latents and keys."""
    kept: list = []
    run_program(c.t, c, ex, kept)
    lengths: dict = {}
    for layer, T in ex["updates"]:
        lengths[layer] = lengths.get(layer, 0) + T
    size = torch.empty(0, dtype=ex["dtype"]).element_size()
    want = sum(ex["batch"] * S * (ex["rank"] + ex["rope"]) * size for S in lengths.values())
    found: dict = {}
    _storages(kept[0], found)
    held, counted = sum(found.values()), c.call(kept[0].nbytes)
    if held != want or counted != want:
        c.fail(f"after the updates {ex['updates']} (layer, tokens) the cache holds tensors of {held} bytes and nbytes() "
               f"says {counted}; one latent ({ex['rank']}) and one rotary key ({ex['rope']}) a token of batch "
               f"{ex['batch']} in {str(ex['dtype']).removeprefix('torch.')} is {want} (mla_cache_bytes of each layer): "
               "hold each token once, with no head axis, no second copy and no spare room", ex,
               ("bytes", "more" if held > want else "less" if held < want else "same", counted == want))


def bad_cache_calls(ex: dict, device):
    """(what, updates, names): every update but the last is good; the last must raise ValueError naming one of names."""
    c, k = _pair(ex, 0, 3, device)
    c2, k2 = _pair(ex, 1, 1, device)
    wide, other = torch.cat([c2, c2], -1), torch.float64
    both = ("c_kv", "k_pe")
    return [
        ("a 2-D c_kv", [(0, c[0], k)], ("c_kv",)), ("a 2-D k_pe", [(0, c, k[0])], ("k_pe",)),
        ("c_kv as nested lists", [(0, c.tolist(), k)], ("c_kv",)), ("a 4-D k_pe", [(0, c, k[:, None])], ("k_pe",)),
        ("a 4-D c_kv of the right batch and tokens", [(0, c[..., None], k)], ("c_kv",)),
        ("a 4-D k_pe of the right batch and tokens", [(0, c, k[..., None])], ("k_pe",)),
        ("k_pe with one token fewer than c_kv", [(0, c, k[:, :2])], both),
        ("k_pe of another batch size", [(0, c, torch.cat([k, k]))], both),
        ("k_pe in another dtype", [(0, c, k.to(other))], both),
        ("a wider c_kv than the layer holds", [(0, c, k), (0, wide, k2)], ("c_kv",)),
        ("a wider k_pe than the layer holds", [(0, c, k), (0, c2, torch.cat([k2, k2], -1))], ("k_pe",)),
        ("another batch size than the layer holds", [(0, c, k), (0, torch.cat([c2, c2]), torch.cat([k2, k2]))], both),
        ("another dtype than the layer holds", [(0, c, k), (0, c2.to(other), k2.to(other))], both),
        ("layer -1", [(-1, c, k)], ("layer",)), ("layer '0'", [("0", c, k)], ("layer",)),
    ]


def bad_forward_calls(x: torch.Tensor, pos: torch.Tensor):
    return [("x missing the batch axis", (x[0], pos), ("x",)), ("x with an extra axis", (x[:, :, None], pos), ("x",)), ("x wider than hidden_size", (torch.cat([x, x], -1), pos), ("x",)),
            ("float positions", (x, pos.double()), ("positions",)), ("positions as nested lists", (x, pos.tolist()), ("positions",)),
            ("positions of one token fewer", (x, pos[:, :-1]), ("positions",)),
            ("positions without the batch axis", (x, pos[0]), ("positions",)),
            ("boolean positions", (x, pos > 2), ("positions",))]


def bad_sizes(api, ex: dict):
    good = {"hidden_size": ex["hidden"], "n_heads": ex["heads"], "kv_lora_rank": ex["rank"], "qk_nope_dim": ex["nope"],
            "qk_rope_dim": ex["rope"], "v_head_dim": ex["v"]}
    found = []
    for name, value in (("n_heads", 0), ("qk_rope_dim", 3), ("kv_lora_rank", 0), ("v_head_dim", 0), ("qk_nope_dim", 0),
                        ("q_lora_rank", 0), ("rope_base", 0.0), ("hidden_size", 0)):
        args = {**good, name: value}
        found.append((f"MLAttention with {name}={value!r}", lambda args=args: api.MLAttention(**args), (name,)))
    return found


def device_scenario(s):
    api = s.ctx.t
    cache = api.LatentKVCache()
    s.call("LatentKVCache.update", cache.update, 0, s.put(randn(1, 1, 3, 4, dtype=torch.float32)),
           s.put(randn(2, 1, 3, 2, dtype=torch.float32)))
    s.call("split_kv_b", api.split_kv_b, s.put(randn(3, 10, 4, dtype=torch.float32)), 2, 2, 3)
    layer = _module_on(s, lambda: api.MLAttention(16, 4, 10, 4, 6, 3, q_lora_rank=6))
    x = s.put(randn(4, 1, 4, 16, dtype=torch.float32))
    pos = s.put(torch.arange(4)[None])
    cache = api.LatentKVCache()
    s.call("MLAttention.forward, a naive prefill", layer, x[:, :3], pos[:, :3], cache, absorbed=False)
    s.call("MLAttention.forward, an absorbed decode step", layer, x[:, 3:], pos[:, 3:], cache)


def _module_on(s, make):
    try:
        return module_on(s, make)
    except ValueError as exc:
        raise Failure(f"building the layer raised ValueError({exc})", ("device", "build")) from None
