"""How kata 16's checks run the learner's workers: in two real gloo processes
(``grader.checks.support.gloo``), each worker of the learner facing either the other one or the
grader's own peer, written from the README's wire format alone:

- ``receiver``: reads the header at its fixed offsets, receives 2L tensors of the announced dtype and
  shape and the int64 trailer, and returns them as plain data;
- ``sender``: runs the prompt through the model with a plain cache and sends what the README says.

In the learner's process a spy stands in for ``torch.distributed``'s point-to-point functions
(``Wire``): it notes every message and every ``wait()``, and holds each ``isend`` until its ``wait()``
(or a later blocking send), then sends what the buffer holds at that moment — gloo may read an
``isend``'s buffer at any time until ``wait()``, so a buffer changed while in flight is caught every
time instead of now and then. A watched cache notes each layer's update in the same timeline.
"""
from __future__ import annotations

import inspect

import torch
import torch.distributed as dist

from grader.checks.support import gloo
from grader.engine.core import CheckTimeout, Failure, LearnerCrash, NotImplementedYet
from grader.engine import report

MAGIC, VERSION = 0x4B563136, 1
CODES = {1: torch.float32, 2: torch.float64, 3: torch.float16, 4: torch.bfloat16}
MAX_ELEMENTS = 1 << 24  # a header announcing more is not a cache the checks sent: refuse to allocate it


class _Held:
    """The handle a watched ``isend`` returns: the real send starts at ``wait()`` (or a later send)."""

    def __init__(self, wire: "Wire", index: int):
        self.wire, self.index = wire, index

    def wait(self, *args, **kwargs):
        self.wire.events.append(("wait", self.index))
        self.wire.flush(self.index)
        return True

    def is_completed(self):
        return self.index in self.wire.sent


class Wire:
    """Stands in for dist.send / dist.isend / dist.recv in one process; ``events`` is the timeline."""

    def __init__(self):
        self.events: list[tuple] = []
        self.messages: list[dict] = []  # every tensor sent: shape, dtype, contiguous, bytes, changed in flight
        self.held: list[tuple[int, torch.Tensor, torch.Tensor, object, object]] = []  # index, tensor, snapshot, dst, group
        self.sent: set[int] = set()
        self.works: list = []

    def install(self):
        dist.send, dist.isend = self.send, self.isend

    def _note(self, tensor, kind: str) -> int:
        index = len(self.messages)
        self.messages.append({"kind": kind, "shape": tuple(tensor.shape), "dtype": str(tensor.dtype).split(".")[-1],
                              "contiguous": tensor.is_contiguous(), "bytes": tensor.numel() * tensor.element_size(),
                              "changed": False})
        self.events.append((kind, index))
        return index

    def flush(self, upto: int) -> None:
        """Send every held isend up to ``upto``, in the order they were issued, reading their buffers now."""
        while self.held and self.held[0][0] <= upto:
            index, tensor, snapshot, dst, group = self.held.pop(0)
            if not torch.equal(tensor, snapshot):
                self.messages[index]["changed"] = True
            self.works.append(_REAL["isend"](tensor, dst, group=group))
            self.works[-1].wait()
            self.sent.add(index)

    def send(self, tensor, dst=None, group=None, tag=0, **kwargs):
        index = self._note(tensor, "send")
        self.flush(index)
        _REAL["send"](tensor, dst, group=group)
        self.sent.add(index)

    def isend(self, tensor, dst=None, group=None, tag=0, **kwargs):
        index = self._note(tensor, "isend")
        if not tensor.is_contiguous():
            _REAL["isend"](tensor, dst, group=group)  # gloo refuses it here, as it would
        self.held.append((index, tensor, tensor.detach().clone(), dst, group))
        return _Held(self, index)


_REAL = {"send": dist.send, "isend": dist.isend}


