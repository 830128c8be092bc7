"""Kata 16 — disaggregated prefill and decode over torch.distributed.

Fill in the pieces below, then run ``pytest katas/16``. The README explains the idea and the wire format.
Shapes: batch 1, L layers, P prompt tokens, Hkv KV heads, D head width. The models are
``grader.nn.Llama`` or anything with its interface: ``model.config`` (``num_hidden_layers``,
``num_key_value_heads``, ``head_dim``, ``vocab_size``), ``model.device``, ``model.dtype`` and
``model(input_ids, position_ids=, cache=) -> logits (1, T, V)``. Point-to-point messages go through
``torch.distributed`` (called as ``dist.send``, ``dist.recv``, ``dist.isend``), gloo on the CPU.
"""
from __future__ import annotations

import torch
import torch.distributed as dist  # noqa: F401  (you will need it)

HEADER_LEN = 8
MAGIC = 0x4B563136  # "KV16"
VERSION = 1
DTYPE_CODES = {torch.float32: 1, torch.float64: 2, torch.float16: 3, torch.bfloat16: 4}


def encode_header(*, n_layers: int, seq_len: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """The header, an int64 CPU tensor (8,): magic, version, n_layers, seq_len, n_kv_heads, head_dim, dtype code, 0."""
    raise NotImplementedError("kata 16: encode_header — see README, task 1")


def decode_header(header: torch.Tensor) -> dict:
    """The header's fields: {"n_layers", "seq_len", "n_kv_heads", "head_dim", "dtype"}; ValueError naming header
    for anything but an int64 (8,) tensor with the magic, the version, sizes >= 1, a known dtype code and a 0 last."""
    raise NotImplementedError("kata 16: decode_header — see README, task 1")


def kv_messages(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """K0, V0, K1, V1, …: 2L contiguous CPU tensors (1, Hkv, P, D), in the dtype of the cache.

    ``layers``: one (K, V) per layer, each (1, Hkv, P, D), every layer of the same shape and dtype.
    """
    raise NotImplementedError("kata 16: kv_messages — see README, task 1")


def prefill_worker(model, prompt: list[int], *, dst: int = 1, group=None, layerwise: bool = False) -> dict:
    """Run the prompt once and send it to rank ``dst``: the header, K0, V0, …, K(L-1), V(L-1), then the
    first token as an int64 (1,) tensor. ``layerwise``: each layer is sent with ``dist.isend`` inside its
    update, and every send is waited once, after the forward. Returns {"first_token", "kv_bytes", "messages"}."""
    raise NotImplementedError("kata 16: prefill_worker — see README, tasks 2 and 4")


def decode_worker(model, max_new_tokens: int, *, src: int = 0, group=None, eos_token_id: int | None = None) -> list[int]:
    """Receive a prompt's cache and first token from rank ``src`` and go on greedily: the first token, then
    one forward per token, up to ``max_new_tokens`` tokens or an EOS (kept). 0 still receives everything."""
    raise NotImplementedError("kata 16: decode_worker — see README, task 3")
