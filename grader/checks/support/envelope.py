"""One input envelope for the differential checks: the inputs learners' code meets beyond the drawn ones.

The drawn examples stay small (they are many, and they shrink well). On top of them a check runs a
few pinned cases, one per axis it declares, each once:

- ``large``: a few hundred tokens and 16 heads (the check says which fields make it large);
- ``half``: bfloat16 and float16 inputs; the result must keep the half dtype (SPEC: every function
  keeps its inputs' dtype);
- ``strided``: inputs that are non-contiguous views, as ``.transpose(1, 2)`` after a projection makes;
- ``magnitude``: activations a hundred times larger, so attention scores reach thousands (a softmax
  that exponentiates without subtracting the maximum overflows), in float32 and in float64.

Two axes declared together also run together where real code meets both: half × large (bfloat16
and float16 at positions past 256) and half × strided. Every float result is judged by the tolerance
derived from the computation (grader.engine.precision): ill-conditioned cases widen it by as much as
they widen the reference's own error, well-conditioned ones keep the dtype's floor.

A body draws its tensors with :func:`tensor`, which honours the case's dtype, layout and scale.

For greedy choices, :func:`near_tie` gives a float64 model whose every greedy pick beats the next lower
id by ``NEAR_TIE``: more than the checks' tie tolerance (1e-9), less than float32's resolution at 1, so
a loop that casts float64 logits to float32 before its argmax picks the lower id and fails.
"""
from __future__ import annotations

import torch
from torch import nn

from grader.checks.support.common import randn

AXES = ("large", "half", "strided", "magnitude")
HALF = (torch.bfloat16, torch.float16)
MAGNITUDE = 100.0
NEAR_TIE = 1e-8  # distinct in float64; 1 + 1e-8 rounds to 1 in float32


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cases(base: dict, axes: tuple[str, ...], large: dict | None = None) -> list[tuple[str, dict]]:
    """(what, example) for each axis in ``axes`` and each pair of them run together, derived from ``base``;
    ``large`` overrides for the large cases."""
    unknown = [a for a in axes if a not in AXES]
    if unknown:
        raise ValueError(f"axes: expected some of {', '.join(AXES)}, got {', '.join(unknown)}")
    found = []
    if "large" in axes:
        if not large:
            raise ValueError("large: expected the fields that make the example large, got none")
        found.append(("a large input", {**base, **large}))
    if "half" in axes:
        found += [(f"{_name(d)} inputs", {**base, "dtype": d}) for d in HALF]
        if "large" in axes:
            found += [(f"a large input in {_name(d)}", {**base, **large, "dtype": d}) for d in HALF]
        if "strided" in axes:
            found += [(f"non-contiguous {_name(d)} inputs", {**base, "dtype": d, "strided": True}) for d in HALF]
    if "strided" in axes:
        found.append(("non-contiguous inputs (transposed views)", {**base, "strided": True}))
    if "magnitude" in axes:
        found += [(f"activations {MAGNITUDE:g} times larger in {_name(d)}", {**base, "scale": MAGNITUDE, "dtype": d})
                  for d in (torch.float32, torch.float64)]
    return found

def tensor(ex: dict, seed: int, *shape: int, device="cpu") -> torch.Tensor:
    """Seeded noise for ``ex``: its dtype (rounded through ``ex["rounded"]`` first when set), its scale,
    and for a strided case a view with axes 1 and 2 (0 and 1 for 2-D shapes) swapped in memory."""
    scale = ex.get("scale", 1.0)
    if ex.get("strided") and len(shape) >= 2:
        a, b = (1, 2) if len(shape) >= 3 else (0, 1)
        stored = list(shape)
        stored[a], stored[b] = stored[b], stored[a]
        x = randn(seed, *stored, scale=scale).transpose(a, b)
    else:
        x = randn(seed, *shape, scale=scale)
    if ex.get("rounded") is not None:
        x = x.to(ex["rounded"]).to(torch.float64)
    return x.to(device=device, dtype=ex["dtype"])


def run(ctx, base: dict, axes: tuple[str, ...], body, large: dict | None = None) -> None:
    """Run ``body(ctx, example)`` once on each envelope case of ``base``."""
    for _, example in cases(base, axes, large):
        ctx.case(example, body)


class NearTieHead(nn.Module):
    """Wraps an LM head: each row's logits shifted so its best is 1 + NEAR_TIE and the next lower id's
    exactly 1 (a best id 0 moves to id 1, so a lower id always exists); every other logit stays below."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self.head = head

    @property
    def weight(self) -> torch.Tensor:  # the model reads its device and dtype here
        return self.head.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.head(h)  # (B, T, V)
        best = logits.argmax(-1, keepdim=True).clamp(min=1)  # (B, T, 1)
        out = logits - logits.amax(-1, keepdim=True) + 1.0  # the best at 1, the rest below
        return out.scatter(-1, best - 1, 1.0).scatter(-1, best, 1.0 + NEAR_TIE)  # (B, T, V)


def near_tie(model: nn.Module) -> nn.Module:
    """``model`` (a float64 ``grader.nn.Llama``) with its ``lm_head`` wrapped in :class:`NearTieHead`."""
    model.lm_head = NearTieHead(model.lm_head)
    return model
