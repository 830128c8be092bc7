"""Kata 16 from the README alone, another way: every message goes out with dist.isend and is waited
at the end of its batch (whole-cache mode waits right after the forward's sends, layer-wise mode
after the forward), headers are built with struct-like lists, and the decode side keeps its cache as
per-layer lists of chunks joined on demand."""
from __future__ import annotations

import torch
import torch.distributed as dist

HEADER_LEN = 8
MAGIC = 0x4B563136
VERSION = 1
DTYPE_CODES = {torch.float32: 1, torch.float64: 2, torch.float16: 3, torch.bfloat16: 4}
KEYS = ["n_layers", "seq_len", "n_kv_heads", "head_dim"]


def _bad(name, what, got):
    return ValueError(f"{name}: expected {what}, got {got!r}")


def encode_header(*, n_layers, seq_len, n_kv_heads, head_dim, dtype):
    values = [n_layers, seq_len, n_kv_heads, head_dim]
    for key, value in zip(KEYS, values):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _bad(key, "a positive int", value)
    code = DTYPE_CODES.get(dtype) if isinstance(dtype, torch.dtype) else None
    if code is None:
        raise _bad("dtype", "float32, float64, float16 or bfloat16", dtype)
    return torch.tensor([MAGIC, VERSION] + values + [code, 0], dtype=torch.int64)


def decode_header(header):
    if not torch.is_tensor(header) or header.dtype is not torch.int64 or list(header.shape) != [HEADER_LEN]:
        raise _bad("header", "an int64 tensor of shape (8,)", header)
    magic, version, *sizes, code, last = header.tolist()
    codes = {c: d for d, c in DTYPE_CODES.items()}
    if (magic, version, last) != (MAGIC, VERSION, 0) or min(sizes) <= 0 or code not in codes:
        raise _bad("header", "the README's magic, version, positive sizes, a dtype code and 0", header.tolist())
    return {**{k: s for k, s in zip(KEYS, sizes)}, "dtype": codes[code]}


def kv_messages(layers):
    if not layers or not isinstance(layers, list):
        raise _bad("layers", "a non-empty list of (K, V)", layers)
    out = []
    for i, kv in enumerate(layers):
        try:
            k, v = kv
        except (TypeError, ValueError):
            raise _bad("layers", f"a (K, V) pair at layer {i}", kv) from None
        for t in (k, v):
            if not torch.is_tensor(t) or t.ndim != 4 or t.size(0) != 1:
                raise _bad("layers", "4-D tensors of batch 1", t)
            if t.shape != layers[0][0].shape or t.dtype != layers[0][0].dtype:
                raise _bad("layers", f"K and V like layer 0's {tuple(layers[0][0].shape)}", t.shape)
            out.append(t.to("cpu").clone(memory_format=torch.contiguous_format))
    return out


def _rank(name, value, group):
    world, me = dist.get_world_size(group), dist.get_rank(group)
    if isinstance(value, bool) or not isinstance(value, int) or value in (me,) or not 0 <= value < world:
        raise _bad(name, f"a peer rank in 0..{world - 1} other than {me}", value)


class LayerSender:
    def __init__(self, dst, group, live):
        self.dst, self.group, self.live = dst, group, live
        self.keys, self.values, self.works = [], [], []

    def update(self, layer, k, v):
        while len(self.keys) <= layer:
            self.keys.append(None)
            self.values.append(None)
        if self.keys[layer] is not None:
            k, v = torch.cat([self.keys[layer], k], 2), torch.cat([self.values[layer], v], 2)
        self.keys[layer], self.values[layer] = k, v
        if self.live:
            for msg in kv_messages([(k, v)]):
                self.works.append((dist.isend(msg, self.dst, group=self.group), msg))
        return k, v


@torch.inference_mode()
def prefill_worker(model, prompt, *, dst=1, group=None, layerwise=False):
    V = model.config.vocab_size
    if not isinstance(prompt, list) or len(prompt) < 1:
        raise _bad("prompt", "a non-empty list of token ids", prompt)
    for t in prompt:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0 or t >= V:
            raise _bad("prompt", f"token ids in 0..{V - 1}", t)
    _rank("dst", dst, group)
    if layerwise not in (True, False) or not isinstance(layerwise, bool):
        raise _bad("layerwise", "a bool", layerwise)
    cfg = model.config
    head = encode_header(n_layers=cfg.num_hidden_layers, seq_len=len(prompt), n_kv_heads=cfg.num_key_value_heads,
                         head_dim=cfg.head_dim, dtype=model.dtype)
    if layerwise:
        dist.send(head, dst, group=group)
    cache = LayerSender(dst, group, layerwise)
    ids = torch.tensor(prompt, device=model.device).view(1, -1)
    logits = model(ids, position_ids=torch.arange(ids.shape[1], device=model.device).view(1, -1), cache=cache)
    first = int(logits[0, -1].argmax())
    msgs = kv_messages(list(zip(cache.keys, cache.values)))
    works = cache.works
    if not layerwise:
        works = [(dist.isend(m, dst, group=group), m) for m in [head] + msgs]
    for work, _ in works:
        work.wait()
    dist.send(torch.tensor([first], dtype=torch.int64), dst, group=group)
    return {"first_token": first, "kv_bytes": sum(m.nelement() * m.element_size() for m in msgs),
            "messages": 2 + len(msgs)}


class ChunkCache:
    def __init__(self):
        self.chunks = {}

    def update(self, layer, k, v):
        ks, vs = self.chunks.setdefault(layer, ([], []))
        ks.append(k)
        vs.append(v)
        return torch.cat(ks, dim=2), torch.cat(vs, dim=2)


@torch.inference_mode()
def decode_worker(model, max_new_tokens, *, src=0, group=None, eos_token_id=None):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise _bad("max_new_tokens", "an int >= 0", max_new_tokens)
    _rank("src", src, group)
    buf = torch.zeros(HEADER_LEN, dtype=torch.int64)
    dist.recv(buf, src, group=group)
    info = decode_header(buf)
    cfg = model.config
    if [info["n_layers"], info["n_kv_heads"], info["head_dim"]] != [cfg.num_hidden_layers, cfg.num_key_value_heads,
                                                                    cfg.head_dim]:
        raise _bad("header", "the model's layers, KV heads and head width", info)
    if info["dtype"] is not model.dtype:
        raise _bad("model", f"a model in the cache's dtype {info['dtype']}", model.dtype)
    cache = ChunkCache()
    for layer in range(info["n_layers"]):
        pair = [torch.empty(1, info["n_kv_heads"], info["seq_len"], info["head_dim"], dtype=info["dtype"])
                for _ in "kv"]
        for b in pair:
            dist.recv(b, src, group=group)
        cache.update(layer, *(b.to(model.device) for b in pair))
    tok = torch.empty(1, dtype=torch.int64)
    dist.recv(tok, src, group=group)
    if max_new_tokens == 0:
        return []
    generated = [tok.item()]
    for step in range(1, max_new_tokens):
        if generated[-1] == eos_token_id:
            break
        pos = info["seq_len"] + step - 1
        out = model(torch.tensor([[generated[-1]]], device=model.device),
                    position_ids=torch.tensor([[pos]], device=model.device), cache=cache)
        generated.append(out[0, -1].argmax().item())
    return generated
