"""Inputs and helpers of kata 17's checks of ``CrossAttention`` and ``generate_seq2seq``: the bad sizes, calls
and arguments each must refuse, what the spies read (the encoder's input, the projections' rows), the greedy
tokens of each source alone, and the device scenario.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch

from grader.checks.k17_runs import greedy_alone, truth_model
from grader.checks.support import devices
from grader.checks.support.common import count_rows, randn, tiny_seq2seq
from grader.seq2seq import Seq2Seq, Seq2SeqConfig


def bad_sizes(cls) -> tuple:
    """(what, build, argument) for each size CrossAttention refuses."""
    return (("CrossAttention(0, 4)", lambda: cls(0, 4), "d_model"),
            ("CrossAttention(16.0, 4)", lambda: cls(16.0, 4), "d_model"),
            ("CrossAttention(16, 0)", lambda: cls(16, 0), "n_heads"),
            ("CrossAttention(16, 3) (3 does not divide 16)", lambda: cls(16, 3),
             "n_heads"),
            ("CrossAttention(16, 4, 3) (3 does not divide 4)",
             lambda: cls(16, 4, 3), "n_kv_heads"),
            ("CrossAttention(16, 4, 0)", lambda: cls(16, 4, 0), "n_kv_heads"),
            ("CrossAttention(16, 4, 8) (more KV heads than query heads)",
             lambda: cls(16, 4, 8), "n_kv_heads"))


def bad_forward_calls(x: torch.Tensor, enc: torch.Tensor, mask: torch.Tensor) -> tuple:
    """(what, forward arguments, argument named) for x (2, 3, 16), encoder_out (2, 5, 16) and a mask."""
    wide, more = torch.cat([x, x], -1), torch.cat([enc, enc[:1]])  # width 32; encoder_out of batch 3
    return (("a 2-D x", (x[0], enc), "x"), ("x of width 8 for 16", (x[..., :8], enc), "x"),
            ("x of width 32 for 16", (wide, enc), "x"), ("a 4-D x", (x[None], enc), "x"),
            ("encoder_out of batch 1 for x's 2", (x, enc[:1]), "encoder_out"),
            ("encoder_out of batch 3 for x's 2", (x, more), "encoder_out"),
            ("encoder_out of width 8", (x, enc[..., :8]), "encoder_out"),
            ("encoder_out of width 32", (x, torch.cat([enc, enc], -1)), "encoder_out"),
            ("a 2-D encoder_out", (x, enc[0]), "encoder_out"),
            ("a 4-D encoder_out", (x, enc[:, None]), "encoder_out"),
            ("encoder_out of 0 frames", (x, enc[:, :0]), "encoder_out"),
            ("encoder_mask of 4 frames for 5", (x, enc, None, 0, mask[:, :4]), "encoder_mask"),
            ("encoder_mask of 6 frames for 5",
             (x, enc, None, 0, torch.cat([mask, mask[:, :1]], 1)), "encoder_mask"),
            ("encoder_mask of batch 1 for 2", (x, enc, None, 0, mask[:1]), "encoder_mask"),
            ("encoder_mask of batch 3 for 2", (x, enc, None, 0, torch.cat([mask, mask[:1]])),
             "encoder_mask"),
            ("an integer encoder_mask", (x, enc, None, 0, mask.long()), "encoder_mask"),
            ("an encoder_mask whose row 1 hides every frame",
             (x, enc, None, 0, torch.stack([mask[0], ~mask[1]])), "encoder_mask"))


def bad_generate_calls(good: dict) -> tuple:
    """(what, positional arguments after the model, keyword arguments, argument named) of bad calls."""
    return (
        ("sources = []", ([], 3), good, "sources"), ("sources = None", (None, 3), good, "sources"),
        ("an empty source", ([[1], []], 3), good, "sources"),
        ("a source of ints, not a list of them", ([1, 2], 3), good, "sources"),
        ("the id 16 of a 16-token vocabulary", ([[1, 16]], 3), good, "sources"),
        ("the id -1", ([[-1]], 3), good, "sources"), ("the id 2.0", ([[2.0]], 3), good, "sources"),
        ("max_new_tokens = -1", ([[1]], -1), good, "max_new_tokens"),
        ("max_new_tokens = 2.5", ([[1]], 2.5), good, "max_new_tokens"),
        ("decoder_start_token_id = 16", ([[1]], 3), {"decoder_start_token_id": 16}, "decoder_start_token_id"),
        ("decoder_start_token_id = -1", ([[1]], 3), {"decoder_start_token_id": -1}, "decoder_start_token_id"),
        ("decoder_start_token_id = None", ([[1]], 3), {"decoder_start_token_id": None},
         "decoder_start_token_id"),
        ("eos_token_id = 16", ([[1]], 3), {**good, "eos_token_id": 16}, "eos_token_id"),
        ("eos_token_id = -1", ([[1]], 3), {**good, "eos_token_id": -1}, "eos_token_id"),
        ("pad_token_id = 16", ([[1]], 3), {**good, "pad_token_id": 16}, "pad_token_id"),
        ("pad_token_id = -1", ([[1]], 3), {**good, "pad_token_id": -1}, "pad_token_id"))


def fed_to_the_encoder(c, ex: dict, call: dict) -> None:
    """The encoder's src holds each source in order where the mask is True, the pad id (0 by default) elsewhere."""
    src, mask, pad = call["src"], call["mask"], ex.get("pad", 0)
    width = max(len(s) for s in ex["sources"])
    if mask is None or mask.dtype != torch.bool or tuple(mask.shape) != (len(ex["sources"]), width):
        c.fail(f"model.encode got mask {None if mask is None else (tuple(mask.shape), mask.dtype)}; expected a bool "
               f"({len(ex['sources'])}, {width}) mask, True on each source's tokens", ex, ("encoder mask",))
    for b, source in enumerate(ex["sources"]):
        row = src[b].tolist()
        real = [t for t, m in zip(row, mask[b].tolist()) if m]
        pads = [t for t, m in zip(row, mask[b].tolist()) if not m]
        if real != source or any(t != pad for t in pads):
            c.fail(f"row {b} fed to the encoder is {row} with mask {mask[b].int().tolist()}; expected source {source} "
                   f"where the mask is 1 and the pad id {pad} elsewhere", ex, ("encoder src", b))