class WatchedCache:
    """Stands between the model and the learner's cache: notes each update in the wire's timeline as
    ("update", layer, tokens held before, tokens fed)."""

    def __init__(self, cache, wire: Wire):
        self._cache, self._wire = cache, wire

    def update(self, layer, k, v):
        at = len(self._wire.events)  # noted before the learner's update runs: what it sends comes after
        self._wire.events.append(("update", layer, None, int(k.shape[2])))
        K, V = self._cache.update(layer, k, v)
        self._wire.events[at] = ("update", layer, int(K.shape[2]) - int(k.shape[2]), int(k.shape[2]))
        return K, V

    def __getattr__(self, name):
        return getattr(self._cache, name)


def watched(model, wire: Wire):
    """``model`` whose forward hands the model a watched cache (and notes every forward in the timeline)."""
    forward = model.forward

    def spy(input_ids, position_ids=None, cache=None, *args, **kwargs):
        wire.events.append(("forward", int(input_ids.shape[-1]), None if position_ids is None else
                            position_ids.reshape(-1).tolist()))
        return forward(input_ids, position_ids, None if cache is None else WatchedCache(cache, wire), *args, **kwargs)
    model.forward = spy
    return model


# -- the grader's own peers --------------------------------------------------------------------------
def receiver(src: int = 0) -> dict:
    """Receive one prompt's messages as the README lays them out; plain data."""
    header = torch.empty(8, dtype=torch.int64)
    dist.recv(header, src)
    h = header.tolist()
    if h[0] != MAGIC or h[1] != VERSION or h[6] not in CODES or min(h[2:6]) < 1 or h[3] * h[4] * h[5] > MAX_ELEMENTS:
        return {"header": h, "kv": None, "first": None}
    kv = []
    for _ in range(2 * h[2]):
        buffer = torch.empty(1, h[4], h[3], h[5], dtype=CODES[h[6]])  # (1, Hkv, P, D)
        dist.recv(buffer, src)
        kv.append(buffer)
    first = torch.empty(1, dtype=torch.int64)
    dist.recv(first, src)
    return {"header": h, "kv": kv, "first": int(first)}


class PlainCache:
    def __init__(self):
        self.layers = {}  # layer -> (K, V), each (B, Hkv, S, D)

    def update(self, layer, k, v):
        if layer in self.layers:
            k, v = torch.cat([self.layers[layer][0], k], 2), torch.cat([self.layers[layer][1], v], 2)
        self.layers[layer] = (k, v)
        return k, v

    def seq_len(self, layer: int = 0) -> int:
        return self.layers[layer][0].shape[2] if layer in self.layers else 0


