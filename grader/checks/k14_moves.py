"""What kata 14's checks see of an offloaded cache beyond its return values: the copies that cross
between host and device, the device memory the cache holds, and programs of update calls.

``Crossings`` is a dispatch mode that adds up the bytes of every copy from the host (the CPU) to the
device and back; with the device stand-in (``grader.checks.support.devices``) as the device, this
works on a CPU-only machine. ``device_bytes_held`` walks the cache object's attributes and sums the
storage of the device tensors it keeps. ``PlainCache`` is the default cache the outputs are compared
with: every layer's chunks concatenated, nothing moved.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from grader.checks.support import devices, protocol
from grader.checks.support.common import DTYPES, SEEDS, randn

aten = torch.ops.aten
COPIES = {aten._to_copy.default, aten.copy_.default, aten.copy.default}
STATS = ("h2d_bytes", "d2h_bytes", "misses")


class PlainCache:
    """The default cache: ``update`` concatenates along the sequence axis and returns the whole layer."""

    def __init__(self):
        self.layers: dict = {}

    def update(self, layer, k, v):
        if layer in self.layers:
            K, V = self.layers[layer]
            k, v = torch.cat([K, k], dim=2), torch.cat([V, v], dim=2)  # (B, Hkv, S + T, D)
        self.layers[layer] = (k, v)
        return k, v


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


class Crossings(TorchDispatchMode):
    """Adds up the bytes copied from the host (``cpu``) to ``device_type`` (``h2d``) and back (``d2h``)."""

    def __init__(self, device_type: str):
        super().__init__()
        self.device_type = device_type
        self.h2d = self.d2h = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            with self:  # an op made of others (met under inference_mode): count the copies inside it
                return func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
        if func in COPIES:
            if func is aten._to_copy.default:
                src, dst = args[0], kwargs.get("device") or args[0].device
            else:
                src, dst = args[1], args[0].device
            self._count(src, torch.device(dst).type)
        return func(*args, **kwargs)

    def _count(self, src, dst: str) -> None:
        if not isinstance(src, torch.Tensor):
            return
        if src.device.type == "cpu" and dst == self.device_type:
            self.h2d += _nbytes(src)
        elif src.device.type == self.device_type and dst == "cpu":
            self.d2h += _nbytes(src)


def device_bytes_held(cache, device_type: str) -> int:
    """Bytes of the distinct storages of the device tensors ``cache`` keeps in its attributes (in lists,
    tuples, dicts and objects of the cache's own module, a few levels deep)."""
    storages: dict = {}
    home = type(cache).__module__

    def walk(value, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            if value.device.type == device_type:
                storage = (value.inner if isinstance(value, devices.Remote) else value).untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        elif depth < 4 and isinstance(value, (list, tuple)):
            for item in value:
                walk(item, depth + 1)
        elif depth < 4 and isinstance(value, dict):
            for item in value.values():
                walk(item, depth + 1)
        elif depth < 4 and type(value).__module__ == home and hasattr(value, "__dict__"):
            walk(vars(value), depth + 1)

    walk(vars(cache), 0)
    return sum(storages.values())


def layer_bytes(cache, layer: int, shape: tuple, dtype: torch.dtype) -> int:
    """Bytes of one layer's K and V as the cache holds them: (B, Hkv, seq_len, D) each."""
    B, H, D = shape
    return 2 * B * H * cache.seq_len(layer) * D * torch.empty(0, dtype=dtype).element_size()


def excess_device_bytes(cache, device_type: str, shape: tuple, dtype) -> int:
    """Device bytes the cache holds beyond the K and V of the layers its ``resident()`` lists (0 is right)."""
    bound = sum(layer_bytes(cache, layer, shape, dtype) for layer in set(cache.resident()))
    return max(0, device_bytes_held(cache, device_type) - bound)


# -- programs of update calls ---------------------------------------------------------------------
@st.composite
def update_programs(draw, layers=(1, 4), max_calls=12, in_order=None):
    """Calls ``(layer, T)`` on one cache: whole forwards in order (layer 0 … L - 1, T the same within a
    forward), or, half the time, any layer in any order (repeats, skips)."""
    L = draw(st.integers(*layers))
    ordered = draw(st.booleans()) if in_order is None else in_order
    calls = []
    if ordered:
        for _ in range(draw(st.integers(1, max(1, max_calls // L)))):
            T = draw(st.integers(1, 3))
            calls += [(layer, T) for layer in range(L)]
    else:
        calls = [(draw(st.integers(0, L - 1)), draw(st.integers(1, 3))) for _ in range(draw(st.integers(1, max_calls)))]
    return {"layers": L, "batch": draw(st.integers(1, 2)), "heads": draw(st.integers(1, 3)),
            "head_dim": draw(st.sampled_from([2, 4])), "dtype": draw(DTYPES), "calls": calls,
            "strided": draw(st.booleans()), "seed": draw(SEEDS)}


def new_kv(ex: dict, n: int, T: int, device="cpu"):
    """The keys and values of the n-th call: (B, Hkv, T, D), as ``.transpose(1, 2)`` views when strided."""
    B, H, D, seed = ex["batch"], ex["heads"], ex["head_dim"], ex["seed"] + 17 * n
    if ex.get("strided"):
        return tuple(randn(seed + i, B, T, H, D, dtype=ex["dtype"], device=device).transpose(1, 2) for i in (0, 1))
    return tuple(randn(seed + i, B, H, T, D, dtype=ex["dtype"], device=device) for i in (0, 1))


def say(calls: list, n: int) -> str:
    """The program up to call n, as code."""
    shown = "; ".join(f"update({layer}, {T} token{'s' if T > 1 else ''})" for layer, T in calls[:n + 1])
    return f"call {n}: {shown}" if n < 6 else f"call {n}: ... {shown.split('; ', n - 3)[-1]}"


# -- state and aliasing programs ----------------------------------------------------------------------
def two_caches(api, ex):
    """Two caches driven in turn: each step's K, V, resident() and stats."""
    def make(api, ex, i):
        return api.OffloadedKVCache(2)

    def step(api, ex, cache, i, n):
        k, v = new_kv({**ex, "seed": ex["seed"] + 100 * i}, n, 1 + (n + i) % 2)
        K, V = cache.update(n % 2, k, v)
        return {"K": K, "V": V, "resident": cache.resident(), "stats": cache.stats}

    return protocol.interleaved(make, step, 6)(api, ex)


def callers_values(api, ex):
    """resident() and stats are the caller's: overwritten, the next read is unchanged; read twice, the same."""
    cache = api.OffloadedKVCache(2)
    for n in range(3):
        k, v = new_kv(ex, n, 2)
        cache.update(n % 2, k, v)
    seen = protocol.changed_by_caller(lambda a, e: cache.resident(), lambda a, e: cache.resident(),
                                      "resident()")(api, ex)
    stats = cache.stats
    for key in list(stats):  # the caller writes into the dict it was given
        stats[key] = protocol.SCRIBBLED_ID
    seen["stats, after the caller overwrote the dict it read before"] = cache.stats
    seen.update(protocol.twice(lambda a, e: (cache.resident(), cache.stats, cache.seq_len(1)), "the reads")(api, ex))
    return seen
