"""A real model's projections in the layout and kernel this CPU reads fastest for the rows at hand.

A decode step is a chain of skinny products, a row (or a few) times every weight matrix, so its time is the
time the weights take to read; how fast a CPU's BLAS reads a matrix depends on how the matrix is stored and
which kernel reads it, and the best choice changes with the rows per call. On SmolLM2's 211 matrices with one
thread (``kvkata bench --roofline --real-model`` prints this machine's figures), the plain product reads the
(out, in) weights at one row about 1.2–1.4x slower than the same product on a copy stored (in, out) or
oneDNN's linear on a packed copy, and at 8 to 64 rows oneDNN is fastest, up to about 1.9x at 8 rows.

``tune(model)`` times the model's projections (enough of them in order to leave the CPU's caches, and every
shape) under each kernel at a few row counts (``ROWS``), chooses a kernel per row count, and makes each
projection use, on every call, the choice for the nearest row count measured. A kernel whose output differs
from the plain product's by more than float32 rounding on the probe is never chosen, and a plan holds at most
``MAX_COPIES`` extra copies of the weights (the one that loses least to the fastest kernel at each row count).
The choice is kept per machine, torch, thread count and shapes in a JSON file (``remember``), so only the first
load of a model on a machine measures. The weights' values, the parameters and their names, the ``state_dict``
and a tied head stay as they are: a copy is used only while the weight is the one it was made from (the same
storage, device and dtype, and no in-place write since: ``Tensor._version``); otherwise, and whenever autograd
needs the weight, the plain product runs. ``KVKATA_KERNELS=plain`` turns it all off.

Projections that a model calls one after another on one input (attention's q, k and v; the MLP's gate and
up: ``GROUPS``) are read as one product over their weights stacked, in the same kernel and layout, each
member's output its columns of it: on SmolLM2 at one row, the matmuls alone run about 1.1x faster so than
apart (``kvkata bench --roofline --real-model`` times both). A group fuses only once it has seen its members
come in order on the same tensor, unwritten since, and parts for good at the first call that breaks that
pattern (see ``_Group``); its stacked copy takes the place of its members' own copies, so the plan still
holds one extra copy of the weights.

Only models loaded from a checkpoint are tuned (``grader.models.load``, ``grader.whisper.load``) and the bench's
own: the graders' small models fit in the CPU's caches, where the layout changes little and the timing would
cost more than it saves. On CUDA nothing changes.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import platform
import statistics
import time
import weakref
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakTensorKeyDictionary

ROWS = (1, 8, 64)  # rows per call measured: a decode step at batch 1, a small batch, a prefill's chunk
KERNELS = ("stored", "transposed", "onednn")
SAMPLE_BYTES = 64 * 2**20  # the projections timed: at least this many bytes, more than a CPU's caches hold
ENV = "KVKATA_KERNELS"  # auto (the default), plain or measure: see ``tune``
MAX_COPIES = 1  # extra copies of the weights a model may hold (SmolLM2: 540 MB each in float32)
PACK_ROWS = 8  # oneDNN packs a weight for a row count: one packing, for a small batch, serves every call
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # sibling projections fused (``_Group``)
_PLANS = WeakTensorKeyDictionary()  # weight -> its _Plan


class _Plan:
    """The kernel per row count for one weight, and the copies those kernels read (one per kernel). A member of
    a ``_Group`` holds no copy of its own: the group's stacked copy serves it, and should the group part, the
    member makes its copy on its next call."""

    def __init__(self, weight: torch.Tensor, choice: dict[int, str], made: dict | None = None,
                 group: _Group | None = None, member: int = 0):
        self.choice, made = dict(choice), made or {}
        self.group, self.member = group, member
        kinds = set(self.choice.values()) if group is None else set()
        self.copies = {k: made[k] if k in made else _copy(weight, k) for k in kinds}
        self.stamp = _stamp(weight)

    def fresh(self, weight: torch.Tensor) -> bool:
        return self.stamp == _stamp(weight)

    def copy(self, weight: torch.Tensor, kernel: str):
        if kernel not in self.copies:
            with torch.no_grad():
                self.copies[kernel] = _copy(weight, kernel)
        return self.copies[kernel]


class _Group:
    """Sibling projections read as one product over their weights stacked (``GROUPS``), each member's output
    its columns of that product.

    It fuses only what it has seen. While it watches, each member runs its own (plain) product, and the group
    notes whether the members came in order, each on the tensor the first one got (the same object, with no
    in-place write since: ``_written``). Once they have, the first member's call runs the stacked product and
    keeps the columns for the others' calls. A call that breaks the pattern (another input, another order,
    columns left unasked for when the first member comes again, a member's weight changed) runs its own
    product and parts the group for good: a layer that calls its projections apart, such as a
    cross-attention whose keys and values read the encoder and whose queries the decoder, keeps them apart.
    Outputs are fresh contiguous tensors, as ``F.linear`` gives them."""

    def __init__(self, weights: list[torch.Tensor], kinds: Iterable[str]):
        self.refs = [weakref.ref(w) for w in weights]
        self.stamps = [_stamp(w) for w in weights]
        ends = list(itertools.accumulate(w.shape[0] for w in weights))
        self.columns = list(zip([0] + ends[:-1], ends))
        with torch.no_grad():
            stacked = torch.cat([w.detach() for w in weights])
            self.copies = {k: _copy(stacked, k) for k in kinds}
        self.state, self.seen, self.held, self.fused = "watch", None, None, 0

    def take(self, member: int, x: torch.Tensor, kernel: str) -> torch.Tensor | None:
        """``member``'s product of ``x`` from the stacked one, or None: the member runs its own."""
        if self.state == "fused" and kernel in self.copies:
            if member == 0 and self.held is None and self._fresh():
                product = _run(x, None, None, kernel, self.copies[kernel])
                self.held = (x, _written(x), product, set(range(1, len(self.refs))))
                self.fused += 1
                return self._columns(0)
            if member > 0 and self.held is not None and self.held[0] is x and self.held[1] == _written(x) \
                    and member in self.held[3]:
                self.held[3].discard(member)
                out = self._columns(member)
                if not self.held[3]:
                    self.held = None
                return out
        elif self.state == "watch":
            if member == 0 and self.seen is None:
                self.seen = (x, _written(x), 1)
                return None
            if member > 0 and self.seen is not None and self.seen[0] is x and self.seen[1] == _written(x) \
                    and self.seen[2] == member:
                self.seen = (x, _written(x), member + 1) if member + 1 < len(self.refs) else None
                self.state = "watch" if self.seen is not None else "fused"
                return None
        self.part()
        return None

    def _columns(self, member: int) -> torch.Tensor:
        start, end = self.columns[member]
        return self.held[2][..., start:end].contiguous()

    def _fresh(self) -> bool:
        return all(r() is not None and _stamp(r()) == s for r, s in zip(self.refs, self.stamps))

    def part(self) -> None:
        self.state, self.seen, self.held, self.copies = "apart", None, None, {}