@torch.no_grad()
def prefill_alone(model, prompt: list[int]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """The prompt's (K, V) per layer, as the model stores them, and its greedy first token."""
    cache = PlainCache()
    logits = model(torch.tensor([prompt]), position_ids=torch.arange(len(prompt))[None], cache=cache)
    return [cache.layers[i] for i in range(len(cache.layers))], int(logits[0, -1].argmax())


def sender(model, prompt: list[int], dst: int = 1, header: list[int] | None = None) -> dict:
    """Send the prompt's cache as the README says (or ``header`` alone, when given: a bad one)."""
    if header is not None:  # a bad header, then zeros of the sizes it announces: a receiver that goes on never hangs
        dist.send(torch.tensor(header, dtype=torch.int64), dst)
        if header[6] in CODES and min(header[2:6]) >= 1:
            for _ in range(2 * header[2]):
                dist.send(torch.zeros(1, header[4], header[3], header[5], dtype=CODES[header[6]]), dst)
            dist.send(torch.zeros(1, dtype=torch.int64), dst)
        return {"sent": "header"}
    layers, first = prefill_alone(model, prompt)
    code = {dtype: code for code, dtype in CODES.items()}[model.dtype]
    cfg = model.config
    dist.send(torch.tensor([MAGIC, VERSION, cfg.num_hidden_layers, len(prompt), cfg.num_key_value_heads,
                            cfg.head_dim, code, 0], dtype=torch.int64), dst)
    for k, v in layers:
        dist.send(k.contiguous(), dst)
        dist.send(v.contiguous(), dst)
    dist.send(torch.tensor([first], dtype=torch.int64), dst)
    return {"sent": "all", "first": first}


# -- running a pair and reading its outcome -----------------------------------------------------------
def live(fn, *args, **kwargs):
    """``fn``, a learner's function fetched in this process, checked before it goes to a child: where it
    is not a live function (the cohort's replay stands in for it, knowing only what the learner's own
    process recorded), it is called here, where it answers at once that the learner's process must judge."""
    if not inspect.isfunction(fn):
        fn(*args, **kwargs)
    return fn


def pair(c, ex: dict, rank0, rank1, learner: tuple[int, ...]) -> list:
    """Run the two ranks; the values both returned. A learner rank that raised becomes its crash (or
    "not implemented yet"), a hang a timeout, a grader rank that failed a failure saying what it saw."""
    outcomes = gloo.run_pair(rank0, rank1)
    # The first failure is the cause: a rank that raised only because its peer left comes after the
    # peer's own error, and the learner's error before the grader's.
    for rank in sorted((0, 1), key=lambda r: (gloo.lost_peer(outcomes[r]), r not in learner)):
        o = outcomes[rank]
        if o.status == "raised" and rank in learner:
            _raise_learner(c, ex, o)
        if o.status == "raised" and not gloo.lost_peer(o):
            _grader_failed(c, ex, rank, o)
    for rank in (0, 1):
        o = outcomes[rank]
        if rank in learner and o.status == "hung":
            raise CheckTimeout()
        if o.status == "died":
            c.fail(f"rank {rank} ({'your worker' if rank in learner else 'the grader'}) ended without a result "
                   f"({o.message}): something called exit or crashed the process", ex, ("died", rank))
        if rank not in learner and o.status in ("raised", "hung"):
            _grader_failed(c, ex, rank, o)
    return [o.value for o in outcomes]


def _grader_failed(c, ex, rank: int, o) -> None:
    """The grader's own rank could not finish: what it saw of the learner's worker on the other side."""
    if rank == 1:  # the grader receives: what it saw of the learner's messages
        c.fail(f"the grader's peer (rank {rank}) could not complete the exchange with your worker: "
               f"{o.error or 'it waited past the deadline'}: {_first_line(o.message)}. The messages must be "
               "exactly the header, K0, V0, …, then the first token, each of the size the header announces",
               ex, ("peer failed", rank, o.error or "hung"), culprit="prefill_worker")
    c.fail(f"the grader's prefill side (rank {rank}) could not complete the exchange with your decode_worker: "
           f"{o.error or 'it waited past the deadline'}: {_first_line(o.message)}. Your worker must receive "
           "every message sent, in order: the header, then K0, V0, …, each into a buffer of the size and "
           "dtype the header announces, then the first token", ex, ("peer failed", rank, o.error or "hung"),
           culprit="decode_worker")


def _first_line(text: str) -> str:
    text = gloo.plain(text)
    return text.strip().splitlines()[0][:300] if text.strip() else ""


def _raise_learner(c, ex, o) -> None:
    if o.stub is not None and o.frames and c.target.owns(o.frames[-1][0]):
        raise NotImplementedYet(o.stub)
    mine = [f for f in o.frames if c.target.owns(f[0])]
    trace = "\n".join(f'  File "{f}", line {line}, in {name}' for f, line, name in mine)
    error = f"{o.error}: {_first_line(o.message)}"
    if not mine:
        raise Failure(f"on input {report.describe_input(ex)}\n  {report.GRADER_HIT.format(error=error)}",
                      ("grader-hit", o.error))
    raise LearnerCrash(f"on input {report.describe_input(ex)}\n  {report.CRASHED.format(error=error)}\n{trace}",
                       ("raised", o.error, _first_line(o.message)), trace)


def raised(o) -> tuple | None:
    """A rank's outcome as (error type, message) when it raised, else None."""
    return (o.error, o.message) if o.status == "raised" else None
