"""Runs for kata 17's checks of ``CrossAttention`` and ``generate_seq2seq``.

``CrossAttention`` is built with seeded weights and driven over chunks of decoder tokens with ``PlainCross``,
a cache object with just ``cross`` and ``set_cross`` that notes what it is handed. ``generate_seq2seq``
drives ``Spy``, the tiny encoder–decoder of the checks' support (with the learner's ``CrossAttention`` in its
slots), which notes every ``encode`` and ``decode`` call and the cache's lengths and bytes after each;
its tokens are judged against each source decoded alone by the reference model (plain uncached
forwards, ties within 1e-9 accepted). ``Counting`` is a stand-in whose greedy choice follows a rule.
"""
from __future__ import annotations

import types

import torch
from hypothesis import strategies as st
from torch import nn

from grader.checks.support import envelope
from grader.checks.support.common import SEEDS, count_rows, load_linears, named, tiny_seq2seq
from grader.checks.support.models import TIE
from grader.engine import Failure, report
from grader.seq2seq import CrossAttentionBlock, Seq2Seq

PROJECTIONS = ("wq", "wk", "wv", "wo")


# -- CrossAttention ---------------------------------------------------------------------------------------
@st.composite
def attention_examples(draw):
    kv = draw(st.sampled_from([1, 2, 4]))
    ex = {"batch": draw(st.integers(1, 3)), "heads": 4, "kv_heads": kv if draw(st.booleans()) else None,
          "head_dim": draw(st.sampled_from([2, 4])), "src": draw(st.integers(1, 7)),
          "lengths": draw(st.lists(st.integers(1, 3), min_size=1, max_size=4)), "layer": draw(st.integers(0, 2)),
          "mask": draw(st.booleans()), "dtype": draw(st.sampled_from([torch.float64, torch.float32]))}
    ex["pads"] = [draw(st.integers(0, ex["src"] - 1)) for _ in range(ex["batch"])]
    ex["seed"] = draw(SEEDS)
    return ex


class PlainCross:
    """A cache with only ``cross`` and ``set_cross`` (dict-backed); notes each ``set_cross`` call. Like Hugging
    Face's encoder–decoder cache it has the length of its self part, which this one lacks: always 0, so the cache
    is false even while it holds cross K and V (the README: test ``cache is None``)."""

    def __init__(self):
        self.held: dict = {}
        self.calls: list = []

    def __len__(self):
        return 0

    def cross(self, layer):
        return self.held.get(layer)

    def set_cross(self, layer, k, v):
        self.calls.append((layer, tuple(k.shape)))
        self.held[layer] = (k, v)
        return k, v