def _written(x: torch.Tensor) -> int | None:
    """How often ``x`` was written in place; None for an inference tensor, which keeps no count
    (``torch.inference_mode``): there the same tensor object is taken as unwritten between sibling calls."""
    return None if x.is_inference() else x._version


def _stamp(weight: torch.Tensor) -> tuple:
    return weight.untyped_storage().data_ptr(), weight.device, weight.dtype, weight._version, weight.shape


def _copy(weight: torch.Tensor, kernel: str):
    """What ``kernel`` reads: nothing new for the plain product, the (in, out) copy, or oneDNN's packing."""
    if kernel == "stored":
        return None
    if kernel == "transposed":
        return weight.detach().t().contiguous()
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


def _run(x: torch.Tensor, weight: torch.Tensor, bias, kernel: str, copy) -> torch.Tensor:
    if kernel == "transposed":
        return F.linear(x, copy.t(), bias)
    if kernel == "onednn":
        return torch.ops.mkldnn._linear_pointwise(x, copy, bias, "none", [], "")
    return F.linear(x, weight, bias)


def linear_with(x: torch.Tensor, copy, kernel: str) -> torch.Tensor:
    """The product of ``x`` with a weight through ``kernel``, reading only ``copy`` (``copies_for``'s, not plain)."""
    return _run(x, None, None, kernel, copy)


