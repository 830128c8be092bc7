"""Kata 16 — disaggregated prefill and decode over torch.distributed (reference solution).

Shapes: batch 1, L layers, P prompt tokens, Hkv KV heads, D head width. The models are
``grader.nn.Llama`` or anything with its interface: ``model.config`` (``num_hidden_layers``,
``num_key_value_heads``, ``head_dim``, ``vocab_size``), ``model.device``, ``model.dtype`` and
``model(input_ids, position_ids=, cache=) -> logits (1, T, V)``. Point-to-point messages go through
``torch.distributed`` (called as ``dist.send``, ``dist.recv``, ``dist.isend``), gloo on the CPU.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

HEADER_LEN = 8
MAGIC = 0x4B563136  # "KV16"
VERSION = 1
DTYPE_CODES = {torch.float32: 1, torch.float64: 2, torch.float16: 3, torch.bfloat16: 4}
FIELDS = ("n_layers", "seq_len", "n_kv_heads", "head_dim")  # header[2:6]; header[6] the dtype code, header[7] 0


def _positive(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
    return value


def encode_header(*, n_layers: int, seq_len: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """The header, an int64 CPU tensor (8,): magic, version, n_layers, seq_len, n_kv_heads, head_dim, dtype code, 0."""
    sizes = [_positive(name, value) for name, value in zip(FIELDS, (n_layers, seq_len, n_kv_heads, head_dim))]
    if dtype not in DTYPE_CODES:
        raise ValueError(f"dtype: expected one of {list(DTYPE_CODES)}, got {dtype!r}")
    return torch.tensor([MAGIC, VERSION, *sizes, DTYPE_CODES[dtype], 0], dtype=torch.int64)


def decode_header(header: torch.Tensor) -> dict:
    """The header's fields: {"n_layers", "seq_len", "n_kv_heads", "head_dim", "dtype"}; ValueError naming header
    for anything but an int64 (8,) tensor with the magic, the version, sizes >= 1, a known dtype code and a 0 last."""
    if not isinstance(header, torch.Tensor) or header.dtype != torch.int64 or tuple(header.shape) != (HEADER_LEN,):
        got = f"{header.dtype} {tuple(header.shape)}" if isinstance(header, torch.Tensor) else type(header).__name__
        raise ValueError(f"header: expected an int64 tensor of shape ({HEADER_LEN},), got {got}")
    values = header.tolist()
    if values[0] != MAGIC or values[1] != VERSION:
        raise ValueError(f"header: expected magic {MAGIC:#x} and version {VERSION}, got {values[0]:#x} and {values[1]}")
    codes = {code: dtype for dtype, code in DTYPE_CODES.items()}
    if min(values[2:6]) < 1 or values[6] not in codes or values[7] != 0:
        raise ValueError(f"header: expected sizes >= 1, a dtype code in {sorted(codes)} and 0 last, got {values}")
    return {**dict(zip(FIELDS, values[2:6])), "dtype": codes[values[6]]}


def kv_messages(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """K0, V0, K1, V1, …: 2L contiguous CPU tensors (1, Hkv, P, D), in the dtype of the cache.

    ``layers``: one (K, V) per layer, each (1, Hkv, P, D), every layer of the same shape and dtype.
    """
    if not isinstance(layers, (list, tuple)) or len(layers) == 0:
        raise ValueError(f"layers: expected a non-empty list of (K, V) pairs, got {layers!r}")
    out: list[torch.Tensor] = []
    for i, pair in enumerate(layers):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"layers: expected (K, V) pairs, got {type(pair).__name__} at layer {i}")
        for x in pair:
            like = out[0] if out else x  # layer 0's K sets the shape and dtype of every message
            if (not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[0] != 1 or x.shape != like.shape
                    or x.dtype != like.dtype):
                got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"layers: expected every K and V (1, Hkv, P, D) like layer 0's K, got {got} at layer {i}")
            out.append(x.to("cpu").contiguous())  # (1, Hkv, P, D): heads, then tokens, then the width
    return out


def _rank_arg(name: str, value, group) -> int:
    own, world = dist.get_rank(group), dist.get_world_size(group)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < world or value == own:
        raise ValueError(f"{name}: expected the peer's rank, an int from 0 to {world - 1} other than this rank "
                         f"{own}, got {value!r}")
    return value


def _check_prompt(model, prompt) -> list[int]:
    vocab = model.config.vocab_size
    if (not isinstance(prompt, (list, tuple)) or len(prompt) == 0
            or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt)):
        raise ValueError(f"prompt: expected a non-empty list of int token ids from 0 to {vocab - 1}, got {prompt!r}")
    return list(prompt)


class _Cache:
    """A plain cache: one growing (K, V) per layer."""

    def __init__(self):
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer in self.layers:
            k = torch.cat([self.layers[layer][0], k], dim=2)  # (1, Hkv, S + T, D)
            v = torch.cat([self.layers[layer][1], v], dim=2)
        self.layers[layer] = (k, v)
        return k, v


class _SendingCache(_Cache):
    """Layer-wise mode: the cache starts sending each layer to ``dst`` inside its update."""

    def __init__(self, dst: int, group):
        super().__init__()
        self.dst, self.group, self.pending = dst, group, []  # pending: (work, tensor) still in flight

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = super().update(layer, k, v)  # one prefill forward: this layer is final, send it now
        for message in kv_messages([(k, v)]):  # fresh contiguous tensors, one per send, alive until waited
            self.pending.append((dist.isend(message, self.dst, group=self.group), message))
        return k, v


@torch.inference_mode()
def prefill_worker(model, prompt: list[int], *, dst: int = 1, group=None, layerwise: bool = False) -> dict:
    """Run the prompt once and send it to rank ``dst``: the header, K0, V0, …, K(L-1), V(L-1), then the
    first token as an int64 (1,) tensor. ``layerwise``: each layer is sent with ``dist.isend`` inside its
    update, and every send is waited once, after the forward. Returns {"first_token", "kv_bytes", "messages"}."""
    prompt = _check_prompt(model, prompt)
    dst = _rank_arg("dst", dst, group)
    if not isinstance(layerwise, bool):
        raise ValueError(f"layerwise: expected True or False, got {layerwise!r}")
    cfg, P = model.config, len(prompt)
    header = encode_header(n_layers=cfg.num_hidden_layers, seq_len=P, n_kv_heads=cfg.num_key_value_heads,
                           head_dim=cfg.head_dim, dtype=model.dtype)
    if layerwise:
        dist.send(header, dst, group=group)  # the length is known before the forward
    cache = _SendingCache(dst, group) if layerwise else _Cache()
    ids = torch.tensor([prompt], device=model.device)  # (1, P)
    logits = model(ids, position_ids=torch.arange(P, device=model.device)[None], cache=cache)  # (1, P, V)
    first = int(logits[0, -1].argmax())
    messages = kv_messages([cache.layers[i] for i in range(cfg.num_hidden_layers)])
    if layerwise:
        for work, _ in cache.pending:
            work.wait()
    else:
        dist.send(header, dst, group=group)
        for message in messages:
            dist.send(message, dst, group=group)
    dist.send(torch.tensor([first], dtype=torch.int64), dst, group=group)
    return {"first_token": first, "kv_bytes": sum(m.numel() * m.element_size() for m in messages),
            "messages": len(messages) + 2}


def _receive(model, src: int, group) -> tuple[_Cache, int, int]:
    """The header, every layer into a cache on the model's device, the first token: (cache, P, first)."""
    header = torch.empty(HEADER_LEN, dtype=torch.int64)
    dist.recv(header, src, group=group)
    h, cfg = decode_header(header), model.config
    want = {"n_layers": cfg.num_hidden_layers, "n_kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim}
    for key, value in want.items():
        if h[key] != value:
            raise ValueError(f"header: announces {key} = {h[key]}, but the decode model has {value}")
    if h["dtype"] != model.dtype:
        raise ValueError(f"model: its dtype {model.dtype} differs from the cache's {h['dtype']} in the header")
    cache = _Cache()
    for layer in range(h["n_layers"]):
        kv = []
        for _ in range(2):  # K, then V
            buffer = torch.empty(1, h["n_kv_heads"], h["seq_len"], h["head_dim"], dtype=h["dtype"])
            dist.recv(buffer, src, group=group)
            kv.append(buffer.to(model.device))
        cache.update(layer, *kv)
    first = torch.empty(1, dtype=torch.int64)
    dist.recv(first, src, group=group)
    return cache, h["seq_len"], int(first)


@torch.inference_mode()
def decode_worker(model, max_new_tokens: int, *, src: int = 0, group=None, eos_token_id: int | None = None) -> list[int]:
    """Receive a prompt's cache and first token from rank ``src`` and go on greedily: the first token, then
    one forward per token, up to ``max_new_tokens`` tokens or an EOS (kept). 0 still receives everything."""
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an int >= 0, got {max_new_tokens!r}")
    src = _rank_arg("src", src, group)
    cache, P, token = _receive(model, src, group)
    out = [token][:max_new_tokens]
    while len(out) < max_new_tokens and out[-1] != eos_token_id:
        position = P + len(out) - 1  # the newest token is fed right after everything the cache holds
        ids = torch.tensor([[out[-1]]], device=model.device)  # (1, 1)
        logits = model(ids, position_ids=torch.tensor([[position]], device=model.device), cache=cache)
        out.append(int(logits[0, -1].argmax()))
    return out
