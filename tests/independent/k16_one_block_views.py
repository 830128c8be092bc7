"""Kata 16 written from the README alone, another way: every layer's K and V packed into one
contiguous block (2L, 1, Hkv, P, D) whose rows are the messages (contiguous views of one buffer);
the decode side receives straight into the rows of such a block, then hands the model a cache that
starts from it. The header is read as a named tuple of its eight fields."""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

HEADER_LEN = 8
MAGIC = 0x4B563136
VERSION = 1
DTYPE_CODES = {torch.float32: 1, torch.float64: 2, torch.float16: 3, torch.bfloat16: 4}
SIZES = ("n_layers", "seq_len", "n_kv_heads", "head_dim")


class _Fields(NamedTuple):
    magic: int
    version: int
    n_layers: int
    seq_len: int
    n_kv_heads: int
    head_dim: int
    code: int
    last: int


def encode_header(*, n_layers, seq_len, n_kv_heads, head_dim, dtype):
    given = dict(zip(SIZES, (n_layers, seq_len, n_kv_heads, head_dim)))
    for name, value in given.items():
        if type(value) is not int or value < 1:
            raise ValueError(f"{name} should be an int >= 1, not {value!r}")
    if not isinstance(dtype, torch.dtype) or dtype not in DTYPE_CODES:
        raise ValueError(f"dtype should be float32, float64, float16 or bfloat16, not {dtype!r}")
    return torch.tensor(_Fields(MAGIC, VERSION, *given.values(), DTYPE_CODES[dtype], 0), dtype=torch.int64)


def decode_header(header):
    if not isinstance(header, torch.Tensor) or header.dtype != torch.int64 or header.shape != (HEADER_LEN,):
        raise ValueError(f"header should be an int64 tensor of 8 fields, not {header!r}")
    f = _Fields(*header.tolist())
    dtypes = {code: dtype for dtype, code in DTYPE_CODES.items()}
    if f.magic != MAGIC or f.version != VERSION or f.last != 0 or f.code not in dtypes:
        raise ValueError(f"header {list(f)} is not a version-{VERSION} KV header")
    if min(f.n_layers, f.seq_len, f.n_kv_heads, f.head_dim) < 1:
        raise ValueError(f"header announces a size below 1: {list(f)}")
    return {"n_layers": f.n_layers, "seq_len": f.seq_len, "n_kv_heads": f.n_kv_heads, "head_dim": f.head_dim,
            "dtype": dtypes[f.code]}


def kv_messages(layers):
    if not isinstance(layers, (list, tuple)) or not layers:
        raise ValueError(f"layers should be a non-empty list of (K, V), not {layers!r}")
    flat = []
    for i, pair in enumerate(layers):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"layers[{i}] should be a pair (K, V)")
        flat.extend(pair)
    first = flat[0]
    for x in flat:
        if (not isinstance(x, torch.Tensor) or x.ndim != 4 or x.shape[0] != 1 or x.shape != first.shape
                or x.dtype != first.dtype):
            raise ValueError("layers: every K and V should be (1, Hkv, P, D) like layer 0's K")
    block = torch.stack([x.to("cpu") for x in flat])  # (2L, 1, Hkv, P, D), one contiguous buffer
    return list(block.unbind(0))  # each row a contiguous (1, Hkv, P, D) view of it


def _peer(name, value, group):
    me, size = dist.get_rank(group), dist.get_world_size(group)
    if type(value) is not int or value == me or not 0 <= value < size:
        raise ValueError(f"{name} should be another rank of the group (0 … {size - 1}, not {me}), not {value!r}")
    return value


class _Cache:
    def __init__(self, layers=None):
        self.kv = dict(enumerate(layers or []))

    def update(self, layer, k, v):
        if layer in self.kv:
            K, V = self.kv[layer]
            k, v = torch.cat([K, k], dim=2), torch.cat([V, v], dim=2)  # (1, Hkv, S + T, D)
        self.kv[layer] = (k, v)
        return k, v


