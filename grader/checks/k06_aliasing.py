"""State and aliasing programs for kata 06, built with support/protocol.py and compared with the reference.

What the SPEC makes the caller's: the slots ``reserve`` returns and the list ``block_table`` returns (a later
call does not change them, changing them changes nothing inside), and what one cache returns while another
cache is written (two caches never share storage). Gathered keys and values may be views of the pages, valid
until the next call that changes *that* cache, so no program here writes into a gathered tensor or holds one
across a write to the same cache.

Block ids are free, so every result is made id-free (protocol.relabel) before it is compared: a block id becomes
a name in order of first appearance, a slot becomes (name of its block, offset).
"""
from __future__ import annotations

from grader.checks.k06_programs import new_kv
from grader.checks.support import protocol

GEOMETRY = {"num_blocks": 8, "block_size": 2, "layers": 2}


def prefilled(api, ex, tokens: int = 3):
    """A cache of GEOMETRY with sequence 0 holding ``tokens`` written tokens (every layer)."""
    cache = api.PagedKVCache(GEOMETRY["num_blocks"], GEOMETRY["block_size"], GEOMETRY["layers"], ex["heads"],
                             ex["head_dim"], dtype=ex["dtype"])
    cache.add_sequence(0)
    write(cache, ex, 0, tokens, step=0)
    return cache


def write(cache, ex, seq, n: int, step: int):
    """reserve(seq, n) and write every layer; returns the slots."""
    slots = cache.reserve(seq, n)
    for layer in range(GEOMETRY["layers"]):
        cache.write(layer, slots, *new_kv({**ex, "seed": ex["seed"] + 7 * seq}, step, layer, n, "cpu"))
    return slots


def _state(cache, seq) -> dict:
    return {f"block_table({seq})": cache.block_table(seq), f"seq_len({seq})": cache.seq_len(seq),
            "allocator.num_free": cache.allocator.num_free, f"gather({seq}, 1)": list(cache.gather(seq, 1))}


def table_changed_by_caller(api, ex):
    cache = prefilled(api, ex)
    program = protocol.changed_by_caller(lambda a, e: cache.block_table(0),
                                         lambda a, e: {"reserve(0, 2)": write(cache, ex, 0, 2, 1), **_state(cache, 0)},
                                         after="reserve(0, 2) + write")
    return protocol.relabel(program(api, ex), GEOMETRY["block_size"])


def slots_kept(api, ex):
    cache = prefilled(api, ex, tokens=1)
    program = protocol.kept(lambda a, e: cache.reserve(0, 2), lambda a, e: cache.reserve(0, 3),
                            held="the slots of reserve(0, 2)", after="reserve(0, 3)")
    return protocol.relabel(program(api, ex), GEOMETRY["block_size"])


def slots_changed_by_caller(api, ex):
    cache = prefilled(api, ex, tokens=1)
    program = protocol.changed_by_caller(lambda a, e: cache.reserve(0, 2),
                                         lambda a, e: {"reserve(0, 3)": cache.reserve(0, 3), **_state(cache, 0)},
                                         after="reserve(0, 3)")
    return protocol.relabel(program(api, ex), GEOMETRY["block_size"])


def two_caches(api, ex):
    def step(a, e, cache, i, n):
        write(cache, {**ex, "seed": ex["seed"] + 100 * i}, 0, 1 + n, step=n + 1)
        return _state(cache, 0)

    program = protocol.interleaved(lambda a, e, i: prefilled(a, {**ex, "seed": ex["seed"] + 100 * i}), step, steps=3)
    names: dict = {}  # each cache hands out its own ids: letters per instance
    return {key: protocol.relabel(value, GEOMETRY["block_size"], names.setdefault(key.split(",")[0], {}))
            for key, value in program(api, ex).items()}


def gathered_kept_across_caches(api, ex):
    first, other = prefilled(api, ex), prefilled(api, {**ex, "seed": ex["seed"] + 1})
    program = protocol.kept(lambda a, e: first.gather(0, 0),
                            lambda a, e: {"reserve(0, 3) + write": write(other, ex, 0, 3, 2), **_state(other, 0)},
                            held="gather(0, 0) of one cache", after="a write to another cache")
    return protocol.relabel(program(api, ex), GEOMETRY["block_size"])


PROGRAMS = {"block_table(0) overwritten by the caller, then reserve + write": table_changed_by_caller,
            "the slots of one reserve, kept while the next reserve runs": slots_kept,
            "the slots of one reserve overwritten by the caller, then reserve again": slots_changed_by_caller,
            "two caches driven in turn (reserve + write + gather each)": two_caches,
            "gather of one cache, kept while another cache is written": gathered_kept_across_caches}
