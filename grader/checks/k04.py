"""Hidden checks of kata 04 — the memory formula.

Pinned cases carry the seed documents' worked numbers, with every expected value written here
as hand arithmetic (never taken from the reference). Random cases compare with exact integer
arithmetic done here, on sizes that include the edges: 0 and 1, exact multiples and one past, and
numbers past 2**53 where a float would round. Every answer must be a Python int. Arguments are
passed by position, in the order of the signature.
"""
from __future__ import annotations

import copy

from hypothesis import strategies as st

from grader.engine import report
from grader.checks.support.common import expect_value_error, value_error_names
from grader.engine import Checks

CHECKS = Checks("04")

GiB = 2**30

# Model configs as their config.json files read (fields that do not matter here left out).
LLAMA2_7B = {  # the original release: no num_key_value_heads field, so one KV head per query head
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
    "max_position_embeddings": 4096, "vocab_size": 32000, "torch_dtype": "float16",
}
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 32, "rope_theta": 500000.0, "vocab_size": 128256, "torch_dtype": "bfloat16",
}
GEMMA2_9B = {  # head_dim 256 is not hidden_size // heads = 224; newer files say "dtype"
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584, "head_dim": 256,
    "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 42, "dtype": "bfloat16",
}
MISTRAL_7B = {  # an explicit null head_dim means "use the default"
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096, "head_dim": None,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "sliding_window": 4096,
    "torch_dtype": "bfloat16",
}
LLAVA_7B = {  # the language model is nested; the top level holds a vision tower's numbers
    "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "hidden_size": 1024,
    "num_attention_heads": 16, "num_hidden_layers": 24, "torch_dtype": "float16",
    "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "num_hidden_layers": 24},
    "text_config": {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                    "num_hidden_layers": 32, "num_key_value_heads": 32, "torch_dtype": "float16"},
}
LLAMA2_7B_WEIGHT_BYTES = 6_738_415_616 * 2  # parameters x fp16
LLAMA3_8B_WEIGHT_BYTES = 8_030_261_248 * 2  # parameters x bf16


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _args(ex: dict) -> list:
    """The example's values in signature order, copied so no call can change the next one's config."""
    return copy.deepcopy(list(ex.values()))


def _call(api, name: str, ex: dict):
    return getattr(api, name)(*_args(ex))


def _pinned(ctx, name: str, cases) -> None:
    """``cases``: (arguments in signature order, expected value by hand, what the numbers are)."""
    for args, expected, note in cases:
        def body(c, ex, expected=expected, note=note):
            got = _call(c.t, name, ex)
            problem = _int_problem(expected, got)
            if problem:
                c.fail(f"{name}: {note}\n  {problem}", ex, got)

        ctx.case(dict(args), body)


def _int_problem(expected, got) -> str | None:
    """None when ``got`` equals ``expected`` and every number in it is a Python int, else why not."""
    problem = report.compare(expected, got)
    if problem:
        return problem
    for value in got if isinstance(got, (tuple, list)) else (got,):
        if not isinstance(value, int) or isinstance(value, bool):
            return (f"got {value!r} of type {type(value).__name__}; every answer is a Python int, exact at any "
                    "size (a numpy or float number rounds or overflows past 2**53 or 2**63)")
    return None


def _exact(ctx, name: str, strategy, oracle, max_examples: int = 20) -> None:
    """Random sizes against ``oracle(ex)``: the answer worked out here with exact integer arithmetic."""
    def body(c, ex):
        got = _call(c.t, name, ex)
        problem = _int_problem(oracle(ex), got)
        if problem:
            c.fail(f"{name}, compared with exact integer arithmetic\n  {problem}", ex, got)

    ctx.forall(strategy, body, max_examples)


def _rejects(ctx, name: str, cases) -> None:
    """``cases``: (what is wrong, arguments in signature order, names the message may use)."""
    for what, args, names in cases:
        def body(c, ex, what=what, names=names):
            expect_value_error(c, getattr(c.t, name), *_args(ex), what=f"{name} with {what}", names=names, example=ex)

        ctx.case(dict(args), body)


# -- strategies: sizes with their edges ----------------------------------------------------------
SIZE = st.one_of(st.just(1), st.integers(1, 256), st.integers(1, 2**40))
COUNT = st.one_of(st.just(0), st.just(1), st.integers(0, 10**6), st.integers(0, 2**50))
ELEM = st.sampled_from([1, 2, 4, 8])


@st.composite
def model_sizes(draw):
    return {"n_layers": draw(SIZE), "n_kv_heads": draw(SIZE), "head_dim": draw(SIZE), "bytes_per_elem": draw(ELEM)}


