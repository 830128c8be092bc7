"""The model-test harness of the katas whose code drives a model (08, 11, 12, 13): a tiny seeded
Llama that notes every call made to it, a spy on the cache it is handed, a stand-in model with
fixed logits (one that counts t -> t + 1), and greedy decoding of one prompt alone (plain uncached
forwards) to judge tokens by."""
from __future__ import annotations

import torch
from torch import nn

from grader.checks.support.common import TINY_LLAMA, tiny_llama
from grader.nn import Llama, LlamaConfig

TINY = TINY_LLAMA
TIE = 1e-9  # top two logits closer than this: either token is a correct greedy choice
DEVICE_MODEL = dict(TINY, vocab_size=16, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)  # smaller still: the stand-in device is slow


class SpyCache:
    """Stands between the model and the learner's cache; notes what each ``update`` returned."""

    def __init__(self, cache, log: list):
        self._cache, self._log = cache, log

    def update(self, layer, k, v):
        K, V = self._cache.update(layer, k, v)
        self._log.append({"layer": layer, "k": K.untyped_storage().data_ptr(), "v": V.untyped_storage().data_ptr(),
                          "shape": tuple(K.shape), "device": K.device.type})
        return K, V

    def __getattr__(self, name):
        return getattr(self._cache, name)


class Recording(Llama):
    """The tiny Llama, noting every call the learner's loop makes."""

    def __init__(self, config):
        super().__init__(config)
        self.calls: list[dict] = []

    def forward(self, input_ids, position_ids=None, cache=None, attention_mask=None, **kwargs):
        call = {"ids": input_ids.detach().cpu(), "cache": cache, "updates": [],
                "positions": None if position_ids is None else position_ids.detach().cpu()}
        self.calls.append(call)
        spy = None if cache is None else SpyCache(cache, call["updates"])
        return super().forward(input_ids, position_ids, spy, attention_mask, **kwargs)


def tiny_model(seed: int, device, recording: type = Recording) -> Recording:
    """A seeded float64 Llama: vocab 48, width 32, 2 layers, 4 query heads sharing 2 KV heads.
    ``recording``: the class that notes the calls, ``Recording`` or a subclass of it."""
    return tiny_llama(seed, device, cls=recording)


class FixedLogits(nn.Module):
    """A stand-in model: logits read from ``table[last input token]``, or one fixed row for every input.

    It has the interface the loop relies on (config, device, dtype, the forward signature) and
    writes zeros into the cache, so any cache the learner built works with it.
    """

    def __init__(self, table: torch.Tensor, device, dtype: torch.dtype = torch.float64):
        super().__init__()
        V = table.shape[-1]
        self.config = LlamaConfig(vocab_size=V, hidden_size=8, intermediate_size=8, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=4)
        self.table = nn.Parameter(table.to(device=device, dtype=dtype), requires_grad=False)
        self.calls = 0

    @property
    def device(self):
        return self.table.device

    @property
    def dtype(self):
        return self.table.dtype

    def forward(self, input_ids, position_ids=None, cache=None, attention_mask=None, **kwargs):
        self.calls += 1
        B, T = input_ids.shape
        if cache is not None:
            zeros = torch.zeros(B, 1, T, 4, dtype=self.dtype, device=self.device)
            for layer in range(self.config.num_hidden_layers):
                cache.update(layer, zeros, zeros)
        if self.table.dim() == 1:
            return self.table.expand(B, T, -1)  # (B, T, V)
        return self.table[input_ids]  # (B, T, V)


def successor_model(vocab: int, device, dtype=torch.float64, margin: float = 5.0) -> FixedLogits:
    """Greedy continues every token t with t + 1 (mod vocab), by a wide margin (logits +margin and -margin)."""
    table = torch.full((vocab, vocab), -margin, dtype=torch.float64)
    table[torch.arange(vocab), (torch.arange(vocab) + 1) % vocab] = margin
    return FixedLogits(table, device, dtype)


@torch.no_grad()
def greedy_alone(model, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(Llama.forward(model, torch.tensor([seq], device=model.device))[0, -1].argmax()))
    return seq[len(prompt):]


@torch.no_grad()
def first_wrong(model, prompt: list[int], row: list[int], eos=None, tie: float = TIE):
    """The first new token of ``row`` that greedy decoding of ``prompt`` alone (plain uncached forwards,
    ties within ``tie`` accepted) would not give: ``("token", i, token, best, logits of step i)``; or an
    EOS that the row goes on after: ``("eos", i)``; None when neither happens."""
    if not row:
        return None
    seq = torch.tensor([list(prompt) + list(row[:-1])], device=model.device)
    logits = Llama.forward(model, seq)[0, len(prompt) - 1:]  # (len(row), V): plain causal, no cache
    for i, token in enumerate(row):
        best = int(logits[i].argmax())
        if not 0 <= token < logits.shape[-1] or logits[i, token] < logits[i, best] - tie:
            return ("token", i, token, best, logits[i])
        if token == eos and i < len(row) - 1:
            return ("eos", i)
    return None