def nearest(rows: int, measured: Iterable[int]) -> int:
    return min(measured, key=lambda r: (abs(math.log2(max(rows, 1) / r)), -r))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, with the kernel ``tune`` chose for ``weight`` at ``x``'s row count."""
    plan = _PLANS.get(weight)
    if plan is None or x.dtype != weight.dtype or (torch.is_grad_enabled() and weight.requires_grad) \
            or not plan.fresh(weight):
        return F.linear(x, weight, bias)
    kernel = plan.choice[nearest(x.numel() // max(x.shape[-1], 1), plan.choice)]
    if kernel == "stored":
        return F.linear(x, weight, bias)
    group = plan.group
    if group is not None and group.state != "apart":
        out = group.take(plan.member, x, kernel)
        if out is not None:
            return out if bias is None else out + bias
        if group.state != "apart":  # still watching: no copy of its own to read
            return F.linear(x, weight, bias)
    return _run(x, weight, bias, kernel, plan.copy(weight, kernel))


class TunedLinear(nn.Linear):
    """An ``nn.Linear`` whose product runs through ``linear`` (same parameters, names and state)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def projections(model: nn.Module, extra: Iterable[torch.Tensor] = ()) -> list[tuple[torch.Tensor, object]]:
    """(weight, bias) of every ``nn.Linear`` of ``model`` in order, then ``extra`` weights (a head that is a
    product with an embedding); a weight shared by two (a tied head) once."""
    seen, out = set(), []
    pairs = [(m.weight, m.bias) for m in model.modules() if isinstance(m, nn.Linear)] + [(w, None) for w in extra]
    for weight, bias in pairs:
        if id(weight) not in seen:
            seen.add(id(weight))
            out.append((weight, bias))
    return out


def groups(model: nn.Module) -> list[list[nn.Linear]]:
    """Sibling projections named as in ``GROUPS``, of one module, reading inputs of one width, dtype and device:
    those ``install`` may read as one product."""
    out = []
    for module in model.modules():
        for names in GROUPS:
            siblings = [getattr(module, name, None) for name in names]
            if all(isinstance(m, nn.Linear) for m in siblings) and \
                    len({(m.in_features, m.weight.dtype, m.weight.device) for m in siblings}) == 1:
                out.append(siblings)
    return out


def stacked(model: nn.Module, extra: Iterable[torch.Tensor] = ()) -> list[tuple[torch.Tensor, object]]:
    """``projections(model, extra)`` with each of ``groups(model)`` as one weight, its members' stacked (a
    copy): the products a step runs once every group fuses, to time them alone."""
    first, members = {}, set()
    for siblings in groups(model):
        ids = [id(m.weight) for m in siblings]
        if not members.intersection(ids):
            members.update(ids)
            first[ids[0]] = torch.cat([m.weight.detach() for m in siblings])
    return [(first[id(w)], None) if id(w) in first else (w, b) for w, b in projections(model, extra)
            if id(w) in first or id(w) not in members]


def fused(model: nn.Module) -> tuple[int, int]:
    """How many of ``model``'s groups read one stacked product now, of how many installed."""
    plans = [_PLANS.get(m.weight) for siblings in groups(model) for m in siblings[:1]]
    installed = [p.group for p in plans if p is not None and p.group is not None]
    return sum(g.state == "fused" for g in installed), len(installed)


def supported(weights: list[torch.Tensor]) -> tuple[str, ...]:
    """The kernels that can run these weights here: all on the CPU in float32 or bfloat16, else the plain one."""
    if not weights or any(w.device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16) for w in weights):
        return ("stored",)
    return KERNELS if torch.backends.mkldnn.is_available() else ("stored", "transposed")