def _per_token(m: dict) -> int:
    return 2 * m["n_layers"] * m["n_kv_heads"] * m["head_dim"] * m["bytes_per_elem"]


def _near_multiple(draw, unit: int) -> int:
    """A non-negative number at or next to a multiple of ``unit`` — where rounding mistakes show."""
    k = draw(st.one_of(st.just(0), st.just(1), st.integers(0, 10**7), st.integers(0, 2**50)))
    r = draw(st.sampled_from([0, 1, unit - 1, None]))
    return k * unit + (draw(st.integers(0, unit - 1)) if r is None else min(r, unit - 1))


@st.composite
def cache_sizes(draw):
    m = draw(model_sizes())
    return {"n_layers": m["n_layers"], "batch": draw(COUNT), "seq_len": draw(COUNT), "n_kv_heads": m["n_kv_heads"],
            "head_dim": m["head_dim"], "bytes_per_elem": m["bytes_per_elem"]}


@st.composite
def crossovers(draw):
    m = draw(model_sizes())
    return {"weight_bytes": _near_multiple(draw, _per_token(m)), **m}


@st.composite
def batches(draw, weights_fit: bool = True):
    m = draw(model_sizes())
    seq_len = draw(st.one_of(st.just(1), st.integers(1, 10**6)))
    weights = draw(st.one_of(st.just(0), st.integers(0, 2**45)))
    if weights_fit:
        memory = weights + _near_multiple(draw, _per_token(m) * seq_len)
    else:
        weights = max(weights, 1)
        memory = weights - draw(st.integers(1, weights))
    return {"memory_bytes": memory, "weight_bytes": weights, "seq_len": seq_len, **m}


@st.composite
def steps(draw):
    # n_steps small enough for a plain loop; prompts long enough to take the counts past 2**53.
    return {"n_steps": draw(st.one_of(st.just(1), st.integers(1, 4096), st.integers(1, 20_000))),
            "prompt_len": draw(st.one_of(st.just(1), st.integers(1, 4096), st.integers(1, 2**40)))}


def _crossover(ex: dict) -> int:
    per_token, weights = _per_token(ex), ex["weight_bytes"]
    return weights // per_token + (1 if weights % per_token else 0)


def _max_batch(ex: dict) -> int:
    free = ex["memory_bytes"] - ex["weight_bytes"]
    return 0 if free < 0 else free // (_per_token(ex) * ex["seq_len"])


def _projections(ex: dict) -> tuple[int, int]:
    n, p = ex["n_steps"], ex.get("prompt_len", 1)
    return sum(p + i for i in range(n)), p + (n - 1)  # pass i sees p + i tokens; cached: the prompt, then 1 each


def _scores(ex: dict) -> tuple[int, int]:
    n, p = ex["n_steps"], ex.get("prompt_len", 1)
    return sum((p + i) * (p + i) for i in range(n)), p * p + sum(p + i for i in range(1, n))


WIDTHS = [32, 64, 80, 96, 128, 256]
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "float8_e4m3fn": 1}
DTYPE_NAMES = list(DTYPE_BYTES)
DTYPE_FIELDS = ("dtype", "torch_dtype")  # the README names the field under either key; a message may use either


@st.composite
def hf_configs(draw):
    """Configs as Hugging Face writes them: optional fields absent or null, the dtype under either key,
    multimodal ones with the language model in text_config and the dtype at the top, inside, or both."""
    n_heads = draw(st.sampled_from([1, 2, 4, 8, 12, 16, 32, 40, 64]))
    n_kv = draw(st.sampled_from([d for d in range(1, n_heads + 1) if n_heads % d == 0]))
    lm = {"model_type": "llama", "num_hidden_layers": draw(st.integers(1, 96)), "num_attention_heads": n_heads}
    kv_field = "given" if n_kv != n_heads else draw(st.sampled_from(["given", "absent", "null"]))
    if kv_field != "absent":  # absent or null: one KV head per query head
        lm["num_key_value_heads"] = n_kv if kv_field == "given" else None
    if draw(st.booleans()):  # an explicit head_dim, free to differ from hidden_size // heads (Gemma, Qwen3)
        lm["head_dim"] = draw(st.sampled_from(WIDTHS))
        hidden = draw(st.sampled_from(["given", "absent", "null"]))  # not needed, so it may be left out
        if hidden != "absent":
            lm["hidden_size"] = n_heads * draw(st.sampled_from(WIDTHS)) if hidden == "given" else None
    else:
        lm["hidden_size"] = n_heads * draw(st.sampled_from(WIDTHS))
        if draw(st.booleans()):
            lm["head_dim"] = None
    dtype_key, dtype = draw(st.sampled_from(["torch_dtype", "dtype"])), draw(st.sampled_from(DTYPE_NAMES))
    other_null = draw(st.booleans())  # the other key written as null
    where = draw(st.sampled_from(["top", "text", "both"]))
    config = lm
    if draw(st.booleans()):  # multimodal: a vision tower's sizes at the top, the language model nested
        config = {"model_type": "llava", "hidden_size": draw(st.sampled_from([768, 1024, 1152])),
                  "num_attention_heads": draw(st.sampled_from([12, 16])), "num_hidden_layers": draw(st.integers(1, 40)),
                  "text_config": lm}
    else:
        where = "top"
    for place in (config, lm) if where == "both" else (config if where == "top" else lm,):
        place[dtype_key] = dtype
        if other_null:
            place["dtype" if dtype_key == "torch_dtype" else "torch_dtype"] = None
    big = st.integers(2**20, 2**40)  # with these the byte count passes 2**53
    return {"config": config, "batch": draw(st.one_of(st.just(0), st.integers(1, 64), big)),
            "seq_len": draw(st.one_of(st.just(1), st.integers(0, 200_000), big)),
            "bytes_per_elem": draw(st.one_of(st.none(), st.sampled_from([1, 2, 4])))}


