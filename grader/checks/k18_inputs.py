"""Kata 18's bad inputs and the inputs beyond the drawn ones: every argument of every function out
of range, of the wrong type, and at its first valid value; configs left unchanged; sizes far past
2**53. The check bodies live here; grader.checks.k18 registers them."""
from __future__ import annotations

import copy
from fractions import Fraction

from grader.checks import k18_counts as k
from grader.checks.support.common import expect_value_error

SHAPE = {"config": k.LLAMA3_8B, "batch": 2, "new_tokens": 3, "past_len": 100}
ELEMS = {"weight_bytes_per_elem": 2, "kv_bytes_per_elem": 1}
GOOD = {  # a valid call of each function, and the smallest value each count allows
    "forward_flops": (SHAPE, {"batch": 1, "new_tokens": 1, "past_len": 0}),
    "forward_bytes": ({**SHAPE, **ELEMS}, {"batch": 1, "new_tokens": 1, "past_len": 0}),
    "arithmetic_intensity": ({**SHAPE, **ELEMS}, {"batch": 1, "new_tokens": 1, "past_len": 0}),
    "ridge_point": (dict(k.H100), {}),
    "roofline_time": ({**SHAPE, **k.H100, **ELEMS}, {"batch": 1, "new_tokens": 1, "past_len": 0}),
    "decode_crossover_batch": ({"config": k.LLAMA3_8B, "past_len": 100, **k.H100, **ELEMS}, {"past_len": 0}),
}
RATES = ("peak_flops", "bandwidth")


def _bad_values(arg: str, minimum: int) -> list:
    """What is wrong, and the bad value."""
    if arg in RATES:
        return [(f"{arg}=0", 0), (f"{arg}=-1", -1), (f"{arg}=nan", float("nan")), (f"{arg}=inf", float("inf")),
                (f"{arg}=Fraction(-1, 2)", Fraction(-1, 2)), (f"{arg}='1e12'", "1e12"), (f"{arg}=True", True)]
    return [(f"{arg}={minimum - 1}", minimum - 1), (f"{arg}=2.5", 2.5), (f"{arg}='8'", "8"), (f"{arg}=True", True)]


def _rejects(ctx, name: str, cases) -> None:
    """``cases``: (what is wrong, arguments in signature order, names the message may use)."""
    for what, example, names in cases:
        def body(c, ex, what=what, names=names):
            expect_value_error(c, getattr(c.t, name), *k.args(ex), what=f"{name} with {what}", names=names, example=ex)

        ctx.case(dict(example), body)


def every_argument(ctx) -> None:
    for name, (good, minimums) in GOOD.items():
        cases = [(what, {**good, arg: bad}, (arg,)) for arg in good if arg != "config"
                 for what, bad in _bad_values(arg, minimums.get(arg, 1))]
        _rejects(ctx, name, cases)


def _without(config: dict, field: str) -> dict:
    return {key: value for key, value in config.items() if key != field}


def config_fields(ctx) -> None:
    """A config that is not a dict, a missing or bad field: a ValueError naming it, in every function."""
    bad = [("config given as a list", [k.LLAMA3_8B], ("config",)),
           ("config given as the text of a config.json", '{"num_hidden_layers": 32}', ("config",)),
           ("text_config given as a list", {**k.LLAMA3_8B, "text_config": [k.LLAMA3_8B]}, ("text_config", "config"))]
    for field in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
        bad.append((f"no {field}", _without(k.LLAMA3_8B, field), (field,)))
        # The top level's numbers may be a vision tower's: a field missing from text_config is missing.
        bad.append((f"no {field} in text_config (the top level has one)",
                    {**k.LLAMA3_8B, "text_config": _without(k.LLAMA3_8B, field)}, (field,)))
    for field, value in (("num_hidden_layers", 0), ("num_key_value_heads", -8), ("num_key_value_heads", 0),
                         ("head_dim", 0), ("head_dim", 2.5),
                         ("intermediate_size", "14336"), ("vocab_size", 0), ("hidden_size", True)):
        bad.append((f'"{field}": {value!r}', {**k.LLAMA3_8B, field: value}, (field,)))
    for name, (good, _) in GOOD.items():
        if "config" in good:
            _rejects(ctx, name, [(what, {**good, "config": config}, names) for what, config, names in bad])


