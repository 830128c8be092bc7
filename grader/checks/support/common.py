"""Building blocks the kata checks share: input strategies, seeded tensors and weights,
observing projections. Checks import from here instead of writing their own."""
from __future__ import annotations

import math
import re
import zlib
from contextlib import contextmanager

import torch
from hypothesis import strategies as st
from torch import nn

from grader.engine import Failure, precision, report
from grader.nn import Llama, LlamaConfig
from grader.seq2seq import Seq2Seq, Seq2SeqConfig

DTYPES = st.sampled_from([torch.float64, torch.float32])
SEEDS = st.integers(0, 2**16)


def randn(seed: int, *shape: int, dtype=torch.float64, device="cpu", scale: float = 1.0) -> torch.Tensor:
    """Reproducible normal noise, drawn on the CPU so every device sees the same numbers."""
    g = torch.Generator().manual_seed(seed)
    x = precision.round_input(torch.randn(*shape, generator=g, dtype=torch.float64) * scale)  # the float64 run's inputs
    return x.to(device=device, dtype=dtype)


TINY_LLAMA = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def tiny_llama(seed: int, device, cls=Llama, **overrides) -> Llama:
    """A seeded float64 Llama (``TINY_LLAMA``, fields replaced by ``overrides``), built as ``cls``."""
    with torch.random.fork_rng(devices=[]):  # the default init is overwritten; keep the global RNG untouched
        model = cls(LlamaConfig(**{**TINY_LLAMA, **overrides})).to(device=device, dtype=torch.float64)
    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(model.named_parameters())):
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * randn(seed * 97 + i, *p.shape, device=device))
            else:
                scale = 1.0 if "embed" in name else 1 / math.sqrt(p.shape[1])
                p.copy_(randn(seed * 97 + i, *p.shape, device=device, scale=scale))
    return model.eval()


TINY_SEQ2SEQ = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_encoder_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def tiny_seq2seq(seed: int, device, cross_attention: type, cls=Seq2Seq, **overrides) -> Seq2Seq:
    """A seeded float64 encoder–decoder (``TINY_SEQ2SEQ``, fields replaced by ``overrides``), built as ``cls``,
    whose cross-attention slots are ``cross_attention``. Each weight is drawn from the seed and its parameter name, so any class whose
    ``wq, wk, wv, wo`` have the expected shapes gets the same weights; a missing or misshapen one is a Failure."""
    config = Seq2SeqConfig(**{**TINY_SEQ2SEQ, **overrides})
    with torch.random.fork_rng(devices=[]):  # the default init is overwritten; keep the global RNG untouched
        model = cls(config, cross_attention)
    inner = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    shapes = {"wq": (inner, config.hidden_size), "wk": (kv, config.hidden_size), "wv": (kv, config.hidden_size),
              "wo": (config.hidden_size, inner)}
    for layer in model.decoder_layers:
        load_linears(layer.cross_attn, shapes, seed, f"{cross_attention.__name__}(d_model={config.hidden_size}, "
                     f"n_heads={config.num_attention_heads}, n_kv_heads={config.num_key_value_heads})")
    model = model.to(device=device, dtype=torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
                continue
            drawn = seed * 7919 + zlib.crc32(name.encode()) % 100003
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * randn(drawn, *p.shape, device=device))
            else:
                scale = 1.0 if "embed" in name else 1 / math.sqrt(p.shape[1])
                p.copy_(randn(drawn, *p.shape, device=device, scale=scale))
    return model.eval()


def chunks(total: int, pieces: list[int]) -> list[int]:
    """Lengths of consecutive chunks: ``pieces`` trimmed or extended to cover ``total``."""
    out, left = [], total
    for p in pieces:
        if left <= 0:
            break
        out.append(min(p, left))
        left -= out[-1]
    if left > 0:
        out.append(left)
    return out


def load_linears(module, shapes: dict[str, tuple[int, int]], seed: int, what: str) -> None:
    """Give the learner's ``nn.Linear`` layers the same seeded weights as the reference's.

    ``shapes`` maps attribute names to (out_features, in_features). A missing layer or a
    layer of the wrong shape is a clear failure, never a crash in the grader.
    """
    for offset, (name, (out_f, in_f)) in enumerate(shapes.items()):
        layer = getattr(module, name, None)
        if not isinstance(layer, nn.Linear):
            raise Failure(f"{what} has no `{name}` of type torch.nn.Linear (got {type(layer).__name__})",
                          ("layer", name, "missing"))
        if tuple(layer.weight.shape) != (out_f, in_f):
            raise Failure(
                f"{what}.{name} has weight shape {tuple(layer.weight.shape)}, expected {(out_f, in_f)} "
                f"(out_features, in_features)", ("layer", name, tuple(layer.weight.shape)))
        weight = randn(seed * 31 + offset, out_f, in_f, dtype=layer.weight.dtype, device=layer.weight.device,
                       scale=1 / math.sqrt(in_f))
        with torch.no_grad():
            layer.weight.copy_(weight)
            if layer.bias is not None:
                layer.bias.zero_()


