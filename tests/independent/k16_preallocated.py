"""Kata 16 written from the README alone: the decode side preallocates its cache for the whole
generation and hands the model views of it; headers are filled field by field; the whole-cache
mode sends from a list built after the forward, the layer-wise one clones each layer as it comes."""
from __future__ import annotations

import torch
import torch.distributed as dist

HEADER_LEN = 8
MAGIC = 0x4B563136
VERSION = 1
DTYPE_CODES = {torch.float32: 1, torch.float64: 2, torch.float16: 3, torch.bfloat16: 4}
_BY_CODE = {v: k for k, v in DTYPE_CODES.items()}
_SIZES = ("n_layers", "seq_len", "n_kv_heads", "head_dim")


def _is_count(x) -> bool:
    return type(x) is int and x >= 1


def encode_header(*, n_layers, seq_len, n_kv_heads, head_dim, dtype):
    given = dict(n_layers=n_layers, seq_len=seq_len, n_kv_heads=n_kv_heads, head_dim=head_dim)
    for name in _SIZES:
        if not _is_count(given[name]):
            raise ValueError(f"{name} must be an int >= 1 (got {given[name]!r})")
    if not isinstance(dtype, torch.dtype) or dtype not in DTYPE_CODES:
        raise ValueError(f"dtype must be float32, float64, float16 or bfloat16 (got {dtype!r})")
    header = torch.zeros(HEADER_LEN, dtype=torch.long)
    header[0], header[1] = MAGIC, VERSION
    for i, name in enumerate(_SIZES):
        header[2 + i] = given[name]
    header[6] = DTYPE_CODES[dtype]
    return header


def decode_header(header):
    ok = isinstance(header, torch.Tensor) and header.dtype == torch.long and header.dim() == 1 and header.numel() == 8
    if not ok:
        raise ValueError(f"header must be an int64 tensor of 8 fields (got {header!r})")
    f = [int(x) for x in header]
    if f[0] != MAGIC:
        raise ValueError(f"header has magic {f[0]}, not {MAGIC}")
    if f[1] != VERSION:
        raise ValueError(f"header has version {f[1]}, not {VERSION}")
    if any(x < 1 for x in f[2:6]):
        raise ValueError(f"header sizes must be >= 1 (got {f[2:6]})")
    if f[6] not in _BY_CODE:
        raise ValueError(f"header dtype code {f[6]} is unknown")
    if f[7] != 0:
        raise ValueError(f"header last field must be 0 (got {f[7]})")
    out = dict(zip(_SIZES, f[2:6]))
    out["dtype"] = _BY_CODE[f[6]]
    return out


def kv_messages(layers):
    if not isinstance(layers, (list, tuple)) or not layers:
        raise ValueError("layers must be a non-empty list of (K, V)")
    ref = None
    msgs = []
    for n, item in enumerate(layers):
        if not (isinstance(item, (list, tuple)) and len(item) == 2
                and all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in item)):
            raise ValueError(f"layers[{n}] must be a pair of 4-D tensors")
        k, v = item
        ref = ref if ref is not None else (k.shape, k.dtype)
        for t in (k, v):
            if (t.shape, t.dtype) != ref or t.shape[0] != 1:
                raise ValueError(f"layers[{n}]: every K and V must be batch 1 with layer 0's shape and dtype")
        msgs += [k.cpu().contiguous(), v.cpu().contiguous()]
    return msgs


def _peer(name, value, group):
    me, size = dist.get_rank(group), dist.get_world_size(group)
    if type(value) is not int or value < 0 or value >= size or value == me:
        raise ValueError(f"{name} must be another rank of the group (got {value!r})")


class _Cache:
    """Grows by concatenation on the prefill side; sends layer l from update(l) when asked to."""

    def __init__(self, send_to=None, group=None):
        self.kv, self.send_to, self.group, self.handles = {}, send_to, group, []

    def update(self, layer, k, v):
        if layer in self.kv:
            k = torch.cat((self.kv[layer][0], k), dim=-2)
            v = torch.cat((self.kv[layer][1], v), dim=-2)
        self.kv[layer] = (k, v)
        if self.send_to is not None:
            for t in (k, v):
                own = t.detach().to("cpu", copy=True).contiguous()
                self.handles.append((dist.isend(own, self.send_to, group=self.group), own))
        return k, v