def dtype_needed(ctx) -> None:
    """Without weight_bytes_per_elem the bytes need the config's dtype: missing or unknown, a ValueError."""
    cases = [("no dtype and no weight_bytes_per_elem", _without(k.LLAMA3_8B, "torch_dtype")),
             ("an unknown dtype name", {**k.LLAMA3_8B, "torch_dtype": "not-a-dtype"})]
    for name in ("forward_bytes", "arithmetic_intensity", "roofline_time", "decode_crossover_batch"):
        good = GOOD[name][0]
        _rejects(ctx, name, [(what, {**good, "config": config, "weight_bytes_per_elem": None},
                              ("dtype", "torch_dtype"))
                             for what, config in cases])  # either key names the field


def leaves_config_unchanged(ctx) -> None:
    """Configs whose defaults a reader could write back: unchanged after the call, the same answer twice."""
    nested = {"model_type": "llava", "hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 24,
              "intermediate_size": 4096, "vocab_size": 32064, "torch_dtype": "float16",
              "text_config": {**_without(k.LLAMA2_7B, "torch_dtype"), "head_dim": None}}

    def body(c, ex):
        name = ex["function"]
        given = {key: value for key, value in ex.items() if key != "function"}
        before = copy.deepcopy(given)
        first = getattr(c.t, name)(*given.values())
        if given != before:
            c.fail(f"{name} changed its arguments (the config, read as kata 04 reads it, must stay as it was)",
                   ex, ("changed", name))
        again = getattr(c.t, name)(*copy.deepcopy(before).values())
        if not (type(first) is type(again) and first == again):
            c.fail(f"{name} on the same input twice gave {first!r}, then {again!r}", ex, ("twice", name))

    for config in (k.LLAMA2_7B, nested):
        for name, (good, _) in GOOD.items():
            if "config" in good:
                example = {**good, "config": config}
                if "weight_bytes_per_elem" in good:
                    example["weight_bytes_per_elem"] = None  # the dtype read from the config too
                ctx.case({"function": name, **example}, body)


def past_2_53(ctx) -> None:
    """Sizes where every count passes 2**53: a float would round, an int64 would overflow."""
    big = {"num_hidden_layers": 2**21 + 1, "hidden_size": 2**13 * 3, "num_attention_heads": 2**13,
           "num_key_value_heads": 2**11, "head_dim": 2**9 + 1, "intermediate_size": 2**20 + 7,
           "vocab_size": 2**18 + 3, "torch_dtype": "float64"}
    shape = {"config": big, "batch": 2**20 + 1, "new_tokens": 2**24 + 3, "past_len": 2**30 + 5}
    timed = {**shape, "peak_flops": 10**18 + 1, "bandwidth": 3 * 10**12 + 7}
    elems = {"weight_bytes_per_elem": None, "kv_bytes_per_elem": 1}
    ridge_20 = {"peak_flops": 20 * (10**21 + 1), "bandwidth": 10**21 + 1}
    cases = [
        ("forward_flops", "int", shape, k.flops(shape)),
        ("forward_bytes", "int", {**shape, **elems}, k.moved({**shape, **elems})),
        ("arithmetic_intensity", "ratio", {**shape, **elems}, Fraction(k.flops(shape), k.moved({**shape, **elems}))),
        ("roofline_time", "ratio", {**timed, **elems}, k.seconds({**timed, **elems})),
        ("decode_crossover_batch", "int", {"config": big, "past_len": 1000, **ridge_20, **elems},
         k.crossover({"config": big, "batch": 1, "new_tokens": 1, "past_len": 1000, **ridge_20, **elems})),
        ("ridge_point", "ratio", {"peak_flops": 2**60 + 1, "bandwidth": 3}, Fraction(2**60 + 1, 3)),
    ]
    for name, kind, example, expected in cases:
        k.exact_case(ctx, name, kind, [(example, expected, "numbers this large are exact only in integer arithmetic")])
