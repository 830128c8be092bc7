"""Kata 18's configs, hardware peaks and exact oracles: the counts of the README worked out here,
in their own order of terms, with no float anywhere (nothing here calls the reference)."""
from __future__ import annotations

import copy
from fractions import Fraction

from hypothesis import strategies as st

from grader.engine import report

LLAMA3_8B = {  # as its config.json reads (fields that do not matter here left out)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 32, "rope_theta": 500000.0, "vocab_size": 128256, "torch_dtype": "bfloat16",
}
LLAMA2_7B = {  # no num_key_value_heads: one KV head per query head
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
    "vocab_size": 32000, "torch_dtype": "float16",
}
TINY = {  # kata 08's tiny Llama: 2 layers, width 32, 4 query heads and 2 KV heads of 8, MLP 64, 48 tokens
    "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 48, "torch_dtype": "float32",
}
GEMMA2_9B = {  # head_dim 256, not hidden_size // heads = 224; newer files say "dtype"
    "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 42, "vocab_size": 256000, "dtype": "bfloat16",
}
# Gemma-2-9B by hand: q and o 3584 x 4096 each, k and v 3584 x 2048 each, the MLP 3 x 3584 x 14336.
G2_LAYER = 2 * 3584 * 4096 + 2 * 3584 * 2048 + 3 * 3584 * 14336
G2_MATRICES = 42 * G2_LAYER + 256000 * 3584
# Llama-3-8B by hand. Matrix numbers of one layer: q and o 4096 x 4096 each, k and v 4096 x 1024 each,
# gate, up and down 4096 x 14336 each: 33,554,432 + 8,388,608 + 176,160,768 = 218,103,808.
L3_LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
L3_MATRICES = 32 * L3_LAYER + 128256 * 4096  # + the LM head: 7,504,658,432 numbers
L3_KV_TOKEN = 2 * 32 * 8 * 128 * 2  # the seed's 131,072 bytes of cache per token
L3_PAIR_MACS = 32 * 32 * 2 * 128  # one (query, key) pair over all layers and heads: score + weighted sum

# Published peaks (see the README): dense bf16 FLOP/s and memory bandwidth in bytes/s.
H100 = {"peak_flops": 989_500_000_000_000, "bandwidth": 3_350_000_000_000}
A100 = {"peak_flops": 312_000_000_000_000, "bandwidth": 2_039_000_000_000}
LAPTOP = {"peak_flops": 768_000_000_000, "bandwidth": 51_200_000_000}


def sizes(config: dict) -> dict:
    """The README's fields of a config, defaults filled in (a copy: the config is not touched)."""
    lm = config.get("text_config") or config
    heads = lm["num_attention_heads"]
    return {"L": lm["num_hidden_layers"], "d": lm["hidden_size"], "h": heads,
            "g": lm.get("num_key_value_heads") or heads, "D": lm.get("head_dim") or lm["hidden_size"] // heads,
            "I": lm["intermediate_size"], "V": lm["vocab_size"]}


DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "float8_e4m3fn": 1}


def elem_bytes(ex: dict) -> tuple[int, int]:
    """(weight bytes, cache bytes) per number: given, else the config's dtype (the text model's first)."""
    weight = ex.get("weight_bytes_per_elem")
    if weight is None:
        config = ex["config"]
        lm = config.get("text_config") or config
        names = [place.get(key) for place in (lm, config) for key in ("dtype", "torch_dtype")]
        weight = DTYPE_BYTES[next(name for name in names if name)]
    kv = ex.get("kv_bytes_per_elem")
    return weight, weight if kv is None else kv


def flops(ex: dict) -> int:
    """Multiply-adds counted term by term, times 2."""
    s, b, t, p = sizes(ex["config"]), ex["batch"], ex["new_tokens"], ex["past_len"]
    per_token_layer = s["d"] * s["D"] * (s["h"] + s["g"] + s["g"] + s["h"]) + 3 * s["d"] * s["I"]
    keys_seen = t * (2 * p + t + 1) // 2  # (p + 1) + (p + 2) + ... + (p + t)
    attention = s["L"] * s["h"] * (keys_seen * s["D"] + keys_seen * s["D"])  # scores, then the weighted sum
    return 2 * (b * t * s["L"] * per_token_layer + b * attention + b * s["d"] * s["V"])


def byte_terms(ex: dict) -> tuple[int, int]:
    """(bytes of the weights, bytes of one token's K and V)."""
    s = sizes(ex["config"])
    weight, kv = elem_bytes(ex)
    numbers = s["L"] * (s["d"] * s["D"] * 2 * (s["h"] + s["g"]) + 3 * s["d"] * s["I"]) + s["V"] * s["d"]
    return numbers * weight, s["L"] * 2 * s["g"] * s["D"] * kv


def moved(ex: dict) -> int:
    weights, per_token = byte_terms(ex)
    return weights + ex["batch"] * (ex["past_len"] + ex["new_tokens"]) * per_token


def seconds(ex: dict) -> Fraction:
    compute = Fraction(flops(ex)) / Fraction(ex["peak_flops"])
    memory = Fraction(moved(ex)) / Fraction(ex["bandwidth"])
    return compute if compute > memory else memory