def _config_bytes(ex: dict) -> int:
    """The cache bytes of a drawn config, read here field by field."""
    config = ex["config"]
    lm = config.get("text_config") or config
    heads = lm["num_attention_heads"]
    kv = lm.get("num_key_value_heads") or heads
    dim = lm.get("head_dim") or lm["hidden_size"] // heads
    names = [place.get(key) for place in (lm, config) for key in ("dtype", "torch_dtype")]
    elem = ex["bytes_per_elem"] or DTYPE_BYTES[next(name for name in names if name)]
    return ex["batch"] * ex["seq_len"] * 2 * lm["num_hidden_layers"] * kv * dim * elem


# -- task 1: bytes per token, bytes of a cache ---------------------------------------------------
@CHECKS.add("kv_bytes_per_token gives the worked numbers", uses="kv_bytes_per_token")
def bytes_per_token_pinned(ctx):
    _pinned(ctx, "kv_bytes_per_token", [
        ({"n_layers": 2, "n_kv_heads": 2, "head_dim": 8, "bytes_per_elem": 2}, 2 * 2 * 2 * 8 * 2,
         "the toy model (2 layers, 2 KV heads, head_dim 8, fp16): K and V x 2 layers x 2 heads x 8 x 2 B = 128 B"),
        ({"n_layers": 32, "n_kv_heads": 8, "head_dim": 128, "bytes_per_elem": 2}, 2 * 32 * 8 * 128 * 2,
         "32 layers x 8 KV heads x head_dim 128 in fp16: 131,072 B = 128 KiB per token"),
        ({"n_layers": 32, "n_kv_heads": 32, "head_dim": 128, "bytes_per_elem": 2}, 2 * 32 * 32 * 128 * 2,
         "32 layers x 32 KV heads x head_dim 128 in fp16: 524,288 B = 512 KiB per token"),
    ])


@CHECKS.add("kv_bytes_per_token on random sizes", uses="kv_bytes_per_token")
def bytes_per_token_random(ctx):
    _exact(ctx, "kv_bytes_per_token", model_sizes(), _per_token)


