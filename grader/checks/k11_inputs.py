"""The pinned inputs of kata 11's checks: the stand-in cases (exact ties, EOS in the top num_beams,
logits in the thousands, the first and last valid values, a negative length_penalty), the bad
arguments in both directions, and the protocol programs of two searches on one cache.
"""
from __future__ import annotations

import torch

from grader.checks.k11_oracle import cache_for, stand_in
from grader.checks.support import protocol

UNIFORM_CASES = [  # every candidate ties: the SPEC's order decides (lower beam, then lower token)
    {"vocab": 6, "uniform": True, "prompt": [1, 2], "num_beams": 3, "max_new_tokens": 3, "eos_token_id": None,
     "length_penalty": 1.0},
    {"vocab": 4, "uniform": True, "prompt": [3], "num_beams": 2, "max_new_tokens": 3, "eos_token_id": 0,
     "length_penalty": 0.0},
    {"vocab": 3, "uniform": True, "prompt": [2], "num_beams": 4, "max_new_tokens": 1, "eos_token_id": None,
     "length_penalty": 1.0},  # only 3 candidates exist: 3 hypotheses come back
    {"vocab": 5, "uniform": True, "prompt": [0, 4], "num_beams": 2, "max_new_tokens": 2, "eos_token_id": 1,
     "length_penalty": 1.0},  # two finished hypotheses tie with the live beams: they come first, in finishing order
]
PINNED_CASES = [
    # an EOS candidate ranks within the top num_beams: the walk must go on to find live beams
    {"vocab": 4, "prompt": [2], "num_beams": 3, "max_new_tokens": 4, "eos_token_id": 0, "length_penalty": 1.0,
     "spread": 3.0, "seed": 620},
    # logits in the thousands: exp underflows, log_softmax must not (log of a softmax gives -inf)
    {"vocab": 5, "prompt": [4], "num_beams": 4, "max_new_tokens": 3, "eos_token_id": 0, "length_penalty": 1.0,
     "spread": 1000.0, "seed": 5},
    # the first and last valid values: token ids 0 and V - 1 in the prompt, V - 1 as EOS, one beam, one token
    {"vocab": 7, "prompt": [0, 6], "num_beams": 1, "max_new_tokens": 1, "eos_token_id": 6, "length_penalty": 1.0,
     "spread": 3.0, "seed": 2},
    # a negative length_penalty: the live beams' bound is taken at the current length, not at max_new_tokens
    {"vocab": 6, "prompt": [3], "num_beams": 2, "max_new_tokens": 4, "eos_token_id": 0, "length_penalty": -0.5,
     "spread": 1.0, "seed": 2},
]


def bad_inputs(model, V: int) -> list[tuple[str, tuple, dict, str]]:
    """(what, (prompt, num_beams, max_new_tokens), keyword arguments, the name the error must give), both
    directions of every bound; ``model`` is float64 with ``V`` tokens."""
    busy = cache_for(model, watched=False)
    busy.add_sequence("someone else")
    busy.reserve("someone else", 1)  # one block in use
    config = model.config
    other = {"n_layers": config.num_hidden_layers, "n_kv_heads": config.num_key_value_heads, "head_dim": config.head_dim}
    shapes = [(name, n) for name, size in other.items() for n in (size // 2, size * 2)]  # fewer and more
    cases = [(f"num_beams = {n!r}", ([1, 2], n, 3), {}, "num_beams") for n in (0, -1, 2.0)]
    cases += [(f"max_new_tokens = {n!r}", ([1, 2], 2, n), {}, "max_new_tokens") for n in (0, -2, 3.0)]
    cases += [(f"the prompt {bad}", (bad, 2, 3), {}, "prompt") for bad in ([], [1, V], [-1, 2], [1.0, 2])]
    cases += [("a cache with a block in use", ([1, 2], 2, 3), {"cache": busy}, "cache"),
              ("a float32 cache for a float64 model", ([1, 2], 2, 3),
               {"cache": cache_for(model, dtype=torch.float32, watched=False)}, "cache")]
    cases += [(f"a cache of {name} = {n} for a model of {other[name]}", ([1, 2], 2, 3),
               {"cache": cache_for(model, watched=False, **{name: n})}, "cache") for name, n in shapes]
    return cases


def program(kind, device):
    """A protocol program (``kind`` of grader.checks.support.protocol) over two searches of one
    stand-in model on one cache: each call returns its hypotheses and its prompt list after the call."""
    def run(api, ex):
        model = stand_in(ex, device)
        cache = cache_for(model, block_size=2, watched=False)

        def search(api, ex):
            prompt = list(ex["prompt"])
            got = api.beam_search(model, prompt, ex["num_beams"], ex["max_new_tokens"], cache=cache,
                                  eos_token_id=ex["eos_token_id"], length_penalty=ex["length_penalty"])
            return {"hypotheses": got, "prompt": prompt}
        return kind(search)(api, ex)
    return run


PROGRAMS = {  # what the caller does between two searches on one cache
    "the first result kept while a second search runs": lambda search: protocol.kept(search, search),
    "the first result overwritten by the caller, then a second search": lambda search: protocol.changed_by_caller(
        search, search),
    "the same search twice": lambda search: protocol.twice(search),
}