def crossover(ex: dict) -> int | None:
    """The smallest B with B * f / peak >= (W + B * c) / bw; f, c the FLOPs and bytes one sequence adds."""
    one = {**ex, "batch": 1, "new_tokens": 1}
    f = flops(one)
    weights, per_token = byte_terms(one)
    c = (ex["past_len"] + 1) * per_token
    peak, bw = Fraction(ex["peak_flops"]), Fraction(ex["bandwidth"])
    slope = f * bw - c * peak
    if slope <= 0:
        return None
    need = weights * peak / slope  # B >= need
    batch = need.numerator // need.denominator
    return max(1, batch if batch == need else batch + 1)


def exact_problem(expected, got, kind: str) -> str | None:
    """None when ``got`` equals ``expected`` and is exact (an int count; a Fraction or int ratio), else why not."""
    problem = report.compare(expected, got) if not isinstance(expected, Fraction) else (
        None if isinstance(got, (int, Fraction)) and not isinstance(got, bool) and got == expected
        else f"result: expected {expected} (about {float(expected):.6g}), got {got!r}")
    if problem:
        return problem
    if expected is None:
        return None
    allowed = (int,) if kind == "int" else (int, Fraction)
    if not isinstance(got, allowed) or isinstance(got, bool):
        return (f"got {got!r} of type {type(got).__name__}; expected an exact "
                f"{'int' if kind == 'int' else 'fractions.Fraction'} (a float rounds past 2**53)")
    return None


def args(ex: dict) -> list:
    """The example's values in signature order, copied so no call changes the next one's config."""
    return copy.deepcopy(list(ex.values()))


# -- strategies ------------------------------------------------------------------------------------
WIDTHS = [8, 32, 64, 80, 96, 128, 256]


@st.composite
def llama_configs(draw, big: bool = False):
    """Configs written as Hugging Face writes them: optional fields absent or null, the dtype under
    either key, sometimes a multimodal wrapper with the language model in text_config."""
    heads = draw(st.sampled_from([1, 2, 4, 8, 12, 16, 32, 64]))
    kv = draw(st.sampled_from([g for g in range(1, heads + 1) if heads % g == 0]))
    size = st.integers(1, 2**20) if big else st.integers(1, 4096)
    lm = {"num_hidden_layers": draw(st.integers(1, 2**12 if big else 96)), "num_attention_heads": heads,
          "intermediate_size": draw(size), "vocab_size": draw(size)}
    if kv != heads or draw(st.booleans()):
        lm["num_key_value_heads"] = kv
    elif draw(st.booleans()):
        lm["num_key_value_heads"] = None
    width = draw(st.sampled_from(WIDTHS))
    lm["hidden_size"] = heads * width
    if draw(st.booleans()):  # an explicit head_dim, free to differ from hidden_size // heads
        lm["head_dim"] = draw(st.sampled_from(WIDTHS + [None]))
    dtype_key, dtype = draw(st.sampled_from(["torch_dtype", "dtype"])), draw(st.sampled_from(sorted(DTYPE_BYTES)))
    if not draw(st.booleans()):
        lm[dtype_key] = dtype
        return lm
    # Multimodal: a vision tower's sizes at the top; the dtype inside, at the top, or both (the top's
    # another one, which the text model's overrides: the README reads the text model's first).
    top = {"model_type": "llava", "hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 24,
           "intermediate_size": 4096, "vocab_size": 32064, "text_config": lm}
    where = draw(st.sampled_from(["text", "top", "both"]))
    (top if where == "top" else lm)[dtype_key] = dtype
    if where == "both":
        top[draw(st.sampled_from(["torch_dtype", "dtype"]))] = draw(st.sampled_from(sorted(DTYPE_BYTES)))
    return top


@st.composite
def shapes(draw, big: bool = False):
    """A forward's batch, new tokens and past: 1 and 0 at the edges, prefills, decodes, far past 2**53."""
    top = 2**40 if big else 4096
    return {"config": draw(llama_configs(big)), "batch": draw(st.one_of(st.just(1), st.integers(1, 256 if not big else top))),
            "new_tokens": draw(st.one_of(st.just(1), st.integers(1, top))),
            "past_len": draw(st.one_of(st.just(0), st.integers(0, top)))}


ELEMS = st.one_of(st.none(), st.sampled_from([1, 2, 4]))


@st.composite
def byte_shapes(draw, big: bool = False):
    return {**draw(shapes(big)), "weight_bytes_per_elem": draw(ELEMS), "kv_bytes_per_elem": draw(ELEMS)}


RATES = st.one_of(st.integers(1, 10**16), st.fractions(min_value=Fraction(1, 10**6), max_value=10**16),
                  st.floats(min_value=1e-3, max_value=1e16, allow_nan=False, allow_infinity=False))


# -- running cases ---------------------------------------------------------------------------------
def call(api, name: str, ex: dict):
    return getattr(api, name)(*args(ex))


def exact_case(ctx, name: str, kind: str, cases) -> None:
    """``cases``: (arguments in signature order, the value worked out by hand, what the numbers are)."""
    for example, expected, note in cases:
        def body(c, ex, expected=expected, note=note):
            got = call(c.t, name, ex)
            problem = exact_problem(expected, got, kind)
            if problem:
                c.fail(f"{name}: {note}\n  {problem}", ex, got)

        ctx.case(dict(example), body)


def exact_random(ctx, name: str, kind: str, strategy, oracle, max_examples: int = 20) -> None:
    """Drawn arguments against ``oracle(ex)``, the README's count done here in exact arithmetic."""
    def body(c, ex):
        got = call(c.t, name, ex)
        problem = exact_problem(oracle(ex), got, kind)
        if problem:
            c.fail(f"{name}, compared with exact arithmetic\n  {problem}", ex, got)

    ctx.forall(strategy, body, max_examples)
