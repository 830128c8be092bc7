"""Hidden checks of kata 18 — the two regimes: exact FLOPs and bytes of a forward, and the roofline.

Pinned cases carry the worked numbers of the README (Llama-3-8B, Llama-2-7B, the tiny Llama; the
H100, the A100, the laptop CPU), every expected value written here as hand arithmetic. Random cases
compare with the exact oracles of grader.checks.k18_counts, which count the same conventions in their
own order of terms. Counts must be Python ints, ratios and times exact (a Fraction, or an int).
Bad input: grader.checks.k18_inputs.
"""
from __future__ import annotations

from fractions import Fraction

from hypothesis import strategies as st

from grader.checks import k18_counts as k
from grader.checks import k18_inputs as inputs
from grader.checks.k18_counts import exact_case, exact_random
from grader.engine import Checks

CHECKS = Checks("18")

# -- task 1: FLOPs --------------------------------------------------------------------------------
L3_DECODE = 2 * (k.L3_MATRICES * 1 + k.L3_PAIR_MACS * 1)  # one token, nothing cached: it sees itself only


def _flops(config, batch, new_tokens, past_len):
    return {"config": config, "batch": batch, "new_tokens": new_tokens, "past_len": past_len}


@CHECKS.add("forward_flops gives the worked numbers", uses="forward_flops")
def flops_pinned(ctx):
    # The tiny Llama, 1 sequence, 3 new tokens after 2 cached: per layer and token q, o 32 x 32, k, v 32 x 16,
    # MLP 3 x 32 x 64 = 9,216 multiply-adds; the 3 tokens see 3 + 4 + 5 = 12 keys, each pair 4 heads x 2 x 8.
    tiny = 2 * (3 * 2 * 9_216 + 2 * 12 * 4 * 2 * 8 + 32 * 48)
    exact_case(ctx, "forward_flops", "int", [
        (_flops(k.TINY, 1, 3, 2), tiny, "the tiny Llama, 3 new tokens after 2 cached: 116,736 FLOPs"),
        (_flops({key: v for key, v in k.TINY.items() if key != "torch_dtype"}, 1, 3, 2), tiny,
         "the same config without a dtype: FLOPs do not depend on it"),
        (_flops(k.LLAMA3_8B, 1, 1, 0), L3_DECODE,
         "Llama-3-8B, one decode step with nothing cached: 2 x 7,504,658,432 matrix numbers + 2 x 262,144 for "
         "attention over the token itself = 15,009,841,152 FLOPs"),
        (_flops(k.LLAMA3_8B, 1, 1, 2047), L3_DECODE + 2 * 2047 * k.L3_PAIR_MACS,
         "Llama-3-8B decoding after 2,047 cached tokens: the step's query sees 2,048 keys"),
        (_flops(k.LLAMA3_8B, 1, 2048, 0),
         2 * (2048 * 32 * k.L3_LAYER + 2048 * 2049 // 2 * k.L3_PAIR_MACS + 4096 * 128256),
         "Llama-3-8B, a 2,048-token prefill: every token through the layers, 2,048 x 2,049 / 2 causal pairs, "
         "the LM head over the last token only: 29,688,401,494,016 FLOPs"),
        (_flops(k.LLAMA3_8B, 64, 1, 4096), 64 * (L3_DECODE + 2 * 4096 * k.L3_PAIR_MACS),
         "Llama-3-8B, 64 decodes after 4,096 cached tokens each: 64 times one"),
        (_flops(k.LLAMA2_7B, 1, 1, 0), 2 * (32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 4096 * 32000 + 32 * 32 * 2 * 128),
         "Llama-2-7B, one decode step: no num_key_value_heads, so k and v are 4096 x 4096 like q and o"),
        (_flops(k.GEMMA2_9B, 1, 1, 0), 2 * (k.G2_MATRICES + 42 * 16 * 2 * 256),
         "Gemma-2-9B, one decode step: head_dim 256 given, so q is 3584 x 4096, not 3584 x 3584 (hidden_size "
         "// heads = 224 is not its head width)"),
        (_flops({**k.LLAMA3_8B, "text_config": None}, 1, 1, 0), L3_DECODE,
         "Llama-3-8B with \"text_config\": null (null means not set): the top level is the language model"),
    ])


@CHECKS.add("forward_flops on random configs and shapes", uses="forward_flops")
def flops_random(ctx):
    exact_random(ctx, "forward_flops", "int", k.shapes(), k.flops)


# -- task 2: bytes and intensity ------------------------------------------------------------------
def _bytes(config, batch, new_tokens, past_len, weight=None, kv=None):
    return {**_flops(config, batch, new_tokens, past_len), "weight_bytes_per_elem": weight, "kv_bytes_per_elem": kv}


L3_WEIGHTS = 2 * k.L3_MATRICES  # 15,009,316,864 bytes in bf16
_VISION = {"model_type": "llava", "hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 24,
           "intermediate_size": 4096, "vocab_size": 32064}  # a vision tower's sizes at the top level
LLAVA_TOP_FLOAT32 = {**_VISION, "torch_dtype": "float32", "text_config": k.LLAMA2_7B}
LLAVA_TOP_ONLY = {**_VISION, "torch_dtype": "float16",
                  "text_config": {key: v for key, v in k.LLAMA2_7B.items() if key != "torch_dtype"}}


@CHECKS.add("forward_bytes gives the worked numbers", uses="forward_bytes")
def bytes_pinned(ctx):
    # The tiny Llama in float32: 2 x 9,216 + 48 x 32 = 19,968 numbers, 79,872 bytes; a token's K and V are
    # 2 x 2 layers x 2 KV heads x 8 x 4 = 256 bytes.
    exact_case(ctx, "forward_bytes", "int", [
        (_bytes(k.TINY, 1, 3, 2), 4 * (2 * 9_216 + 48 * 32) + (2 + 3) * 256,
         "the tiny Llama in float32, 3 new tokens after 2 cached: weights, 2 tokens read, 3 written"),
        (_bytes(k.LLAMA3_8B, 1, 1, 0), L3_WEIGHTS + k.L3_KV_TOKEN,
         "Llama-3-8B decode, nothing cached: 15,009,316,864 bytes of weights and one token's K/V written"),
        (_bytes(k.LLAMA3_8B, 1, 1, 2048), L3_WEIGHTS + 2049 * k.L3_KV_TOKEN,
         "Llama-3-8B decode after 2,048 cached tokens: + 268,435,456 bytes of cache read"),
        (_bytes(k.LLAMA3_8B, 1, 2048, 0), L3_WEIGHTS + 2048 * k.L3_KV_TOKEN,
         "Llama-3-8B 2,048-token prefill: the weights once, not once per token"),
        (_bytes(k.LLAMA3_8B, 64, 1, 4096), L3_WEIGHTS + 64 * 4097 * k.L3_KV_TOKEN,
         "64 decodes after 4,096 cached tokens: the weights once for the batch, every sequence's own cache"),
        (_bytes(k.LLAMA3_8B, 2, 1, 1000, 2, 1), L3_WEIGHTS + 2 * 1001 * k.L3_KV_TOKEN // 2,
         "kv_bytes_per_elem=1 (an fp8 cache next to bf16 weights) halves the cache terms only"),
        (_bytes(k.LLAMA3_8B, 1, 1, 100, 4), 2 * L3_WEIGHTS + 101 * 2 * k.L3_KV_TOKEN,
         "weight_bytes_per_elem=4 given: the cache follows the weights' 4 bytes"),
        (_bytes(k.LLAMA2_7B, 1, 1, 0), 2 * (32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 32000 * 4096) + 2 * 32 * 32 * 128 * 2,
         "Llama-2-7B in float16: 32 KV heads, so 512 KiB per token"),
        (_bytes(k.GEMMA2_9B, 1, 1, 0), 2 * k.G2_MATRICES + 2 * 42 * 8 * 256 * 2,
         "Gemma-2-9B in bfloat16 (under \"dtype\"): head_dim 256, so 86,016 bytes of K and V per token"),
        (_bytes(LLAVA_TOP_FLOAT32, 1, 1, 0), 2 * (32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 32000 * 4096)
         + 2 * 32 * 32 * 128 * 2, "a multimodal config: float16 inside text_config, float32 at the top level; the "
                                  "text model's own dtype comes first, so 2 bytes per number"),
        (_bytes(LLAVA_TOP_ONLY, 1, 1, 0), 2 * (32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 32000 * 4096)
         + 2 * 32 * 32 * 128 * 2, "a multimodal config whose dtype (float16) is at the top level only"),
    ])


@CHECKS.add("forward_bytes on random configs, shapes and element sizes", uses="forward_bytes")
def bytes_random(ctx):
    exact_random(ctx, "forward_bytes", "int", k.byte_shapes(), k.moved)


@CHECKS.add("arithmetic_intensity gives the worked numbers, exact", uses="arithmetic_intensity")
def intensity_pinned(ctx):
    exact_case(ctx, "arithmetic_intensity", "ratio", [
        (_bytes(k.LLAMA3_8B, 1, 1, 0), Fraction(L3_DECODE, L3_WEIGHTS + k.L3_KV_TOKEN),
         "Llama-3-8B, one decode step: about 1.00003 FLOPs per byte"),
        (_bytes(k.LLAMA3_8B, 64, 1, 0), Fraction(64 * L3_DECODE, L3_WEIGHTS + 64 * k.L3_KV_TOKEN),
         "64 decodes share one weight read: about 64 FLOPs per byte"),
        (_bytes(k.LLAMA3_8B, 1, 2048, 0),
         Fraction(2 * (2048 * 32 * k.L3_LAYER + 2048 * 2049 // 2 * k.L3_PAIR_MACS + 4096 * 128256),
                  L3_WEIGHTS + 2048 * k.L3_KV_TOKEN), "a 2,048-token prefill: about 1,943 FLOPs per byte"),
    ])


@CHECKS.add("arithmetic_intensity on random configs and shapes", uses="arithmetic_intensity")
def intensity_random(ctx):
    exact_random(ctx, "arithmetic_intensity", "ratio", k.byte_shapes(),
                 lambda ex: Fraction(k.flops(ex), k.moved(ex)), max_examples=15)


# -- task 3: ridge and roofline time --------------------------------------------------------------
@CHECKS.add("ridge_point gives the published machines' ridges, exact", uses="ridge_point")
def ridge_pinned(ctx):
    exact_case(ctx, "ridge_point", "ratio", [
        (dict(k.H100), Fraction(19_790, 67), "H100: 989.5 TFLOP/s over 3.35 TB/s = 19,790 / 67, about 295"),
        (dict(k.A100), Fraction(312_000, 2_039), "A100: 312 TFLOP/s over 2,039 GB/s, about 153"),
        (dict(k.LAPTOP), Fraction(15), "the laptop CPU: 768 GFLOP/s over 51.2 GB/s = 15"),
        ({"peak_flops": 989.5e12, "bandwidth": 3.35e12}, Fraction(19_790, 67), "the H100's peaks given as floats"),
        ({"peak_flops": 0.1, "bandwidth": 3}, Fraction(3_602_879_701_896_397, 3 * 2**55),
         "a float is taken at its exact binary value: 0.1 is 3,602,879,701,896,397 / 2**55, not 1/10"),
        ({"peak_flops": Fraction(1, 3), "bandwidth": Fraction(2, 7)}, Fraction(7, 6), "Fractions divide exactly"),
    ])


@CHECKS.add("ridge_point on random peaks", uses="ridge_point")
def ridge_random(ctx):
    peaks = st.tuples(k.RATES, k.RATES).map(lambda pair: {"peak_flops": pair[0], "bandwidth": pair[1]})
    exact_random(ctx, "ridge_point", "ratio", peaks, lambda ex: Fraction(ex["peak_flops"]) / Fraction(ex["bandwidth"]))


def _timed(shape: dict, hardware: dict) -> dict:
    return {**{key: shape[key] for key in ("config", "batch", "new_tokens", "past_len")}, **hardware,
            "weight_bytes_per_elem": shape.get("weight_bytes_per_elem"), "kv_bytes_per_elem": shape.get("kv_bytes_per_elem")}


@CHECKS.add("roofline_time gives the worked times to first token and per output token", uses="roofline_time")
def time_pinned(ctx):
    prefill = 2 * (2048 * 32 * k.L3_LAYER + 2048 * 2049 // 2 * k.L3_PAIR_MACS + 4096 * 128256)
    decode_bytes = L3_WEIGHTS + 2049 * k.L3_KV_TOKEN
    exact_case(ctx, "roofline_time", "ratio", [
        (_timed(_bytes(k.LLAMA3_8B, 1, 2048, 0), k.H100), Fraction(prefill, k.H100["peak_flops"]),
         "Llama-3-8B, 2,048-token prefill on an H100: compute-bound, about 30.0 ms"),
        (_timed(_bytes(k.LLAMA3_8B, 1, 1, 2048), k.H100), Fraction(decode_bytes, k.H100["bandwidth"]),
         "Llama-3-8B, one decode step after 2,048 tokens on an H100: bandwidth-bound, about 4.56 ms"),
        (_timed(_bytes(k.LLAMA3_8B, 1, 1, 2048), k.A100), Fraction(decode_bytes, k.A100["bandwidth"]),
         "the same decode step on an A100: about 7.49 ms"),
        (_timed(_bytes(k.LLAMA3_8B, 1, 2048, 0), k.LAPTOP), Fraction(prefill, k.LAPTOP["peak_flops"]),
         "the prefill on the laptop CPU: compute-bound, about 38.7 s"),
        (_timed(_bytes(k.TINY, 1, 16, 0), k.LAPTOP), Fraction(4 * (2 * 9_216 + 48 * 32) + 16 * 256, 51_200_000_000),
         "the tiny Llama's 16-token prefill on the laptop CPU: 627,712 FLOPs over 83,968 bytes is 7.5 per byte, "
         "below the ridge of 15, so bandwidth-bound"),
    ])


@CHECKS.add("roofline_time on random configs, shapes and peaks", uses="roofline_time")
def time_random(ctx):
    @st.composite
    def timed(draw):
        return _timed(draw(k.byte_shapes()), {"peak_flops": draw(k.RATES), "bandwidth": draw(k.RATES)})

    exact_random(ctx, "roofline_time", "ratio", timed(), k.seconds, max_examples=15)


# -- task 4: the decode crossover -----------------------------------------------------------------
def _cross(config, past_len, hardware, weight=None, kv=None):
    return {"config": config, "past_len": past_len, **hardware, "weight_bytes_per_elem": weight, "kv_bytes_per_elem": kv}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@CHECKS.add("decode_crossover_batch gives the worked batches", uses="decode_crossover_batch")
def crossover_pinned(ctx):
    h_peak, h_bw = k.H100["peak_flops"], k.H100["bandwidth"]
    # Llama-3-8B on an H100: B x f x bw >= (W + B x c) x peak, with f = FLOPs and c = bytes per sequence.
    at_0 = _ceil(L3_WEIGHTS * h_peak, L3_DECODE * h_bw - k.L3_KV_TOKEN * h_peak)
    f_128 = L3_DECODE + 2 * 128 * k.L3_PAIR_MACS
    at_128 = _ceil(L3_WEIGHTS * h_peak, f_128 * h_bw - 129 * k.L3_KV_TOKEN * h_peak)
    tiny_w, tiny_c, tiny_f = 4 * (2 * 9_216 + 48 * 32), 256, 2 * (2 * 9_216 + 2 * 4 * 2 * 8 + 32 * 48)
    exact_case(ctx, "decode_crossover_batch", "int", [
        (_cross(k.LLAMA3_8B, 0, k.H100), at_0, "Llama-3-8B on an H100, nothing cached: batch 297"),
        (_cross(k.LLAMA3_8B, 128, k.H100), at_128, "Llama-3-8B on an H100, 128 cached tokens each: batch 440"),
        (_cross(k.LLAMA3_8B, 1024, k.H100), None,
         "Llama-3-8B on an H100, 1,024 cached tokens each: a sequence adds more memory time than compute time"),
        (_cross(k.LLAMA3_8B, 0, k.LAPTOP), 16, "Llama-3-8B on the laptop CPU (ridge 15), nothing cached: batch 16"),
        # A tie: peak = 5 f and bw = W + 5 c make the times equal at batch 5 exactly (B W >= 5 W).
        (_cross(k.TINY, 0, {"peak_flops": 5 * tiny_f, "bandwidth": tiny_w + 5 * tiny_c}), 5,
         "the tiny Llama on a machine where compute time equals memory time at batch 5: equal counts as reached"),
        (_cross(k.TINY, 0, {"peak_flops": tiny_f, "bandwidth": tiny_c}), None,
         "the tiny Llama where one sequence adds exactly as much compute time as memory time: never"),
        # One more sequence adds a hair (half a unit of peak x bandwidth) more compute time than memory time.
        (_cross(k.TINY, 0, {"peak_flops": tiny_f, "bandwidth": tiny_c + Fraction(1, 2 * tiny_f)}), 2 * tiny_w * tiny_f,
         "the tiny Llama where each sequence adds barely more compute time than memory time: a crossover exists, "
         "at a batch of 6,420,430,848"),
        (_cross(k.TINY, 0, {"peak_flops": 1, "bandwidth": 10**12}), 1,
         "a machine with almost no compute: batch 1 is already compute-bound"),
    ])


@CHECKS.add("decode_crossover_batch on random configs, contexts and peaks", uses="decode_crossover_batch")
def crossover_random(ctx):
    @st.composite
    def crossings(draw):
        shape = draw(k.byte_shapes())
        bandwidth = draw(k.RATES)  # the ridge drawn where crossovers happen: 1 to 5,000 FLOPs per byte
        peak = bandwidth * draw(st.fractions(min_value=1, max_value=5000))
        return _cross(shape["config"], shape["past_len"], {"peak_flops": peak, "bandwidth": bandwidth},
                      shape["weight_bytes_per_elem"], shape["kv_bytes_per_elem"])

    def oracle(ex):
        return k.crossover({**ex, "batch": 1, "new_tokens": 1})

    exact_random(ctx, "decode_crossover_batch", "int", crossings(), oracle, max_examples=25)



# -- promises every function keeps ----------------------------------------------------------------
@CHECKS.add("every argument of every function rejects a bad value with a ValueError naming it", uses="forward_flops")
def every_argument_rejects_bad_values(ctx):
    inputs.every_argument(ctx)


@CHECKS.add("a config that is not a dict, or misses or spoils a field, is a ValueError naming it", uses="forward_flops")
def config_rejects_bad_fields(ctx):
    inputs.config_fields(ctx)


@CHECKS.add("the bytes need a dtype: none given and none in the config, or an unknown one, is a ValueError",
            uses="forward_bytes")
def bytes_need_a_dtype(ctx):
    inputs.dtype_needed(ctx)


@CHECKS.add("every function leaves the caller's config as it was", uses="forward_flops")
def leaves_config_unchanged(ctx):
    inputs.leaves_config_unchanged(ctx)


@CHECKS.add("every answer is exact, far past 2**53", uses="forward_flops")
def exact_past_2_53(ctx):
    inputs.past_2_53(ctx)
    exact_random(ctx, "forward_flops", "int", k.shapes(big=True), k.flops, max_examples=10)
    exact_random(ctx, "forward_bytes", "int", k.byte_shapes(big=True), k.moved, max_examples=10)