@contextmanager
def cross_projections(model):
    """Row counts of wk and wv of every decoder layer's cross-attention, one dict per layer, while inside."""
    with ExitStack() as stack:
        yield [stack.enter_context(count_rows(layer.cross_attn, ["wk", "wv"])) for layer in model.decoder_layers]


def truth_tokens(c, ex):
    """Each source's greedy tokens alone, uncached (to pick an EOS that some row meets)."""
    model = truth_model(ex, c.device)
    return [greedy_alone(model, s, ex["start"], ex["max_new_tokens"]) for s in ex["sources"]]


def model_for(api, ex, device):
    """The example's model with ``api``'s CrossAttention in its slots."""
    return tiny_seq2seq(ex["seed"], device, api.CrossAttention)


# -- the device -------------------------------------------------------------------------------
def device_scenario(s):
    api = s.ctx.t
    cache = api.EncoderDecoderKVCache()
    kv = [s.put(randn(i, 2, 1, n, 4)) for i, n in enumerate((3, 3, 5, 5, 1, 1))]  # (B=2, Hkv=1, T, D=4)
    s.call("EncoderDecoderKVCache().update(0, k, v) with 3 tokens", cache.update, 0, kv[0], kv[1])
    s.call("set_cross(0, k, v) with 5 frames", cache.set_cross, 0, kv[2], kv[3])
    cache.crop(2)
    cache.reorder(s.put(torch.tensor([1, 0])))
    s.running("reorder(tensor([0, 1])) with the index on the CPU (any device is valid)")
    cache.reorder(torch.tensor([0, 1]))
    s.call("update(0, k, v) after crop(2) and two reorders", cache.update, 0, kv[4], kv[5])
    s.call("cross(0) after reorder", cache.cross, 0)
    config = Seq2SeqConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                           num_encoder_layers=1, num_attention_heads=2, num_key_value_heads=1)
    layer = devices.module_on(s, lambda: api.CrossAttention(8, 2, 1), dtype=torch.float64)
    x, enc = s.put(randn(7, 2, 2, 8)), s.put(randn(8, 2, 3, 8))
    mask = s.put(torch.tensor([[True, True, False], [True, True, True]]))
    s.call("CrossAttention(8, 2, 1) with a cache and an encoder_mask", layer, x, enc, api.EncoderDecoderKVCache(), 0,
           mask)
    model = devices.module_on(s, lambda: Seq2Seq(config, api.CrossAttention), dtype=torch.float64)
    s.call("generate_seq2seq(model, [[5, 9, 2], [3]], 3, decoder_start_token_id=1), the model on the test device",
           api.generate_seq2seq, model, [[5, 9, 2], [3]], 3, decoder_start_token_id=1)