def measure(pairs, rows_list=ROWS, kernels: tuple[str, ...] | None = None, repeats: int = 3,
            copies: dict | None = None) -> dict:
    """Seconds per pass over ``pairs`` for each row count and kernel (the median of ``repeats``, the kernels
    alternating within each repeat), and which kernels agree with the plain product on the probe. ``copies``
    (kernel -> one copy per weight, as ``copies_for`` makes them) are made here when not given."""
    weights = [w for w, _ in pairs]
    kernels = supported(weights) if kernels is None else kernels
    copies = copies_for(weights, kernels) if copies is None else copies
    seconds, agrees = {}, {}
    with torch.no_grad():
        for rows in rows_list:
            probes = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}
            passes = {k: _pass(pairs, probes, k, copies[k]) for k in kernels}
            plain = passes["stored"]()
            agrees[rows] = {k: _agree(plain, passes[k](), weights) for k in kernels}
            times = {k: [] for k in kernels}
            for _ in range(repeats):
                for k in kernels:
                    started = time.perf_counter()
                    passes[k]()
                    times[k].append(time.perf_counter() - started)
            seconds[rows] = {k: statistics.median(t) for k, t in times.items()}
    return {"seconds": seconds, "agrees": agrees,
            "bytes": sum(w.numel() * w.element_size() for w in weights)}


def copies_for(weights: list[torch.Tensor], kernels: Iterable[str]) -> dict[str, list]:
    """kernel -> what it reads for each weight."""
    with torch.no_grad():
        return {k: [_copy(w, k) for w in weights] for k in kernels}


def _pass(pairs, probes: dict, kernel: str, copies: list):
    return lambda: [_run(probes[w.shape[1]], w, b, kernel, c) for (w, b), c in zip(pairs, copies)]


def _agree(plain: list, other: list, weights) -> bool:
    """Within float32 rounding of the plain product: a few units in the last place of each output's largest
    term (``|x|·|w|`` summed along the row bounds every partial sum a kernel may round)."""
    for a, b, w in zip(plain, other, weights):
        eps = torch.finfo(w.dtype).eps
        if (a - b).abs().max() > 8 * eps * w.shape[1] * max(a.abs().max().item(), 1.0):
            return False
    return True


def choose(measured: dict, copies: int = MAX_COPIES) -> dict[int, str]:
    """A kernel per row count, among those that agree, reading at most ``copies`` extra copies of the weights:
    of the plans that keep to it, the one whose times lose least to the fastest kernel at each row count (the
    sum of the logarithms of the ratios; the plain product needs no copy)."""
    seconds, agrees = measured["seconds"], measured["agrees"]
    fastest = {r: min(t[k] for k in t if agrees[r][k]) for r, t in seconds.items()}
    others = sorted({k for t in seconds.values() for k in t if k != "stored"}, key=KERNELS.index)
    plans = []
    for extra in itertools.combinations(others, min(copies, len(others))):
        allowed = {"stored", *extra}
        plan = {r: min((k for k in t if k in allowed and agrees[r][k]), key=t.get) for r, t in seconds.items()}
        plans.append((sum(math.log(seconds[r][k] / fastest[r]) for r, k in plan.items()), plan))
    return min(plans, key=lambda cost_plan: cost_plan[0])[1]


def tune(model: nn.Module, extra: Iterable[torch.Tensor] = (), remember: Path | None = None,
         rows_list=ROWS, repeats: int = 3) -> dict:
    """Measure, choose and install (see the module's docstring); the measurement and the choice. With
    ``remember`` (a JSON file), a choice made before for the same machine, torch, threads and shapes is taken
    from it without measuring, and a new one is written there. ``KVKATA_KERNELS`` (``ENV``) set to ``plain``
    tunes nothing; set to ``measure``, measures even where a choice is remembered."""
    mode = os.environ.get(ENV, "auto")
    if mode not in ("auto", "plain", "measure"):
        raise ValueError(f"{ENV}={mode!r}: expected auto, plain or measure")
    pairs = projections(model, extra)
    weights = [w for w, _ in pairs]
    kernels = supported(weights)
    if mode == "plain" or kernels == ("stored",):
        return {"choice": {}, "remembered": False, "seconds": {}}
    key = _machine_key(weights)
    known = _recall(remember, key) if mode == "auto" else None
    if known is not None:
        install(model, known, weights)
        return {"choice": known, "remembered": True, "seconds": {}}
    copies = copies_for(weights, kernels)
    measured = measure(_sample(pairs), rows_list, kernels, repeats, _sample_copies(pairs, copies))
    choice = choose(measured)
    install(model, choice, weights, {k: c for k, c in copies.items() if k in choice.values()})
    _keep(remember, key, choice)
    return {**measured, "choice": choice, "remembered": False}


