"""``kvkata bench``, beam search (kata 11): the blocks a search really holds when every beam shares
the prompt's blocks, against a dense cache of its own per beam, for 4 and 8 beams on a long prompt.

Runs the reference beam search over a ``grader.paged.PagedKVCache`` that notes its peak number of
blocks in use; the dense figure is what one contiguous cache per beam holds for the same tokens.
"""
from __future__ import annotations

import math
import time

import torch

from grader import manifest
from grader.engine import targets
from grader.bench.shared import GENERATE_CONFIG
from grader.nn import Llama, LlamaConfig
from grader.paged import PagedKVCache

BLOCK_SIZE = 16


class _PeakCache(PagedKVCache):
    """A paged cache that remembers the most blocks it ever had in use."""

    peak = 0

    def reserve(self, seq_id, n_tokens):
        slots = super().reserve(seq_id, n_tokens)
        self.peak = max(self.peak, self.k_pages[0].shape[0] - self.allocator.num_free)
        return slots


BEAMS = (4, 8)


def steps() -> int:
    """Progress lines ``bench_beam`` prints."""
    return len(BEAMS)


def bench_beam(device: torch.device, progress, quick: bool, beams=BEAMS) -> list[dict]:
    """One row per beam count: peak shared blocks, dense blocks, both in bytes, and the search time."""

    prompt_len, new_tokens = (256, 16) if quick else (1024, 32)
    torch.manual_seed(0)
    config = LlamaConfig(**{**GENERATE_CONFIG, "max_position_embeddings": prompt_len + new_tokens})
    model = Llama(config).to(device).eval()
    prompt = torch.randint(0, config.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    beam_search = targets.reference(manifest.get("11")).namespace["beam_search"]
    element = torch.empty((), dtype=model.dtype).element_size()
    block_bytes = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * BLOCK_SIZE * element
    longest = prompt_len + new_tokens - 1  # the last new token is never fed back
    rows = []
    for k in beams:
        dense = k * math.ceil(longest / BLOCK_SIZE)  # one cache per beam, each holding the whole prompt
        cache = _PeakCache(dense + 1, BLOCK_SIZE, config.num_hidden_layers, config.num_key_value_heads,
                           config.head_dim, dtype=model.dtype, device=device)
        started = time.perf_counter()
        hypotheses = beam_search(model, prompt, k, new_tokens, cache=cache)
        seconds = time.perf_counter() - started
        rows.append({"beams": k, "prompt": prompt_len, "new_tokens": new_tokens, "block_size": BLOCK_SIZE,
                     "shared_blocks": cache.peak, "dense_blocks": dense,
                     "shared_bytes": cache.peak * block_bytes, "dense_bytes": dense * block_bytes,
                     "hypotheses": len(hypotheses), "seconds": round(seconds, 3)})
        progress.step(f"beam search {k} beams", f"{cache.peak} blocks shared vs {dense} dense "
                      f"({cache.peak / dense:.0%})")  # the blocks are the result; one run's seconds are no timing
    return rows