def build_layer(api, ex: dict, device):
    """``api.CrossAttention`` of the example's sizes, seeded weights, on ``device`` in the example's dtype."""
    d, kv = ex["heads"] * ex["head_dim"], ex["kv_heads"] or ex["heads"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layer = api.CrossAttention(d, ex["heads"], ex["kv_heads"])
    layer = layer.to(device=device, dtype=ex["dtype"])
    shapes = {"wq": (d, d), "wk": (kv * ex["head_dim"], d), "wv": (kv * ex["head_dim"], d), "wo": (d, d)}
    load_linears(layer, shapes, ex["seed"], f"CrossAttention({d}, {ex['heads']}, {ex['kv_heads']})")
    return layer


def attention_inputs(ex: dict, device):
    """x (B, T, d), encoder_out (B, S_enc, d) and the encoder mask (B, S_enc) or None: row b's last pads[b]
    frames are padding."""
    d, B = ex["heads"] * ex["head_dim"], ex["batch"]
    x = envelope.tensor(ex, ex["seed"] + 1, B, sum(ex["lengths"]), d, device=device)
    enc = envelope.tensor(ex, ex["seed"] + 2, B, ex["src"], d, device=device)
    mask = None
    if ex["mask"]:
        mask = torch.arange(ex["src"])[None] < torch.tensor([ex["src"] - p for p in ex["pads"]])[:, None]
        mask = mask.to(device)  # (B, S_enc)
    return x, enc, mask


def attention_run(api, ex: dict) -> dict:
    """The chunks through one cached layer, then one uncached call; outputs and what set_cross was handed."""
    device = ex["device"]
    layer = build_layer(api, ex, device)
    x, enc, mask = attention_inputs(ex, device)
    cache, seen, start = PlainCross(), {}, 0
    given = {} if ex["layer"] is None else {"layer": ex["layer"]}  # None: forward's default, layer 0
    for n in ex["lengths"]:
        what = f"output for decoder tokens {start}…{start + n - 1}, cache holding {'nothing' if not start else 'K, V'}"
        seen[what] = layer(x[:, start:start + n], enc, cache, encoder_mask=mask, **given)
        start += n
    seen["set_cross calls (layer, shape of k)"] = list(cache.calls)
    seen["the K, V handed to set_cross"] = named(cache.held.get(ex["layer"] or 0))
    seen["output of one uncached call over every token (cache=None)"] = layer(x, enc, None, ex["layer"], mask)
    return seen


def projection_rows(api, ex: dict) -> dict:
    """Rows through each projection: two requests of chunked calls (a fresh cache each), then two uncached calls."""
    layer = build_layer(api, ex, ex["device"])
    x, enc, mask = attention_inputs(ex, ex["device"])
    seen = {}
    with count_rows(layer, list(PROJECTIONS)) as rows:
        for request in (1, 2):
            cache, start = PlainCross(), 0
            for n in ex["lengths"]:
                layer(x[:, start:start + n], enc, cache, ex["layer"], mask)
                start += n
            seen[f"after request {request} (its own cache)"] = dict(rows)
        for call in (1, 2):
            layer(x, enc, None, ex["layer"], mask)
            seen[f"after uncached call {call}"] = dict(rows)
    return seen


# -- generate_seq2seq ---------------------------------------------------------------------------------
class Spy(Seq2Seq):
    """The tiny encoder–decoder, noting every call and the cache's lengths and bytes after each decode."""

    def __init__(self, config, cross_attention):
        super().__init__(config, cross_attention)
        self.encodes: list[dict] = []
        self.decodes: list[dict] = []

    def encode(self, src, mask=None):
        self.encodes.append({"src": src.detach().cpu(), "mask": None if mask is None else mask.detach().cpu()})
        return super().encode(src, mask)

    def decode(self, ids, positions, encoder_out, encoder_mask=None, cache=None):
        logits = super().decode(ids, positions, encoder_out, encoder_mask, cache)
        layers = range(self.config.num_hidden_layers)
        self.decodes.append({"ids": ids.detach().cpu(), "positions": positions.detach().cpu(),
                             "cache": None if cache is None else (
                                 [cache.seq_len(i) for i in layers], [cache.cross_len(i) for i in layers],
                                 cache.nbytes())})
        return logits


@st.composite
def runs(draw, max_new=(1, 9)):
    B = draw(st.integers(1, 3))
    return {"sources": [draw(st.lists(st.integers(0, 47), min_size=1, max_size=7)) for _ in range(B)],
            "max_new_tokens": draw(st.integers(*max_new)), "start": draw(st.integers(0, 47)), "seed": draw(SEEDS)}


def spy_model(c, ex: dict) -> Spy:
    return tiny_seq2seq(ex["seed"], c.device, c.t.CrossAttention, cls=Spy, **ex.get("model", {}))


def tokens_of(c, got, ex: dict) -> list[list[int]]:
    """The learner's result as a list of B lists of ints, or a clear failure."""
    B = len(ex["sources"])
    if (not isinstance(got, list) or len(got) != B
            or not all(isinstance(r, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in r)
                       for r in got)):
        raise Failure(f"generate_seq2seq returned {report.describe(got)}; expected a list of {B} lists of int "
                      "token ids, one per source", ("returned", report.describe(got)))
    return got


def generate(c, ex: dict, model=None, eos=None):
    """The learner's generate_seq2seq on ``model`` (a fresh Spy by default): (model, tokens)."""
    model = spy_model(c, ex) if model is None else model
    sources = [list(s) for s in ex["sources"]]
    pad = {"pad_token_id": ex["pad"]} if "pad" in ex else {}  # otherwise the default, 0
    got = c.t.generate_seq2seq(model, sources, ex["max_new_tokens"], decoder_start_token_id=ex["start"],
                               eos_token_id=ex.get("eos", eos), **pad)
    if sources != ex["sources"]:
        c.fail(f"generate_seq2seq changed the caller's sources: {ex['sources']} became {sources}", ex,
               ("sources changed",))
    return model, tokens_of(c, got, ex)


def truth_model(ex: dict, device) -> Seq2Seq:
    """The example's model with the grader's own uncached cross-attention: the same weights, by name."""
    return tiny_seq2seq(ex["seed"], device, CrossAttentionBlock, **ex.get("model", {}))


@torch.no_grad()
def greedy_alone(model, source: list[int], start: int, n: int) -> list[int]:
    """``n`` greedy tokens of ``source`` alone: the encoder on it unpadded, plain uncached decoder forwards."""
    enc = model.encode(torch.tensor([source], device=model.device))  # (1, S_enc, d)
    row = []
    for i in range(n):
        ids = torch.tensor([[start] + row], device=model.device)  # (1, i + 1)
        row.append(int(model.decode(ids, torch.arange(i + 1, device=model.device)[None], enc)[0, -1].argmax()))
    return row


@torch.no_grad()
def first_wrong(model, source: list[int], start: int, row: list[int], eos=None, tie: float = TIE):
    """The first token of ``row`` that greedy decoding of ``source`` alone (uncached, unpadded) would not give:
    ("token", i, token, best); ("eos", i) for a row that goes on after its EOS; None when neither."""
    if not row:
        return None
    enc = Seq2Seq.encode(model, torch.tensor([source], device=model.device))  # (1, S_enc, d)
    ids = torch.tensor([[start] + row[:-1]], device=model.device)  # (1, len(row))
    logits = Seq2Seq.decode(model, ids, torch.arange(len(row), device=model.device)[None], enc)[0]  # (len(row), V)
    for i, token in enumerate(row):
        best = int(logits[i].argmax())
        if not 0 <= token < logits.shape[-1] or logits[i, token] < logits[i, best] - tie:
            return ("token", i, token, best)
        if token == eos and i < len(row) - 1:
            return ("eos", i)
    return None


def verify(c, ex: dict, tokens: list[list[int]], eos=None) -> None:
    """Each row against its source decoded alone by the reference model: right tokens, the right length."""
    truth = truth_model(ex, c.device)
    eos = ex.get("eos", eos)
    for b, (source, row) in enumerate(zip(ex["sources"], tokens)):
        wrong = first_wrong(truth, source, ex["start"], row, eos)
        if wrong and wrong[0] == "token":
            _, i, token, best = wrong
            c.fail(f"row {b} (source {source}): new token {i} is {token}, but decoding that source alone gives "
                   f"{best} there (your row: {row})", ex, ("token", b, i, token))
        if wrong:
            c.fail(f"row {b} goes on after its EOS {eos} at new token {wrong[1]}: {row}", ex, ("after eos", b))
        if len(row) < ex["max_new_tokens"] and (eos is None or not row or row[-1] != eos):
            c.fail(f"row {b} stops after {len(row)} tokens without an EOS; max_new_tokens = {ex['max_new_tokens']} "
                   f"(your row: {row})", ex, ("short", b, len(row)))
        if len(row) > ex["max_new_tokens"]:
            c.fail(f"row {b} has {len(row)} tokens, more than max_new_tokens = {ex['max_new_tokens']}", ex,
                   ("long", b, len(row)))


class Counting(nn.Module):
    """A stand-in: row b's next token is (last token + len(source b)) mod V, by a margin (or by ``gap`` over the
    token just below it, a near-tie); ``encode`` returns each row's length, ``decode`` ignores the cache."""

    def __init__(self, vocab: int, device, gap: float | None = None):
        super().__init__()
        self.config = types.SimpleNamespace(vocab_size=vocab)
        self.anchor = nn.Parameter(torch.zeros(1, dtype=torch.float64, device=device), requires_grad=False)
        self.gap, self.encodes, self.decodes = gap, 0, 0

    @property
    def device(self):
        return self.anchor.device

    @property
    def dtype(self):
        return self.anchor.dtype

    def encode(self, src, mask=None):
        self.encodes += 1
        real = torch.ones_like(src, dtype=torch.bool) if mask is None else mask
        return real.sum(dim=1, keepdim=True)[:, :, None].to(self.dtype).expand(-1, src.shape[1], 1)  # (B, S, 1)

    def decode(self, ids, positions, encoder_out, encoder_mask=None, cache=None):
        self.decodes += 1
        V = self.config.vocab_size
        nxt = (ids + encoder_out[:, :1, 0].long()) % V  # (B, T)
        logits = torch.full((*ids.shape, V), -5.0, dtype=self.dtype, device=self.device)  # (B, T, V)
        logits.scatter_(-1, nxt[..., None], 5.0 if self.gap is None else 5.0 + self.gap)
        if self.gap is not None:  # the token just below the choice, a near-tie that a cast would merge
            logits.scatter_(-1, ((nxt - 1) % V)[..., None], 5.0)
        return logits


def counted(sources: list[list[int]], start: int, n: int, vocab: int, eos=None) -> list[list[int]]:
    """What greedy decoding of ``Counting`` gives each source (its own rule, written out)."""
    rows = []
    for source in sources:
        row, last = [], start
        while len(row) < n and not (row and eos is not None and row[-1] == eos):
            last = (last + len(source)) % vocab
            row.append(last)
        rows.append(row)
    return rows