def _sample(pairs: list) -> list:
    """The projections timed: the first ones in order up to ``SAMPLE_BYTES``, then the first of every shape
    not in yet (a tied head, the MLP's): enough to leave the CPU's caches, each kind of matrix read."""
    picked, total, shapes = [], 0, set()
    for i, (weight, _) in enumerate(pairs):
        if total < SAMPLE_BYTES or tuple(weight.shape) not in shapes:
            picked.append(i)
            total += weight.numel() * weight.element_size()
            shapes.add(tuple(weight.shape))
    return [pairs[i] for i in picked]


def _sample_copies(pairs: list, copies: dict[str, list]) -> dict[str, list]:
    index = {id(w): i for i, (w, _) in enumerate(pairs)}
    return {k: [c[index[id(w)]] for w, _ in _sample(pairs)] for k, c in copies.items()}


def _machine_key(weights: list[torch.Tensor]) -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")),
               platform.processor() or platform.machine())
    shapes = sorted({(*w.shape, str(w.dtype)) for w in weights})
    return f"{cpu} · {os.cpu_count()} CPUs · torch {torch.__version__} · {torch.get_num_threads()} threads · {shapes}"


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def _recall(path: Path | None, key: str) -> dict[int, str] | None:
    if path is None:
        return None
    try:
        known = json.loads(path.read_text(encoding="utf-8")).get(key)
        choice = {int(rows): kernel for rows, kernel in known.items()} if isinstance(known, dict) else None
    except (OSError, ValueError, AttributeError):
        return None
    return choice if choice and set(choice.values()) <= set(KERNELS) else None


def _keep(path: Path | None, key: str, choice: dict[int, str]) -> None:
    """Remember the choice beside the others (a file that cannot be written only costs a measurement later)."""
    if path is None:
        return
    try:
        known = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    known[key] = {str(rows): kernel for rows, kernel in choice.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        fresh.write_text(json.dumps(known, indent=1) + "\n", encoding="utf-8")
        os.replace(fresh, path)
    except OSError:
        pass


def install(model: nn.Module, choice: dict[int, str], weights: Iterable[torch.Tensor],
            copies: dict[str, list] | None = None) -> None:
    """Make ``model``'s projections use ``choice`` (row count -> kernel) for ``weights``; ``copies`` (as
    ``copies_for`` makes them, for the same weights in order) are used rather than made again."""
    copies, weights = copies or {}, list(weights)
    member = {}  # id(weight) -> (its group, its place in it)
    kinds = set(choice.values()) - {"stored"}
    for siblings in groups(model) if kinds else ():
        stacked = [m.weight for m in siblings]
        if all(id(w) in map(id, weights) and id(w) not in member for w in stacked):
            group = _Group(stacked, kinds)
            member.update({id(w): (group, j) for j, w in enumerate(stacked)})
    for i, weight in enumerate(weights):
        _PLANS[weight] = _Plan(weight, choice, {k: c[i] for k, c in copies.items()}, *member.get(id(weight), ()))
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = TunedLinear


@contextlib.contextmanager
def plain(model: nn.Module, extra: Iterable[torch.Tensor] = ()):
    """Within the block, ``model``'s products run plain (the plans are set aside, then put back)."""
    kept = {}
    for weight, _ in projections(model, extra):
        plan = _PLANS.pop(weight, None)
        if plan is not None:
            kept[weight] = plan
    try:
        yield
    finally:
        for weight, plan in kept.items():
            _PLANS[weight] = plan


def forget(weights: Iterable[torch.Tensor]) -> None:
    """Drop the plans of ``weights`` (and their copies): their products run plain from now on."""
    for weight in weights:
        _PLANS.pop(weight, None)


def chosen(weight: torch.Tensor) -> dict[int, str] | None:
    """The kernel per row count ``tune`` chose for ``weight`` (None: the plain product)."""
    plan = _PLANS.get(weight)
    return dict(plan.choice) if plan is not None else None