@contextmanager
def count_rows(module, names: list[str]):
    """Count the rows (tokens x batch) that go through each named sub-layer while inside."""
    counts = {name: 0 for name in names}
    handles = []
    for name in names:
        layer = getattr(module, name, None)
        if isinstance(layer, nn.Module):
            def hook(mod, inputs, output, name=name):
                x = inputs[0]
                counts[name] += x.numel() // max(x.shape[-1], 1)
            handles.append(layer.register_forward_hook(hook))
    try:
        yield counts
    finally:
        for handle in handles:
            handle.remove()


def named(value, names=("K", "V")):
    """A returned pair as a dict, so messages say "K" rather than "[0]"; anything else as is."""
    if isinstance(value, (tuple, list)) and len(value) == len(names):
        return dict(zip(names, value))
    return value


def value_error_names(exc: BaseException, names: tuple[str, ...]) -> bool:
    """Whether a ValueError message names one of the arguments it is about."""
    text = str(exc)
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text) for name in names)


def expect_pair(value, call: str, form: str = "(out, (K, V))"):
    """A result that must be a pair; anything else is a clear failure, not a grader crash."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value
    raise Failure(f"{call} returned {report.describe(value)}; expected {form}", ("returned", report.describe(value)))


def run_chunks(layer, ctx, x, lengths):
    """Feed ``x`` (B, T, d_model) chunk after chunk, passing the returned cache back in.

    Returns every output and cache in order (a dict for ``ctx.differential``) and the last cache.
    """
    seen, cache, start = {}, None, 0
    for n in lengths:
        out, cache = expect_pair(ctx.call(layer, x[:, start:start + n], cache), "forward(x, cache)")
        what = "prefill" if start == 0 else f"{n} new token(s) after {start} cached"
        seen[f"output of the {what}"] = out
        seen[f"cache after the {what}"] = named(cache)
        start += n
    return seen, cache


def hidden_states(ex: dict, device) -> torch.Tensor:
    """The tokens of an attention example: (batch, sum(lengths), d_model), drawn from its seed."""
    return randn(ex["seed"] + 7, ex["batch"], sum(ex["lengths"]), ex["d_model"], dtype=ex["dtype"], device=device)


def chunks_and_whole(layer, ctx, x, lengths):
    """``run_chunks``, then one uncached forward over every token: a cache must not change outputs."""
    seen, _ = run_chunks(layer, ctx, x, lengths)
    seen["output of one uncached forward over all the tokens"] = expect_pair(ctx.call(layer, x), "forward(x)")[0]
    return seen


def attention(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The checks' oracle: softmax(q K^T / sqrt(D)) V, written out, on any leading axes.

    q (..., T, D); K, V (..., S, D); ``mask`` bool, broadcastable to (..., T, S), True = may attend.
    """
    scores = q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ V  # (..., T, D)


def expect_value_error(ctx, fn, *args, what: str, names: tuple[str, ...], example: dict | None = None, **kwargs):
    """``fn(*args, **kwargs)`` must raise a ValueError whose message names one of ``names`` (bad input
    raises ValueError naming the argument: the SPEC's rule); ``what`` says which call it was."""
    exc = ctx.raises(ValueError, fn, *args, what=what, example=example, **kwargs)
    if not value_error_names(exc, names):
        ctx.fail(f"{what} raised ValueError({str(exc)!r}); the message should name {' or '.join(names)}",
                 example, ("unnamed", what))


