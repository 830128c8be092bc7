"""Kata 06's paged cache with a fast decode step, for the benchmark's append figures only.

The lesson (``solutions/06/paged.py``, which ``grader.paged`` loads) writes every batch of tokens
the same plain way: the slots' range checked with two reductions, block and offset computed as
tensors, then a scatter (on a GPU, after a copy of the indices to it). For one token, as in a
decode step, that is a handful of small operations for a copy of ``H * D`` numbers. Here one token
takes one read of its slot and a slice assignment; everything else, bad input included, is the
lesson's own code.
Grading never uses this class. ``tests/test_bench.py`` proves that it agrees with the lesson.
"""
from __future__ import annotations

import torch

from grader.paged import PagedKVCache


class FastPagedKVCache(PagedKVCache):
    """``PagedKVCache`` whose one-token ``write`` is a slice assignment instead of a scatter."""

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        one = (self.n_kv_heads, 1, self.head_dim)  # (H, 1, D)
        plain = not (isinstance(layer, int) and 0 <= layer < self.n_layers
                     and isinstance(slots, torch.Tensor) and slots.shape == (1,) and not slots.is_floating_point()
                     and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.shape == one == v.shape)
        slot = None if plain else slots.item()  # a Python int (the lesson's slots are on the CPU)
        if plain or not 0 <= slot < self.allocator.num_blocks * self.block_size:
            return super().write(layer, slots, k, v)  # many tokens or bad input: the lesson decides
        block, offset = divmod(slot, self.block_size)
        pages_k, pages_v = self.k_pages[layer], self.v_pages[layer]
        pages_k[block, :, offset:offset + 1] = k  # (H, 1, D) into (N, H, P, D)
        pages_v[block, :, offset:offset + 1] = v
