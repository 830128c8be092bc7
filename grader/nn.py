"""Shared building blocks the katas import: rotary position embeddings (and, later, a Llama model).

Shapes use fixed letters: B batch, H heads, T new tokens, S cached tokens, D head width.
"""
from __future__ import annotations

import torch


def rope_inv_freq(head_dim: int, base: float = 10000.0, device=None, dtype=torch.float32) -> torch.Tensor:
    """Inverse frequencies ``base ** (-arange(0, D, 2) / D)``, shape (D/2,)."""
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim: expected a positive even number, got {head_dim}")
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim
    return (base ** -exponents).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the last axis, halves taken as the first and second half."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate ``x`` (..., T, D) by the angles of ``positions``; rotate-half convention (Llama).

    ``positions`` is (T,) — the same positions for every row — or (B, T) for ``x`` of shape
    (B, H, T, D), one row of positions per batch row. Returns a new tensor of ``x``'s dtype.
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError(f"x: expected a tensor (..., T, D), got {_describe(x)}")
    positions = torch.as_tensor(positions, device=x.device)
    if positions.dim() not in (1, 2) or positions.shape[-1] != x.shape[-2]:
        raise ValueError(
            f"positions: expected shape (T,) or (B, T) with T = {x.shape[-2]}, got {tuple(positions.shape)}"
        )
    if positions.dim() == 2 and (x.dim() != 4 or positions.shape[0] != x.shape[0]):
        raise ValueError(
            f"positions: a (B, T) tensor needs x of shape (B, H, T, D) with B = {positions.shape[0]}, "
            f"got x {tuple(x.shape)}"
        )
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv_freq = rope_inv_freq(x.shape[-1], base, device=x.device, dtype=work)
    angles = positions.to(work)[..., None] * inv_freq  # (T, D/2) or (B, T, D/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, D) or (B, T, D)
    if positions.dim() == 2:
        angles = angles[:, None]  # (B, 1, T, D)
    cos, sin = angles.cos(), angles.sin()
    rotated = x.to(work) * cos + rotate_half(x.to(work)) * sin
    return rotated.to(x.dtype)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__}"