@torch.no_grad()
def prefill_worker(model, prompt, *, dst=1, group=None, layerwise=False):
    vocab = model.config.vocab_size
    if not isinstance(prompt, list) or not prompt or any(type(t) is not int or not 0 <= t < vocab for t in prompt):
        raise ValueError(f"prompt must be a non-empty list of token ids below {vocab}")
    _peer("dst", dst, group)
    if type(layerwise) is not bool:
        raise ValueError(f"layerwise must be a bool (got {layerwise!r})")
    c = model.config
    header = encode_header(n_layers=c.num_hidden_layers, seq_len=len(prompt), n_kv_heads=c.num_key_value_heads,
                           head_dim=c.head_dim, dtype=model.dtype)
    cache = _Cache(dst if layerwise else None, group)
    if layerwise:
        dist.send(header, dst, group=group)
    pos = torch.arange(len(prompt), device=model.device).unsqueeze(0)
    logits = model(torch.tensor(prompt, device=model.device).unsqueeze(0), position_ids=pos, cache=cache)
    first = logits[0, -1].argmax().item()
    msgs = kv_messages([cache.kv[i] for i in range(c.num_hidden_layers)])
    if layerwise:
        for handle, _ in cache.handles:
            handle.wait()
    else:
        for t in [header] + msgs:
            dist.send(t, dst, group=group)
    dist.send(torch.tensor([first]), dst, group=group)
    return {"first_token": first, "kv_bytes": sum(t.numel() * t.element_size() for t in msgs), "messages": len(msgs) + 2}


class _Preallocated:
    """Room for P + extra tokens per layer; update writes in place and returns views of the filled part."""

    def __init__(self, n_layers, shape, extra, dtype, device):
        b, h, p, d = shape
        self.k = [torch.empty(b, h, p + extra, d, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.empty_like(x) for x in self.k]
        self.filled = [0] * n_layers

    def update(self, layer, k, v):
        a, b = self.filled[layer], self.filled[layer] + k.shape[2]
        self.k[layer][:, :, a:b] = k
        self.v[layer][:, :, a:b] = v
        self.filled[layer] = b
        return self.k[layer][:, :, :b], self.v[layer][:, :, :b]


@torch.no_grad()
def decode_worker(model, max_new_tokens, *, src=0, group=None, eos_token_id=None):
    if type(max_new_tokens) is not int or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0 (got {max_new_tokens!r})")
    _peer("src", src, group)
    raw = torch.empty(HEADER_LEN, dtype=torch.long)
    dist.recv(raw, src, group=group)
    h, c = decode_header(raw), model.config
    for field, mine in (("n_layers", c.num_hidden_layers), ("n_kv_heads", c.num_key_value_heads),
                        ("head_dim", c.head_dim)):
        if h[field] != mine:
            raise ValueError(f"header {field}={h[field]} does not match the model's {mine}")
    if h["dtype"] != model.dtype:
        raise ValueError(f"model dtype {model.dtype} is not the header's {h['dtype']}")
    shape = (1, h["n_kv_heads"], h["seq_len"], h["head_dim"])
    cache = _Preallocated(h["n_layers"], shape, max(max_new_tokens, 1), model.dtype, model.device)
    for layer in range(h["n_layers"]):
        k, v = torch.empty(shape, dtype=h["dtype"]), torch.empty(shape, dtype=h["dtype"])
        dist.recv(k, src, group=group)
        dist.recv(v, src, group=group)
        cache.update(layer, k.to(model.device), v.to(model.device))
    t = torch.empty(1, dtype=torch.long)
    dist.recv(t, src, group=group)
    tokens, P = [], h["seq_len"]
    nxt = int(t.item())
    while len(tokens) < max_new_tokens:
        tokens.append(nxt)
        if nxt == eos_token_id or len(tokens) == max_new_tokens:
            break
        where = torch.tensor([[P + len(tokens) - 1]], device=model.device)
        out = model(torch.tensor([[nxt]], device=model.device), position_ids=where, cache=cache)
        nxt = int(out[0, -1].argmax().item())
    return tokens