def bad_caches(K: torch.Tensor, V: torch.Tensor) -> list[tuple[str, object]]:
    """Caches a layer may be handed back by mistake, each with what is wrong; ``(K, V)`` is a good one."""
    other = torch.float32 if K.dtype == torch.float64 else torch.float64
    return [
        ("a cache that is one tensor, not a pair (K, V)", K),
        ("a cache of three tensors", (K, V, V)),
        ("a cache whose V holds one token fewer than its K", (K, V[:, :, :-1])),
        ("a cache whose K and V differ in dtype", (K, V.to(other))),
        ("a cache with twice the heads", (torch.cat([K, K], 1), torch.cat([V, V], 1))),
        ("a cache with twice the head width", (torch.cat([K, K], 3), torch.cat([V, V], 3))),
        ("a cache of another batch size", (torch.cat([K, K], 0), torch.cat([V, V], 0))),
        ("a cache without its batch axis", (K[0], V[0])),
        ("a cache with an extra trailing axis", (K[..., None], V[..., None])),
        (f"a cache in {str(other).removeprefix('torch.')}", (K.to(other), V.to(other))),
    ]


def held_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Tensors a module keeps in its attributes (its parameters left out), found a few levels deep."""
    found: list[tuple[str, torch.Tensor]] = []

    def walk(name: str, value, depth: int) -> None:
        if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
            found.append((name, value))
        elif depth < 3 and isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(f"{name}[{i}]", item, depth + 1)
        elif depth < 3 and isinstance(value, dict):
            for key, item in value.items():
                walk(f"{name}[{key!r}]", item, depth + 1)

    for sub_name, sub in module.named_modules():
        for key, value in vars(sub).items():
            if key not in ("_parameters", "_modules"):
                walk(f"{sub_name + '.' if sub_name else ''}{key}", value, 0)
    return found


def interleaved(layer, ctx, xa: torch.Tensor, xb: torch.Tensor, lengths_a: list[int], lengths_b: list[int]) -> dict:
    """Two sequences served by one layer, their calls alternating, each with its own cache."""
    seen, caches, starts = {}, {"A": None, "B": None}, {"A": 0, "B": 0}
    calls = [("A", xa, n) for n in lengths_a], [("B", xb, n) for n in lengths_b]
    order = [call for pair in zip(*calls) for call in pair]
    order += calls[0][len(calls[1]):] + calls[1][len(calls[0]):]
    for name, x, n in order:
        start = starts[name]
        out, caches[name] = expect_pair(ctx.call(layer, x[:, start:start + n], caches[name]), "forward(x, cache)")
        seen[f"sequence {name}, output of its {n} token(s) after {start} cached"] = out
        starts[name] = start + n
    return seen


def expect_value_error_soon(ctx, build, x: torch.Tensor, what: str, names: tuple[str, ...], example: dict | None = None):
    """A bad size must raise a ValueError naming it when the layer is built, or at the latest on its first call."""
    try:
        layer = build()
    except ValueError as exc:
        if not value_error_names(exc, names):
            ctx.fail(f"{what} raised ValueError({str(exc)!r}); the message should name {' or '.join(names)}",
                     example, ("unnamed", what))
        return
    expect_value_error(ctx, layer, x, what=f"{what}, then called on x", names=names, example=example)


def expect_bad_caches_refused(c, layer, x: torch.Tensor, P: int, ex: dict, step: str = "a call") -> None:
    """After ``layer`` prefills ``x[:, :P]``, the next token with each cache of ``bad_caches`` handed
    back in must raise a ValueError naming ``cache``."""
    _, (K, V) = expect_pair(c.call(layer, x[:, :P]), "forward(x)")
    for what, cache in bad_caches(K, V):
        expect_value_error(c, layer, x[:, P:P + 1], cache, what=f"{step} with {what}", names=("cache",), example=ex)


def two_sequences(layer, ctx, ex: dict):
    """Two sequences through one ``layer``, calls alternating, each passing its own cache back in: the
    example's and a second one (another seed, one more chunk of 2 tokens first, its chunks reversed)."""
    xa = hidden_states(ex, ctx.device)
    xb = hidden_states({**ex, "seed": ex["seed"] + 1, "lengths": [2] + ex["lengths"]}, ctx.device)
    return interleaved(layer, ctx, xa, xb, ex["lengths"], [2] + ex["lengths"][::-1])


def expect_no_bias(ctx, layer, example: dict | None = None, names=("wq", "wk", "wv", "wo")) -> None:
    """SPEC: the attention layers' projections are ``nn.Linear(..., bias=False)`` (the checks zero any bias
    they load, so only looking can tell)."""
    biased = [name for name in names if getattr(getattr(layer, name, None), "bias", None) is not None]
    if biased:
        ctx.fail(f"{', '.join(biased)} {'has' if len(biased) == 1 else 'have'} a bias; the attention layers are "
                 "nn.Linear(..., bias=False)", example, ("bias", tuple(biased)))