class _StreamingCache(_Cache):
    def __init__(self, dst, group):
        super().__init__()
        self.dst, self.group, self.inflight = dst, group, []

    def update(self, layer, k, v):
        K, V = super().update(layer, k, v)
        for message in kv_messages([(K, V)]):
            self.inflight.append((message, dist.isend(message, self.dst, group=self.group)))
        return K, V


@torch.no_grad()
def prefill_worker(model, prompt, *, dst=1, group=None, layerwise=False):
    V = model.config.vocab_size
    if (not isinstance(prompt, list) or not prompt
            or any(type(t) is not int or not 0 <= t < V for t in prompt)):
        raise ValueError(f"prompt should be a non-empty list of ids below {V}, not {prompt!r}")
    dst = _peer("dst", dst, group)
    if type(layerwise) is not bool:
        raise ValueError(f"layerwise should be True or False, not {layerwise!r}")
    cfg, P = model.config, len(prompt)
    header = encode_header(n_layers=cfg.num_hidden_layers, seq_len=P, n_kv_heads=cfg.num_key_value_heads,
                           head_dim=cfg.head_dim, dtype=model.dtype)
    if layerwise:
        dist.send(header, dst, group=group)
    cache = _StreamingCache(dst, group) if layerwise else _Cache()
    ids = torch.tensor([prompt], device=model.device)
    logits = model(ids, position_ids=torch.arange(P, device=model.device)[None], cache=cache)
    first = int(torch.argmax(logits[0, -1]))
    messages = kv_messages([cache.kv[i] for i in range(cfg.num_hidden_layers)])
    if layerwise:
        for _, work in cache.inflight:
            work.wait()
    else:
        for message in [header, *messages]:
            dist.send(message, dst, group=group)
    dist.send(torch.tensor([first], dtype=torch.int64), dst, group=group)
    kv_bytes = sum(m.numel() for m in messages) * messages[0].element_size()
    return {"first_token": first, "kv_bytes": kv_bytes, "messages": 2 * cfg.num_hidden_layers + 2}


def _receive_prompt(model, src, group):
    header = torch.zeros(HEADER_LEN, dtype=torch.int64)
    dist.recv(header, src, group=group)
    h, cfg = decode_header(header), model.config
    for key, want in (("n_layers", cfg.num_hidden_layers), ("n_kv_heads", cfg.num_key_value_heads),
                      ("head_dim", cfg.head_dim)):
        if h[key] != want:
            raise ValueError(f"header announces {key} {h[key]}, the model has {want}")
    if h["dtype"] != model.dtype:
        raise ValueError(f"model is {model.dtype}, the header announces {h['dtype']}")
    block = torch.empty(2 * h["n_layers"], 1, h["n_kv_heads"], h["seq_len"], h["head_dim"], dtype=h["dtype"])
    for row in block:  # contiguous rows of one fresh buffer, in message order
        dist.recv(row, src, group=group)
    first = torch.zeros(1, dtype=torch.int64)
    dist.recv(first, src, group=group)
    block = block.to(model.device)
    layers = [(block[2 * i], block[2 * i + 1]) for i in range(h["n_layers"])]
    return _Cache(layers), h["seq_len"], int(first)


@torch.no_grad()
def decode_worker(model, max_new_tokens, *, src=0, group=None, eos_token_id=None):
    if type(max_new_tokens) is not int or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens should be an int >= 0, not {max_new_tokens!r}")
    src = _peer("src", src, group)
    cache, P, token = _receive_prompt(model, src, group)
    tokens = []
    while len(tokens) < max_new_tokens:
        tokens.append(token)
        if token == eos_token_id and eos_token_id is not None or len(tokens) == max_new_tokens:
            break
        at = torch.tensor([[P + len(tokens) - 1]], device=model.device)
        logits = model(torch.tensor([[token]], device=model.device), position_ids=at, cache=cache)
        token = int(torch.argmax(logits[0, -1]))
    return tokens
