"""A stand-in accelerator for CPU-only machines: catches code that puts tensors on the CPU by accident.

On a GPU, ``torch.arange(n)`` without ``device=`` makes a CPU tensor, and the first op that
mixes it with the inputs raises "Expected all tensors to be on the same device". Without a
GPU every tensor is on the CPU, so that bug stays invisible. ``StandIn`` makes it visible:

- ``Remote``, a tensor subclass, reports the ``meta`` device but holds a real CPU tensor
  (``inner``) that every op computes on, so values, ``.item()``, ``.tolist()`` and
  data-dependent control flow work as on a GPU.
- While ``with StandIn():`` is active, every aten op goes through ``_run`` (a dispatch mode): a
  factory or ``.to()`` that targets ``meta`` makes a ``Remote``; an op with a ``Remote`` input
  returns ``Remote`` outputs; an op that mixes a ``Remote`` with a plain CPU tensor of one or
  more dimensions is refused as CUDA refuses it, and noted (``mixes``), even where the learner's
  code catches the error. ``torch.tensor(data, device=...)``, which places Python data without
  an aten op, is caught one level up (a function mode).

Only what CUDA itself refuses is refused: CPU scalars (0-d tensors) mix freely, a copy may
cross devices, and CPU tensors may index a device tensor. What the stand-in cannot run at all
(a generator on ``meta``, say) is no verdict: ``keeps_the_device`` then reruns on the CPU.
"""
from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from grader.engine import Failure, innermost_learner_function

STAND_IN = torch.device("meta")  # what the learner's code sees as ``x.device``
WHAT = "a stand-in for a GPU, shown as device 'meta'"  # how messages name it

aten = torch.ops.aten
CROSSING = {aten.copy_.default, aten._to_copy.default, aten.copy.default,  # copies may cross devices
            aten.lift_fresh.default, aten.lift_fresh_copy.default}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


@dataclass
class Mix:
    """One op that mixed devices: its name, the CPU operands' shapes, and where it was called from."""

    op: str
    cpu_operands: str
    stack: traceback.StackSummary
    label: str  # the call of the kata's API it happened in


class DeviceMix(RuntimeError):
    """An op mixed a tensor on the stand-in device with a CPU tensor, which CUDA refuses."""


class Remote(torch.Tensor):
    """A tensor that says it lives on the stand-in device; its data is the CPU tensor ``inner``."""

    inner: torch.Tensor
    __torch_function__ = torch._C._disabled_torch_function_impl  # ops go straight to __torch_dispatch__

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(),
            dtype=inner.dtype, layout=inner.layout, device=STAND_IN, requires_grad=inner.requires_grad)
        out.inner = inner
        return out

    def __repr__(self):
        return f"Remote({self.inner!r})"

    def tolist(self):  # as CUDA tensors do: the data comes back to the host
        return self.inner.tolist()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {}, None)


def _run(func, args, kwargs, mode: "_Ops | None"):
    """Run ``func`` on the inner CPU tensors; wrap what it returns when it belongs on the stand-in."""
    composite, at, writes = _facts(func)
    if composite:  # met under inference_mode: run its parts, as autograd mode would (x.type_as(y) is a move)
        with mode if mode is not None else contextlib.nullcontext():
            # The C++ kernel: Python decompositions (torch._decomp) may import sympy, seconds on first use.
            return func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
    remote = any(isinstance(x, Remote) for x in _tensors(args, kwargs))
    target = None if at is None else (args[at] if at < len(args) else kwargs.get("device"))
    to_stand_in = remote and target is None
    if target is not None and torch.device(target).type == STAND_IN.type:
        to_stand_in, cpu = True, torch.device("cpu")
        if at < len(args):
            args = (*args[:at], cpu, *args[at + 1:])
        else:
            kwargs = {**kwargs, "device": cpu}
    if remote and func not in CROSSING:
        _refuse_mixing(func, args, kwargs, mode)
    inner_args = _map(_unwrap, args)
    out = func(*inner_args, **{k: _map(_unwrap, v) for k, v in kwargs.items()})
    if writes:
        return _mutated(args, kwargs, out)
    if remote != to_stand_in and any(out is x for x in _tensors(inner_args, {})):
        out = out.clone()  # a move between devices copies: x.to(device) is never x itself
    return _map(Remote, out) if to_stand_in else out


_FACTS: dict = {}


def _facts(func) -> tuple[bool, int | None, bool]:
    """Of an aten op: written in other ops (CompositeImplicitAutograd)?, the position of its
    ``device`` argument (kwarg-only ones count after the positional ones), writes an argument?"""
    if func not in _FACTS:
        schema, name = func._schema, func.name()
        names = [a.name for a in schema.arguments]
        writes = schema.is_mutable or any(a.alias_info is not None and a.alias_info.is_write for a in schema.returns)
        _FACTS[func] = (torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd"),
                        names.index("device") if "device" in names else None, writes)
    return _FACTS[func]