@CHECKS.add("kv_cache_bytes gives the worked numbers", uses="kv_cache_bytes")
def cache_bytes_pinned(ctx):
    def args(layers, batch, seq, kv, dim, elem):
        return {"n_layers": layers, "batch": batch, "seq_len": seq, "n_kv_heads": kv, "head_dim": dim,
                "bytes_per_elem": elem}

    _pinned(ctx, "kv_cache_bytes", [
        (args(2, 1, 8, 2, 8, 2), 8 * 128, "8 tokens of the toy model at 128 B each fill 1,024 B"),
        (args(32, 1, 4096, 32, 128, 2), 2 * GiB, "one 4,096-token sequence, 32 layers, 32 KV heads, fp16: 2 GiB"),
        (args(32, 1, 4096, 8, 128, 2), GiB // 2, "the same with 8 KV heads (GQA): 0.5 GiB"),
        (args(32, 1, 4096, 1, 128, 2), GiB // 16, "the same with 1 KV head (MQA): 0.0625 GiB"),
        (args(32, 64, 8000, 8, 128, 2), 64 * 8000 * 131_072, "a batch of 64 at 8,000 tokens, 128 KiB per token"),
        (args(2, 0, 8, 2, 8, 2), 0, "an empty batch holds nothing"),
    ])


@CHECKS.add("kv_cache_bytes on random sizes", uses="kv_cache_bytes")
def cache_bytes_random(ctx):
    _exact(ctx, "kv_cache_bytes", cache_sizes(), lambda e: e["batch"] * e["seq_len"] * _per_token(e))


@CHECKS.add("kv_bytes_per_token and kv_cache_bytes reject bad input with a ValueError naming it", uses="kv_bytes_per_token")
def task1_rejects_bad_input(ctx):
    per_token = ("n_layers", "n_kv_heads", "head_dim", "bytes_per_elem")
    cache = ("n_layers", "batch", "seq_len", "n_kv_heads", "head_dim", "bytes_per_elem")
    cases = {"kv_bytes_per_token": [
        ("a negative n_layers", (-1, 8, 128, 2), "n_layers"),
        ("a negative n_kv_heads", (32, -8, 128, 2), "n_kv_heads"),
        ("a negative head_dim", (32, 8, -128, 2), "head_dim"),
        ("a negative bytes_per_elem", (32, 8, 128, -2), "bytes_per_elem"),
        ("n_kv_heads=2.5", (32, 2.5, 128, 2), "n_kv_heads"),
    ], "kv_cache_bytes": [
        ("a negative batch", (32, -1, 4096, 8, 128, 2), "batch"),
        ("a negative seq_len", (32, 1, -4096, 8, 128, 2), "seq_len"),
        ("seq_len=4096.5", (32, 1, 4096.5, 8, 128, 2), "seq_len"),
        ("a negative n_layers", (-32, 1, 4096, 8, 128, 2), "n_layers"),
    ]}
    for name, keys in (("kv_bytes_per_token", per_token), ("kv_cache_bytes", cache)):
        _rejects(ctx, name, [(what, zip(keys, values), (arg,)) for what, values, arg in cases[name]])


# -- task 2: from a config.json ------------------------------------------------------------------
def _config_case(config, batch, seq_len, bytes_per_elem=None):
    return {"config": config, "batch": batch, "seq_len": seq_len, "bytes_per_elem": bytes_per_elem}


@CHECKS.add("kv_cache_bytes_from_config on real model configs", uses="kv_cache_bytes_from_config")
def from_config_real_models(ctx):
    _pinned(ctx, "kv_cache_bytes_from_config", [
        (_config_case(LLAMA2_7B, 1, 4096), 4096 * 2 * 32 * 32 * (4096 // 32) * 2,
         "Llama-2-7B: no num_key_value_heads, so 32 KV heads; head_dim 4096 // 32 = 128; float16 = 2 B -> 2 GiB"),
        (_config_case(GEMMA2_9B, 1, 4096), 4096 * 2 * 42 * 8 * 256 * 2,
         "a Gemma-2-9B-style config: 8 KV heads for 16 query heads; the explicit head_dim 256 wins over "
         "3584 // 16 = 224; the dtype is under 'dtype'"),
        (_config_case(LLAMA3_8B, 1, 8192), 8192 * 2 * 32 * 8 * (4096 // 32) * 2,
         "Llama-3-8B: 8 KV heads (not the 32 query heads), head_dim 4096 // 32 = 128, bfloat16 = 2 B -> 1 GiB"),
        (_config_case(LLAMA3_8B, 4, 8192, 1), 4 * 8192 * 2 * 32 * 8 * 128 * 1,
         "Llama-3-8B with bytes_per_elem=1 given (an fp8 cache): it overrides bfloat16 -> 2 GiB for 4 x 8,192"),
        (_config_case(LLAVA_7B, 2, 1000), 2 * 1000 * 2 * 32 * 32 * 128 * 2,
         "a LLaVA-style config: the language model is in text_config (32 layers, 32 KV heads, head_dim 128); "
         "the top-level sizes belong to the vision tower"),
        (_config_case(MISTRAL_7B, 3, 1000), 3 * 1000 * 2 * 32 * 8 * (4096 // 32) * 2,
         "a Mistral-7B-style config with \"head_dim\": null, which means hidden_size // num_attention_heads"),
        (_config_case({**LLAMA3_8B, "torch_dtype": "float32"}, 1, 1000), 1000 * 2 * 32 * 8 * 128 * 4,
         "Llama-3-8B stored in float32: 4 bytes per number"),
    ])


@CHECKS.add("kv_cache_bytes_from_config on random configs", uses="kv_cache_bytes_from_config")
def from_config_random(ctx):
    _exact(ctx, "kv_cache_bytes_from_config", hf_configs(), _config_bytes, max_examples=25)


def _without(config: dict, *fields: str) -> dict:
    return {k: v for k, v in config.items() if k not in fields}


@CHECKS.add("kv_cache_bytes_from_config rejects a missing field or bad input with a ValueError naming it",
            uses="kv_cache_bytes_from_config")
def from_config_rejects_bad_input(ctx):
    _rejects(ctx, "kv_cache_bytes_from_config", [
        ("no num_hidden_layers", _config_case(_without(LLAMA3_8B, "num_hidden_layers"), 1, 8), ("num_hidden_layers",)),
        ("neither num_attention_heads nor num_key_value_heads",
         _config_case(_without(LLAMA2_7B, "num_attention_heads"), 1, 8), ("num_attention_heads",)),
        ("neither head_dim nor hidden_size", _config_case(_without(LLAMA3_8B, "hidden_size"), 1, 8),
         ("hidden_size", "head_dim")),
        ("no dtype and no bytes_per_elem", _config_case(_without(LLAMA3_8B, "torch_dtype"), 1, 8),
         DTYPE_FIELDS),
        ("an unknown dtype name", _config_case({**LLAMA3_8B, "torch_dtype": "not-a-dtype"}, 1, 8),
         DTYPE_FIELDS),
        ("a negative batch", _config_case(LLAMA3_8B, -1, 8), ("batch",)),
        ("a negative seq_len", _config_case(LLAMA3_8B, 1, -8), ("seq_len",)),
        ("a negative bytes_per_elem", _config_case(LLAMA3_8B, 1, 8, -2), ("bytes_per_elem",)),
        ("\"num_key_value_heads\": 0 (a zero is not a missing field)",
         _config_case({**LLAMA3_8B, "num_key_value_heads": 0}, 1, 8), ("num_key_value_heads",)),
        ("\"head_dim\": 0 (a zero is not a missing field)", _config_case({**LLAMA3_8B, "head_dim": 0}, 1, 8),
         ("head_dim",)),
    ])


# -- task 3: the weights against the cache -------------------------------------------------------
def _sizes(layers, kv, dim, elem):
    return {"n_layers": layers, "n_kv_heads": kv, "head_dim": dim, "bytes_per_elem": elem}


TOY, LLAMA2, LLAMA3 = _sizes(2, 2, 8, 2), _sizes(32, 32, 128, 2), _sizes(32, 8, 128, 2)


@CHECKS.add("crossover_tokens gives the worked numbers", uses="crossover_tokens")
def crossover_pinned(ctx):
    _pinned(ctx, "crossover_tokens", [
        ({"weight_bytes": 1000, **TOY}, 8, "1,000 B of weights, 128 B per token: 7 tokens hold 896 B, 8 hold 1,024 B"),
        ({"weight_bytes": 1024, **TOY}, 8, "1,024 B of weights, 128 B per token: exactly 8 tokens"),
        ({"weight_bytes": 1025, **TOY}, 9, "1,025 B of weights, 128 B per token: 8 tokens fall 1 B short"),
        ({"weight_bytes": 0, **TOY}, 0, "no weights at all: an empty cache already matches them"),
        ({"weight_bytes": LLAMA2_7B_WEIGHT_BYTES, **LLAMA2}, _ceil_div(13_476_831_232, 524_288),
         "Llama-2-7B in fp16 (13,476,831,232 B) at 512 KiB per token: 25,706 tokens"),
        ({"weight_bytes": LLAMA3_8B_WEIGHT_BYTES, **LLAMA3}, _ceil_div(16_060_522_496, 131_072),
         "Llama-3-8B in bf16 (16,060,522,496 B) at 128 KiB per token (GQA): 122,533 tokens"),
    ])


@CHECKS.add("crossover_tokens on random sizes, at and next to exact multiples", uses="crossover_tokens")
def crossover_random(ctx):
    _exact(ctx, "crossover_tokens", crossovers(), _crossover)


@CHECKS.add("max_batch_size gives the worked numbers", uses="max_batch_size")
def max_batch_pinned(ctx):
    _pinned(ctx, "max_batch_size", [
        ({"memory_bytes": 10_000, "weight_bytes": 2_000, "seq_len": 8, **TOY}, 8_000 // 1_024,
         "10,000 B of memory, 2,000 B of weights, 1,024 B per 8-token sequence: 8,000 B free hold 7 whole caches"),
        ({"memory_bytes": 2_000 + 3 * 1_024, "weight_bytes": 2_000, "seq_len": 8, **TOY}, 3,
         "exactly three 1,024 B caches free next to the weights"),
        ({"memory_bytes": 2_000, "weight_bytes": 2_000, "seq_len": 8, **TOY}, 0,
         "the weights fill the memory exactly: no room for any cache"),
        ({"memory_bytes": 80 * GiB, "weight_bytes": LLAMA3_8B_WEIGHT_BYTES, "seq_len": 8192, **LLAMA3},
         (80 * GiB - 16_060_522_496) // (8192 * 131_072),
         "Llama-3-8B (16,060,522,496 B) on 80 GiB at 8,192 tokens, 1 GiB per sequence: 65 sequences"),
    ])


@CHECKS.add("max_batch_size on random sizes, at and next to exact multiples", uses="max_batch_size")
def max_batch_random(ctx):
    _exact(ctx, "max_batch_size", batches(), _max_batch)


@CHECKS.add("max_batch_size when not even the weights fit: 0 or a ValueError", uses="max_batch_size")
def max_batch_weights_do_not_fit(ctx):
    def body(c, ex):
        try:
            got = _call(c.t, "max_batch_size", ex)
        except ValueError as exc:
            if not value_error_names(exc, ("memory_bytes", "weight_bytes")):
                c.fail(f"max_batch_size with less memory than weights raised ValueError({str(exc)!r}); the message "
                       "should name memory_bytes or weight_bytes", ex, ("unnamed", "weights do not fit"))
            return
        problem = report.compare(0, got)
        if problem:
            c.fail("the weights alone do not fit in memory, so no sequence can run: expected 0 (or a ValueError "
                   f"naming memory_bytes)\n  {problem}", ex, got)

    ctx.case({"memory_bytes": 10_000, "weight_bytes": 16_000, "seq_len": 8, **TOY}, body)
    ctx.forall(batches(weights_fit=False), body, max_examples=10)


@CHECKS.add("crossover_tokens and max_batch_size reject bad input with a ValueError naming it",
            uses="crossover_tokens")
def task3_rejects_bad_input(ctx):
    _rejects(ctx, "crossover_tokens", [
        ("a negative weight_bytes", {"weight_bytes": -1, **LLAMA3}, ("weight_bytes",)),
        ("weight_bytes=1000.5", {"weight_bytes": 1000.5, **LLAMA3}, ("weight_bytes",)),
        ("a negative n_kv_heads", {"weight_bytes": 10**9, **LLAMA3, "n_kv_heads": -8}, ("n_kv_heads",)),
    ])
    fits = {"memory_bytes": 80 * GiB, "weight_bytes": LLAMA3_8B_WEIGHT_BYTES, "seq_len": 8192, **LLAMA3}
    _rejects(ctx, "max_batch_size", [
        ("a negative memory_bytes", {**fits, "memory_bytes": -1, "weight_bytes": 0}, ("memory_bytes",)),
        ("a negative weight_bytes", {**fits, "weight_bytes": -1}, ("weight_bytes",)),
        ("a negative seq_len", {**fits, "seq_len": -8192}, ("seq_len",)),
        ("a negative bytes_per_elem", {**fits, "bytes_per_elem": -2}, ("bytes_per_elem",)),
    ])


# -- task 4: what the cache saves ----------------------------------------------------------------
@CHECKS.add("projection_counts gives the worked numbers", uses="projection_counts")
def projections_pinned(ctx):
    _pinned(ctx, "projection_counts", [
        ({"n_steps": 8}, (sum(range(1, 9)), 8),
         "8 passes from a 1-token prompt: uncached 1 + 2 + ... + 8 = 36 projections, cached one per pass = 8"),
        ({"n_steps": 1024}, (1024 * 1025 // 2, 1024), "1,024 passes: uncached 1 + ... + 1,024 = 524,800, cached 1,024"),
        ({"n_steps": 3, "prompt_len": 5}, (5 + 6 + 7, 5 + 1 + 1),
         "a 5-token prompt then 2 steps: uncached 5 + 6 + 7 = 18; cached the prompt's 5, then 1 and 1"),
        ({"n_steps": 1, "prompt_len": 4}, (4, 4), "the prompt pass alone projects its 4 tokens either way"),
    ])


@CHECKS.add("projection_counts on random step counts and prompt lengths", uses="projection_counts")
def projections_random(ctx):
    _exact(ctx, "projection_counts", steps(), _projections)


@CHECKS.add("score_counts gives the worked numbers", uses="score_counts")
def scores_pinned(ctx):
    _pinned(ctx, "score_counts", [
        ({"n_steps": 8}, (sum(L * L for L in range(1, 9)), sum(range(1, 9))),
         "8 passes from a 1-token prompt: uncached 1 + 4 + ... + 64 = 204 scores, cached 1 + 2 + ... + 8 = 36"),
        ({"n_steps": 3, "prompt_len": 5}, (25 + 36 + 49, 25 + 6 + 7),
         "a 5-token prompt then 2 steps: uncached 5x5 + 6x6 + 7x7 = 110; cached the prompt's 5x5, then 6 and 7"),
        ({"n_steps": 1, "prompt_len": 4}, (16, 16), "the prompt pass alone scores 4 x 4 either way"),
    ])


@CHECKS.add("score_counts on random step counts and prompt lengths", uses="score_counts")
def scores_random(ctx):
    _exact(ctx, "score_counts", steps(), _scores)


@CHECKS.add("projection_counts and score_counts reject bad input with a ValueError naming it",
            uses="projection_counts")
def task4_rejects_bad_input(ctx):
    for name in ("projection_counts", "score_counts"):
        _rejects(ctx, name, [
            ("n_steps=0", {"n_steps": 0}, ("n_steps",)),
            ("a negative n_steps", {"n_steps": -3}, ("n_steps",)),
            ("n_steps=2.5", {"n_steps": 2.5}, ("n_steps",)),
            ("a negative prompt_len", {"n_steps": 4, "prompt_len": -1}, ("prompt_len",)),
        ])


# -- promises every function keeps -----------------------------------------------------------------
@CHECKS.add("kv_cache_bytes_from_config follows Hugging Face's config conventions", uses="kv_cache_bytes_from_config")
def from_config_conventions(ctx):
    llama3 = 2 * 32 * 8 * 128  # numbers per token of Llama-3-8B: K and V x 32 layers x 8 KV heads x 128
    no_hidden = _without(LLAMA3_8B, "hidden_size")
    text_only = {**_without(LLAVA_7B, "torch_dtype"), "text_config": {**LLAVA_7B["text_config"], "torch_dtype": "float32"}}
    top_only = {**LLAVA_7B, "text_config": _without(LLAVA_7B["text_config"], "torch_dtype")}
    _pinned(ctx, "kv_cache_bytes_from_config", [
        (_config_case({**LLAMA3_8B, "head_dim": 128}, 1, 10), 10 * llama3 * 2, "an explicit head_dim and a hidden_size"),
        (_config_case({**no_hidden, "head_dim": 128}, 1, 10), 10 * llama3 * 2,
         "an explicit head_dim and no hidden_size: hidden_size is only needed when head_dim is absent"),
        (_config_case({**no_hidden, "head_dim": 128, "hidden_size": None}, 1, 10), 10 * llama3 * 2,
         "an explicit head_dim and \"hidden_size\": null"),
        (_config_case({**LLAMA2_7B, "num_key_value_heads": None}, 1, 10), 10 * 2 * 32 * 32 * 128 * 2,
         "\"num_key_value_heads\": null means not set: one KV head per query head (32)"),
        (_config_case({**LLAMA3_8B, "torch_dtype": None, "dtype": "float32"}, 1, 10), 10 * llama3 * 4,
         "\"torch_dtype\": null next to \"dtype\": \"float32\": null means not set, so 4 bytes"),
        (_config_case({**_without(LLAMA3_8B, "torch_dtype"), "dtype": "float32", "torch_dtype": None}, 1, 10),
         10 * llama3 * 4, "\"dtype\": \"float32\" with \"torch_dtype\": null written after it"),
        (_config_case(_without(LLAMA3_8B, "torch_dtype"), 3, 10, 2), 30 * llama3 * 2,
         "no dtype in the config but bytes_per_elem=2 given: the dtype is not needed"),
        (_config_case(text_only, 1, 10), 10 * 2 * 32 * 32 * 128 * 4,
         "a multimodal config with its dtype (float32) only inside text_config"),
        (_config_case(top_only, 1, 10), 10 * 2 * 32 * 32 * 128 * 2,
         "a multimodal config with its dtype (float16) only at the top level"),
        (_config_case({**LLAMA3_8B, "text_config": None}, 1, 10), 10 * llama3 * 2,
         "\"text_config\": null means there is no nested model: the top level holds the fields"),
    ])


@CHECKS.add("every answer is an exact int, far past 2**53", uses="kv_bytes_per_token")
def exact_past_2_53(ctx):
    L, H, D, E = 2**21 + 1, 2**13 + 3, 2**11 + 1, 8
    per_token = 2 * L * H * D * E  # about 2**50: times a batch and a sequence, far past 2**53
    B, S = 2**20 + 7, 2**24 + 1
    model = _sizes(L, H, D, E)
    weights = 3 * 2**61 + 5
    config = {**_without(GEMMA2_9B, "dtype"), "num_hidden_layers": L, "num_key_value_heads": H, "head_dim": D,
              "torch_dtype": "float64"}
    n, p = 2**17 + 3, 2**40 + 1
    cases = [
        ("kv_bytes_per_token", model, per_token),
        ("kv_cache_bytes", {"n_layers": L, "batch": B, "seq_len": S, "n_kv_heads": H, "head_dim": D,
                            "bytes_per_elem": E}, B * S * per_token),
        ("kv_cache_bytes_from_config", _config_case(config, B, S), B * S * per_token),
        ("crossover_tokens", {"weight_bytes": weights, **model}, weights // per_token + 1),
        ("max_batch_size", {"memory_bytes": weights + 7 * per_token * S - 1, "weight_bytes": weights, "seq_len": S,
                            **model}, 6),
        ("projection_counts", {"n_steps": n, "prompt_len": p}, (n * p + n * (n - 1) // 2, p + n - 1)),
        ("score_counts", {"n_steps": n, "prompt_len": p},
         (n * p * p + p * n * (n - 1) + (n - 1) * n * (2 * n - 1) // 6, p * p + (n - 1) * p + n * (n - 1) // 2)),
    ]
    for name, args, expected in cases:
        _pinned(ctx, name, [(args, expected, "numbers this large are exact only in integer arithmetic")])


def _bad_values(arg: str, minimum: int) -> list:
    """What is wrong, and the bad value: one below the smallest allowed, a fraction, a string."""
    return [(f"{arg}={minimum - 1}", minimum - 1), (f"{arg}=2.5", 2.5), (f"{arg}='8'", "8")]


GOOD = {  # a valid call of each function, with the smallest value each argument allows
    "kv_bytes_per_token": ({"n_layers": 32, "n_kv_heads": 8, "head_dim": 128, "bytes_per_elem": 2}, {}),
    "kv_cache_bytes": ({"n_layers": 32, "batch": 2, "seq_len": 100, "n_kv_heads": 8, "head_dim": 128,
                        "bytes_per_elem": 2}, {"batch": 0, "seq_len": 0}),
    "kv_cache_bytes_from_config": (_config_case(LLAMA3_8B, 2, 100, 2), {"batch": 0, "seq_len": 0}),
    "crossover_tokens": ({"weight_bytes": 10**9, **LLAMA3}, {"weight_bytes": 0}),
    "max_batch_size": ({"memory_bytes": 80 * GiB, "weight_bytes": LLAMA3_8B_WEIGHT_BYTES, "seq_len": 8192, **LLAMA3},
                       {"memory_bytes": 0, "weight_bytes": 0}),
    "projection_counts": ({"n_steps": 8, "prompt_len": 3}, {}),
    "score_counts": ({"n_steps": 8, "prompt_len": 3}, {}),
}


@CHECKS.add("every argument of every function rejects a bad value with a ValueError naming it",
            uses="kv_bytes_per_token")
def every_argument_rejects_bad_values(ctx):
    for name, (good, minimums) in GOOD.items():
        cases = [(what, {**good, arg: bad}.items(), (arg,))
                 for arg in good if arg != "config" for what, bad in _bad_values(arg, minimums.get(arg, 1))]
        _rejects(ctx, name, cases)
    fields = [("num_hidden_layers", 0), ("num_attention_heads", 0), ("num_key_value_heads", -8), ("head_dim", 2.5),
              ("num_hidden_layers", "32")]
    _rejects(ctx, "kv_cache_bytes_from_config", [
        ("config given as a list", _config_case([LLAMA3_8B], 1, 8).items(), ("config",)),
        ("config given as the text of a config.json", _config_case('{"num_hidden_layers": 32}', 1, 8).items(),
         ("config",)),
        ("text_config given as a list", _config_case({**LLAMA3_8B, "text_config": [LLAMA3_8B]}, 1, 8).items(),
         ("text_config", "config")),
    ] + [(f"\"{field}\": {value!r}", _config_case({**LLAMA3_8B, field: value}, 1, 8).items(), (field,))
         for field, value in fields])


@CHECKS.add("kv_cache_bytes_from_config leaves the caller's config as it was", uses="kv_cache_bytes_from_config")
def from_config_leaves_config_unchanged(ctx):
    # Configs whose defaults a careless reader writes back: no num_key_value_heads, a null head_dim, a nested
    # text_config. The SPEC: every function leaves its inputs unchanged (the caller reads the config again).
    def body(c, ex):
        config = copy.deepcopy(ex["config"])
        first = c.t.kv_cache_bytes_from_config(config, ex["batch"], ex["seq_len"])
        if config != ex["config"]:
            changed = sorted(k for k in {*config, *ex["config"]} if config.get(k, KeyError) != ex["config"].get(k, KeyError))
            c.fail(f"kv_cache_bytes_from_config(config, {ex['batch']}, {ex['seq_len']}) changed the caller's config "
                   f"(fields {changed}); read it, never write to it", ex, ("changed", tuple(changed)))
        again = c.t.kv_cache_bytes_from_config(config, ex["batch"], ex["seq_len"])
        problem = _int_problem(first, again)
        if problem:
            c.fail(f"kv_cache_bytes_from_config on the same config twice gave two answers\n  {problem}", ex, again)

    for config in (LLAMA2_7B, MISTRAL_7B, LLAVA_7B):
        ctx.case({"config": config, "batch": 2, "seq_len": 10}, body)