def _tensors(args, kwargs):
    """The tensors among an op's arguments, including those in lists (an op's arguments nest no deeper)."""
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            yield from (v for v in x if isinstance(v, torch.Tensor))


def _map(fn, x):
    """``x`` with ``fn`` applied to every tensor inside lists and tuples."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, list):
        return [_map(fn, v) for v in x]
    if isinstance(x, tuple):
        return tuple(_map(fn, v) for v in x)
    return x


def _mutated(args, kwargs, out):
    """An in-place op returns the tensor it wrote (``out=``, else its first argument), not a new wrapper."""
    if "out" in kwargs:
        return kwargs["out"]
    first = args[0] if args else None
    if isinstance(out, torch.Tensor) and isinstance(first, torch.Tensor):
        return first
    return out


def _unwrap(x):
    return x.inner if isinstance(x, Remote) else x


def _refuse_mixing(func, args, kwargs, mode) -> None:
    """Raise (and note) when CUDA would: a CPU tensor of one or more dimensions among the operands."""
    operands = args[:1] + args[2:] if func in INDEXING else args  # the indices of an index op may be on the CPU
    cpu = [x for x in _tensors(operands, kwargs) if not isinstance(x, Remote) and x.dim() > 0]
    if not cpu:
        return
    name = func.overloadpacket.__name__
    shapes = ", ".join(f"{tuple(x.shape)} {str(x.dtype).replace('torch.', '')}" for x in cpu)
    message = (f"Expected all tensors to be on the same device, but found at least two devices, meta and cpu! "
               f"(torch op `{name}` got CPU tensor(s) {shapes} next to tensors on {WHAT})")
    if mode is not None:
        mode.mixes.append(Mix(name, shapes, traceback.extract_stack()[:-3], mode.label))
    raise DeviceMix(message)


class _Ops(TorchDispatchMode):
    """Routes every op through ``_run``; notes the ops that mixed devices."""

    def __init__(self):
        super().__init__()
        self.mixes: list[Mix] = []
        self.label = ""  # the API call running now, for messages

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # nothing here is compiled; guarding against it would import torch._dynamo (seconds)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {}, self)


CONSTRUCTORS = {torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor}


class _Constructors(TorchFunctionMode):
    """``torch.tensor(data, device=...)`` and its kin place Python data without any op the dispatch
    mode could see; build those on the CPU and wrap them instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in CONSTRUCTORS:
            return func(*args, **kwargs)
        if func is torch.Tensor.new_tensor:
            self_, data, rest = args[0], args[1], args[2:]
            device = kwargs.get("device", self_.device)
            kwargs = {"dtype": self_.dtype, **kwargs, "device": device}
            func, args = torch.tensor, (data, *rest)
        else:
            data = args[0]
            device = args[2] if func is torch.as_tensor and len(args) > 2 else kwargs.get("device")
        if isinstance(data, torch.Tensor) or device is None or torch.device(device).type != STAND_IN.type:
            return func(*args, **kwargs)  # a tensor's own move is an op the dispatch mode sees
        if func is torch.as_tensor and len(args) > 2:
            args = args[:2]
        return Remote(func(*args, **{**kwargs, "device": torch.device("cpu")}))


class StandIn:
    """While inside ``with StandIn() as dev:``, tensors on ``STAND_IN`` act as if on a separate device."""

    def __init__(self):
        self._ops, self._constructors = _Ops(), _Constructors()

    @property
    def mixes(self) -> list[Mix]:
        """The torch ops that mixed a CPU tensor with stand-in ones, in order."""
        return self._ops.mixes

    def running(self, label: str) -> None:
        """Name the API call that runs from now on; a mix is reported against it."""
        self._ops.label = label

    @property
    def label(self) -> str:
        return self._ops.label

    def __enter__(self) -> "StandIn":
        self._constructors.__enter__()
        self._ops.__enter__()
        return self

    def __exit__(self, *exc):
        self._ops.__exit__(*exc)
        self._constructors.__exit__(*exc)
        return False


def put(x):
    """``x`` (a tensor, or tuples and lists of them) moved to the stand-in device."""
    return _map(lambda t: Remote(t.detach().clone()), x)


def take(x):
    """``x`` with every stand-in tensor replaced by its CPU data, to compare outside the mode."""
    return _map(_unwrap, x)


def on_cpu(x, name: str = "the result") -> list[str]:
    """Where in ``x`` (a tensor, or nested tuples and lists) a tensor sits on the CPU, as readable paths."""
    if isinstance(x, Remote):
        return []
    if isinstance(x, torch.Tensor):
        return [name]
    if isinstance(x, (tuple, list)):
        return [p for i, v in enumerate(x) for p in on_cpu(v, f"{name}[{i}]")]
    return []


# -- running a kata's API on the stand-in ---------------------------------------------------------
ADVICE = ("create every tensor on the inputs' device (device=x.device, or the device= argument), "
          "or move it there with .to(x.device)")


class Session:
    """What a device scenario sees: ``device`` to build on, ``put`` for inputs, ``call`` for learner code.

    The same scenario also runs with ``device`` the CPU and nothing checked (``stand_in`` None),
    to tell a learner's crash apart from something the stand-in cannot run.
    """

    def __init__(self, ctx, stand_in: StandIn | None):
        self.ctx, self.stand_in, self.checking = ctx, stand_in, stand_in is not None
        self.device = STAND_IN if self.checking else torch.device("cpu")

    def running(self, label: str) -> None:
        if self.stand_in is not None:
            self.stand_in.running(label)

    def put(self, x):
        return put(x) if self.checking else x

    def call(self, label: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, the learner's code; what it returns must be on the device."""
        self.running(label)
        out = self.ctx.call(fn, *args, **kwargs)
        self.expect_on(out, label)
        return out

    def expect_on(self, value, label: str, what: str = "returned") -> None:
        """Fail when ``value`` holds a tensor on the CPU."""
        paths = on_cpu(value, "") if self.checking else []
        if paths:
            where = f" (at result{paths[0]})" if paths[0] else ""
            raise Failure(f"{label} {what} a tensor on the CPU{where}; it belongs on the device of the inputs, or "
                          f"the one given as device= ({WHAT}). {ADVICE[:1].upper()}{ADVICE[1:]}.",
                          ("device", "on cpu", label, paths[0]))


def keeps_the_device(ctx, ex: dict, scenario) -> None:
    """Run ``scenario(session)`` with its tensors on the stand-in device; fail on a CPU result or a mix.

    Anything else the stand-in trips over is rerun on the CPU: a crash there is the learner's
    (reported as any crash is), a clean run means the stand-in could not tell, and nothing is blamed.
    """
    stand_in = StandIn()
    try:
        with stand_in:
            scenario(Session(ctx, stand_in))
    except Failure:
        raise
    except Exception as exc:
        if isinstance(exc, NotImplementedError) and innermost_learner_function(exc, ctx.target):
            raise  # a stub: "not implemented yet"
        if not stand_in.mixes and _device_error(exc):  # a device check inside a torch kernel
            label, frames = stand_in.label, traceback.extract_tb(exc.__traceback__)
            raise Failure(_mixed(ctx, label, f"torch raised \"{exc}\"", frames),
                          ("device", "mixed", label, type(exc).__name__)) from None
        if not stand_in.mixes:
            scenario(Session(ctx, None))  # raises when the learner's code fails on the CPU as well
            return
    if stand_in.mixes:
        first = stand_in.mixes[0]
        raise Failure(_mixed(ctx, first.label, f"in torch op `{first.op}`", first.stack, first.cpu_operands),
                      ("device", "mixed", first.label, first.op))


def _device_error(exc: Exception) -> bool:
    """Whether ``exc`` is torch refusing tensors of the stand-in device next to CPU ones."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and "device" in text and "meta" in text and "cpu" in text


def _mixed(ctx, label: str, what: str, stack, cpu_operands: str = "") -> str:
    frames = [f for f in stack if ctx.target.owns(f.filename)]
    where = ""
    if frames:
        f = frames[-1]
        where = f", at line {f.lineno}" + (f": `{f.line.strip()}`" if f.line else "")
    operands = f" ({cpu_operands})" if cpu_operands else ""
    return (f"{label}: your code mixed a CPU tensor{operands} with tensors on the inputs' device, {what}{where}. "
            f"On a GPU this raises \"Expected all tensors to be on the same device\". "
            f"{ADVICE[:1].upper()}{ADVICE[1:]}. (The grader ran your code with its inputs on {WHAT}.)")


def module_on(session: Session, make, dtype=torch.float32):
    """``make()`` (a learner's nn.Module) built with fixed weights, then moved to the session's device.

    Built inside the stand-in, so that a tensor the module keeps outside its parameters and
    buffers stays on the CPU, as it would when a GPU user calls ``.to("cuda")``.
    """
    session.running("building the module and moving it with .to(device)")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        module = make()
    return module.to(device=session.device, dtype=dtype)
