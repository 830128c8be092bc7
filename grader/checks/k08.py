"""Hidden checks of kata 08 — a batched generate loop.

The learner's ``generate`` drives a tiny float64 Llama (``grader.nn``) built here from a seed.
Its tokens are checked against each prompt decoded alone by plain uncached forwards, and a
recording subclass of the model notes every call the loop makes (input ids, position ids, the
cache and what its ``update`` returned), so the checks can see how the answer was reached: one
prefill, one-token steps, positions that skip padding, a cache written in place, an early exit.
Two stand-in models with fixed logits test EOS bookkeeping and the sampling distribution.
"""
from __future__ import annotations

import copy
import numbers

import torch
from hypothesis import strategies as st

from grader.checks.support import devices, protocol
from grader.checks.support.common import SEEDS, expect_value_error
from grader.checks.support.models import (DEVICE_MODEL, TIE, TINY, FixedLogits, first_wrong, greedy_alone,
                                          successor_model, tiny_model)
from grader.engine import Checks, report
from grader.nn import Llama, LlamaConfig

CHECKS = Checks("08")

CHI2_DF7_P1E6 = 40.52  # chi-square with 7 degrees of freedom exceeds this with probability 1e-6
CUDA = torch.cuda.is_available()


# -- inputs -------------------------------------------------------------------------------------
def _prompts(ex: dict) -> list[list[int]]:
    g = torch.Generator().manual_seed(ex["seed"] + 1)
    return [torch.randint(0, TINY["vocab_size"], (n,), generator=g).tolist() for n in ex["lengths"]]


@st.composite
def batches(draw, max_batch=8, max_len=40, max_new=6):
    B = draw(st.integers(1, max_batch))
    return {
        "lengths": draw(st.lists(st.integers(1, max_len), min_size=B, max_size=B)),
        "max_new_tokens": draw(st.integers(1, max_new)),
        "pad_token_id": draw(st.sampled_from([None, 0, 7])),  # None: the default
        "seed": draw(SEEDS),
    }


def _run(c, ex, device=None, **kwargs):
    """The learner's generate on the example's prompts; returns (model, prompts, rows)."""
    model, prompts = tiny_model(ex["seed"], device or c.device), _prompts(ex)
    got = c.t.generate(model, prompts, ex["max_new_tokens"], **_pad(ex), **kwargs)
    return model, prompts, _rows(c, got, len(prompts), ex)


def _pad(ex) -> dict:
    """The pad_token_id keyword of the example (None or absent: left out, so the default 0 applies)."""
    return {} if ex.get("pad_token_id") is None else {"pad_token_id": ex["pad_token_id"]}


def _rows(c, got, n: int, ex) -> list[list[int]]:
    if not isinstance(got, (list, tuple)) or len(got) != n:
        c.fail(f"generate should return a list with one list of new tokens per prompt ({n}); got {report.describe(got)}",
               ex, ("returned", report.describe(got)))
    for b, row in enumerate(got):
        if not isinstance(row, (list, tuple)) or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                                         for t in row):
            c.fail(f"row {b} of the result should be a list of int token ids; got {report.describe(row)} "
                   "(call .tolist() on a tensor)", ex, ("row type", report.describe(row)))
    return [list(map(int, row)) for row in got]



# -- the answer: each prompt decoded alone ------------------------------------------------------
@torch.no_grad()
def _verify(c, model, prompts, rows, ex, *, eos=None, tie=TIE, where=""):
    """Every row against its prompt decoded alone by uncached forwards (tie-aware), and its length."""
    N, shown = ex["max_new_tokens"], {**ex, **({"eos_token_id": eos} if eos is not None else {})}
    for b, (prompt, row) in enumerate(zip(prompts, rows)):
        wrong = first_wrong(model, prompt, row, eos, tie)
        if wrong is not None and wrong[0] == "token":
            _, i, token, best, logits = wrong
            mine = f"{float(logits[token]):.4f}" if 0 <= token < logits.shape[-1] else "out of range"
            c.fail(f"{where}row {b} (prompt of {len(prompt)} tokens), new token {i}: you produced {token}, "
                   f"but the model on that prompt alone (no padding, no cache) gives {best} "
                   f"(logit {float(logits[best]):.4f}; yours {mine})\n  all your rows: {rows}", shown, rows)
        if wrong is not None:
            i = wrong[1]
            c.fail(f"{where}row {b}: new token {i} is the EOS {eos}, but the row goes on with "
                   f"{row[i + 1:]}; a row stops after its first EOS and stays stopped\n  all your rows: {rows}",
                   shown, rows)
        if len(row) > N or (len(row) < N and (eos is None or eos not in row)):
            why = "no more than max_new_tokens" if len(row) > N else "max_new_tokens, as the row produced no EOS"
            c.fail(f"{where}row {b}: {len(row)} new tokens, expected {N} ({why})\n  all your rows: {rows}", shown, rows)


# -- checks ---------------------------------------------------------------------------------------
@CHECKS.add("greedy generate gives every prompt the tokens it gets decoded alone", uses="generate")
def greedy_matches_each_prompt_alone(ctx):
    def body(c, ex):
        model, prompts, rows = _run(c, ex)
        _verify(c, model, prompts, rows, ex)

    ctx.case({"lengths": [5, 1, 12], "max_new_tokens": 4, "pad_token_id": 0, "seed": 3}, body)
    # Past the drawn sizes once: a prompt of 300 tokens beside one of 7 (293 pads), the default pad id.
    ctx.case({"lengths": [300, 7], "max_new_tokens": 3, "pad_token_id": None, "seed": 9}, body)
    ctx.forall(batches(), body, max_examples=6)


@CHECKS.add("one prefill over the left-padded prompts, then one-token steps over the same cache", uses="generate")
def prefill_then_one_token_steps(ctx):
    def body(c, ex):
        model, prompts, rows = _run(c, ex)
        calls, B, P = model.calls, len(prompts), max(ex["lengths"])
        if not calls:
            c.fail("generate never called the model", ex, ("calls", 0))
        first = calls[0]["ids"]
        if first.dim() != 2 or first.shape[0] != B or first.shape[1] < P:
            c.fail(f"the first call should be one prefill over all {B} prompts, padded to (B, P) = ({B}, {P}); "
                   f"it sent input_ids of shape {tuple(first.shape)}", ex, ("prefill shape", tuple(first.shape)))
        pad = 0 if ex.get("pad_token_id") is None else ex["pad_token_id"]
        for b, prompt in enumerate(prompts):
            if first[b, first.shape[1] - len(prompt):].tolist() != prompt:
                c.fail(f"prefill row {b} should end with prompt {b} {prompt} (left padding: pads first, so every "
                       f"prompt ends in the last column); the row was {first[b].tolist()}",
                       ex, ("prefill row", b, first[b].tolist()))
            pads = first[b, :first.shape[1] - len(prompt)].tolist()
            if any(t != pad for t in pads):
                given = "the default pad_token_id 0" if ex.get("pad_token_id") is None else f"pad_token_id {pad}"
                c.fail(f"prefill row {b}: the pads before prompt {b} {prompt} should all be {pad} ({given}: the pads "
                       f"are fed to the model); the row was {first[b].tolist()}", ex, ("pads", b, first[b].tolist()))
        for s, call in enumerate(calls):
            if s and (call["ids"].dim() != 2 or call["ids"].shape[1] != 1 or call["ids"].shape[0] > B):
                c.fail(f"decode step {s} sent input_ids of shape {tuple(call['ids'].shape)}; a decode step feeds only "
                       f"the newest token of each row, (rows, 1), and reads everything older from the cache",
                       ex, ("decode input_ids", s, tuple(call["ids"].shape)))
            if call["cache"] is None:
                c.fail(f"{'decode step ' + str(s) if s else 'the prefill'} passed no cache to the model; the prefill "
                       "must fill one and every decode step must read it", ex, ("no cache", s))

    ctx.case({"lengths": [3, 1, 6], "max_new_tokens": 2, "pad_token_id": None, "seed": 2}, body)
    ctx.forall(batches(max_batch=5, max_len=12, max_new=4), body, max_examples=4)


def _positions(call) -> torch.Tensor:
    ids = call["ids"]
    return call["positions"] if call["positions"] is not None else torch.arange(ids.shape[1]).expand(ids.shape)


@CHECKS.add("position ids count each row's real tokens only (padding skipped)", uses="generate")
def positions_skip_padding(ctx):
    def body(c, ex):
        model, prompts, rows = _run(c, ex)
        calls = model.calls
        why = ("positions count real tokens, cumsum(mask) - 1. The outputs cannot show this: RoPE scores depend "
               "only on position differences, so a constant shift per row cancels - but not in a model with "
               "absolute positions, a sliding window, or a row longer than the position table.")
        prefill = _positions(calls[0])
        for b, prompt in enumerate(prompts):
            got = prefill[b, prefill.shape[1] - len(prompt):].tolist()
            if got != list(range(len(prompt))):
                c.fail(f"prefill row {b} (a prompt of {len(prompt)} tokens, {prefill.shape[1] - len(prompt)} pads): "
                       f"its tokens got positions {got}, expected 0 … {len(prompt) - 1}; {why}",
                       ex, ("prefill positions", b, got))
        for s, call in enumerate(calls[1:], start=1):
            pos = _positions(call)
            if pos.shape[0] != len(prompts):
                continue  # rows were dropped; which is which cannot be told here
            for b, prompt in enumerate(prompts):
                if s < len(rows[b]) and int(pos[b, -1]) != len(prompt) + s - 1:
                    c.fail(f"decode step {s}, row {b}: new token {s - 1} of a {len(prompt)}-token prompt was given "
                           f"position {int(pos[b, -1])}, expected {len(prompt) + s - 1} ({len(prompt)} prompt tokens "
                           f"+ {s - 1} new ones before it); {why}", ex, ("decode position", s, b, int(pos[b, -1])))

    ctx.case({"lengths": [2, 6, 1], "max_new_tokens": 3, "pad_token_id": 0, "seed": 5}, body)
    ctx.forall(batches(max_batch=5, max_len=12, max_new=4), body, max_examples=3)


@CHECKS.add("the cache is written in place, not grown by concatenation", uses="generate")
def cache_written_in_place(ctx):
    def body(c, ex):
        model, prompts, rows = _run(c, ex)
        first = {}
        for s, call in enumerate(model.calls):
            for u in call["updates"]:
                seen = first.setdefault(u["layer"], (s, u))
                if (u["k"], u["v"]) != (seen[1]["k"], seen[1]["v"]):
                    c.fail(f"layer {u['layer']}: at {'decode step ' + str(s) if s else 'the prefill'} cache.update "
                           f"returned keys/values in new memory (shape {u['shape']}; at call {seen[0] + 1} they were "
                           f"{seen[1]['shape']} elsewhere). A preallocated cache writes into buffers made once and "
                           "returns them (or views of them); torch.cat copies the whole cache every step.",
                           ex, ("new storage", u["layer"], s))

    ctx.forall(batches(max_batch=4, max_len=10, max_new=5).filter(lambda e: e["max_new_tokens"] > 2), body,
               max_examples=2)


def _eos_example(model, prompts, n):
    """An EOS the greedy paths really produce: new to its row, mid-way, missing from some other row."""
    paths = [greedy_alone(model, p, n) for p in prompts]
    for b, path in enumerate(paths):
        for i in range(1, n - 1):
            token = path[i]
            if token not in path[:i] and (len(paths) == 1 or any(token not in other for other in paths)):
                return token
    return paths[0][n // 2]


@CHECKS.add("a row stops after its EOS (included); the other rows go on", uses="generate")
def eos_stops_its_row(ctx):
    def body(c, ex):
        model, prompts = tiny_model(ex["seed"], c.device), _prompts(ex)
        eos = _eos_example(model, prompts, ex["max_new_tokens"])
        model.calls.clear()
        got = c.t.generate(model, prompts, ex["max_new_tokens"], eos_token_id=eos, **_pad(ex))
        _verify(c, model, prompts, _rows(c, got, len(prompts), ex), ex, eos=eos)

    ctx.forall(batches(max_batch=5, max_len=10, max_new=8).filter(lambda e: e["max_new_tokens"] >= 4), body,
               max_examples=4)


SUCCESSOR_CASES = [
    # vocab 16, EOS 15: a row ending in token t continues t+1, t+2, ..., 15 and stops.
    {"prompts": [[3, 12], [15, 9, 13], [7], [14]], "max_new_tokens": 12},  # rows stop after 3, 2, 8, 1
    {"prompts": [[1, 14], [14]], "max_new_tokens": 6},  # every row stops at its first token
    {"prompts": [[2], [15, 4]], "max_new_tokens": 3},  # no row reaches EOS
    # EOS 0, the id many vocabularies give a special token: the rows count past 15 to 0 and stop.
    {"prompts": [[12], [3, 15], [14, 2, 13]], "max_new_tokens": 5, "eos": 0},  # rows stop after 4, 1, 3
]


@CHECKS.add("EOS is sticky and the loop stops calling the model once every row is done", uses="generate")
def early_exit_when_all_done(ctx):
    def body(c, ex):
        model, eos, N = successor_model(16, c.device), ex.get("eos", 15), ex["max_new_tokens"]
        got = _rows(c, c.t.generate(model, ex["prompts"], N, eos_token_id=eos), len(ex["prompts"]), ex)
        expected = [[(p[-1] + 1 + i) % 16 for i in range(min(N, (eos - p[-1] - 1) % 16 + 1))] for p in ex["prompts"]]
        shown = {**ex, "eos_token_id": eos, "model": "each token t is followed by t + 1"}
        if got != expected:
            zero = " (0 is a token id like any other: test eos_token_id is not None)" if eos == 0 else ""
            c.fail(f"with a model whose greedy choice after token t is t + 1 (mod 16) and EOS = {eos}, each row should "
                   f"count up to {eos} and stop there (EOS included), or stop at {N} tokens{zero}\n  expected "
                   f"{expected}\n  got      {got}", shown, got)
        needed = max(map(len, expected))
        if model.calls != needed:
            c.fail(f"generate called the model {model.calls} times; {needed} calls make these tokens (a prefill, then "
                   f"one decode step per further token). Once every row is finished, stop: the remaining steps "
                   "would only produce tokens nobody keeps.", shown, ("calls", model.calls))

    for case in SUCCESSOR_CASES:
        ctx.case(case, body)


@CHECKS.add("max_new_tokens 0 and 1, and an empty list of prompts", uses="generate")
def edge_sizes(ctx):
    def body(c, ex):
        if ex["max_new_tokens"] == 0 or not ex["lengths"]:
            model, prompts = tiny_model(ex["seed"], c.device), _prompts(ex)
            got = c.t.generate(model, prompts, ex["max_new_tokens"])
            if got != [[] for _ in prompts]:
                c.fail(f"expected {[[] for _ in prompts]}, got {got!r}", ex, ("edge", report.describe(got)))
            return
        model, prompts, rows = _run(c, ex)
        _verify(c, model, prompts, rows, ex)

    for ex in ({"lengths": [3, 1], "max_new_tokens": 0, "seed": 1}, {"lengths": [], "max_new_tokens": 4, "seed": 1},
               {"lengths": [4, 9, 1], "max_new_tokens": 1, "seed": 2}, {"lengths": [1], "max_new_tokens": 5, "seed": 4}):
        ctx.case(ex, body)


@CHECKS.add("an empty prompt or a negative max_new_tokens raises ValueError naming it", uses="generate")
def rejects_bad_input(ctx):
    def body(c, ex):
        model = tiny_model(ex["seed"], c.device)
        for what, args, names in (("an empty prompt among others", ([[1, 2], []], 3), ("prompts", "prompt")),
                                  ("max_new_tokens = -1", ([[1, 2]], -1), ("max_new_tokens",))):
            expect_value_error(c, c.t.generate, model, *args, what=f"generate with {what}", names=names, example=ex)

    ctx.case({"seed": 0}, body)


@CHECKS.add("bad prompts, sizes, temperatures and pad ids raise ValueError naming the argument", uses="generate")
def rejects_bad_arguments(ctx):
    V = TINY["vocab_size"]

    def body(c, ex):
        model = tiny_model(ex["seed"], c.device)
        for what, args, kwargs, names in (
                ("prompts as a flat list of ints", ([1, 2, 3], 3), {}, ("prompts",)),
                ("prompts = None", (None, 3), {}, ("prompts",)),
                ("a token id 2.5 in a prompt", ([[1, 2.5]], 3), {}, ("prompts",)),
                (f"a token id {V}, outside a vocabulary of {V}", ([[1, V], [3]], 3), {}, ("prompts",)),
                ("a negative token id", ([[4], [-1, 2]], 3), {}, ("prompts",)),
                ("max_new_tokens = 1.5", ([[1, 2]], 1.5), {}, ("max_new_tokens",)),
                ("max_new_tokens = '3'", ([[1, 2]], "3"), {}, ("max_new_tokens",)),
                ("temperature = -1.0", ([[1, 2]], 3), {"temperature": -1.0}, ("temperature",)),
                ("pad_token_id = -1 and prompts of unequal lengths", ([[1, 2], [3]], 3), {"pad_token_id": -1},
                 ("pad_token_id",)),
                (f"pad_token_id = {V} (vocabulary {V}) and prompts of unequal lengths", ([[1], [2, 3]], 3),
                 {"pad_token_id": V}, ("pad_token_id",))):
            expect_value_error(c, c.t.generate, model, *args, what=f"generate with {what}", names=names, example=ex,
                               **kwargs)
        what = f"generate with token ids 0 and {V - 1} (the first and last of the vocabulary) and pad_token_id = {V - 1}"
        try:  # the boundaries themselves are valid
            c.t.generate(model, [[0, V - 1], [3]], 2, pad_token_id=V - 1)
        except ValueError as exc:
            c.fail(f"{what} raised ValueError({str(exc)!r}); both ids are in the vocabulary", ex, ("rejected", what))

    ctx.case({"seed": 0}, body)


@CHECKS.add("nothing is kept between calls: a second generate on the same model starts afresh", uses="generate")
def no_state_between_calls(ctx):
    def body(c, ex):
        model = tiny_model(ex["seed"], c.device)
        first = {"lengths": ex["first"], "max_new_tokens": ex["first_new"], "seed": ex["seed"]}
        _rows(c, c.t.generate(model, _prompts(first), ex["first_new"], eos_token_id=ex["eos"]), len(ex["first"]), ex)
        prompts = _prompts(ex)
        rows = _rows(c, c.t.generate(model, prompts, ex["max_new_tokens"]), len(prompts), ex)
        _verify(c, model, prompts, rows, ex, where="second call of generate on the same model: ")

    ctx.case({"first": [9, 3, 6], "first_new": 5, "eos": 11, "lengths": [2, 7], "max_new_tokens": 3,
              "pad_token_id": 0, "seed": 17}, body)


def _successor_generate(c, prompts, N):
    """generate on the successor model (no near-tie anywhere, so every correct loop gives the same tokens)."""
    return lambda api, ex: c.call(api.generate, successor_model(16, c.device), prompts, N)


@CHECKS.add("generate leaves the caller's prompts as they were and returns lists that are the caller's",
            uses="generate")
def prompts_and_rows_are_the_callers(ctx):
    def body(c, ex):
        def unchanged(api, e):
            prompts = copy.deepcopy(ex["prompts"])
            rows = c.call(api.generate, successor_model(16, c.device), prompts, ex["max_new_tokens"])
            return {"new tokens": rows, "the caller's prompts after the call": prompts}
        c.differential(ex, unchanged, "generate(model, prompts of unequal lengths, ...): a loop pads a copy, never "
                                      "the caller's lists")
        same = _successor_generate(c, copy.deepcopy(ex["prompts"]), ex["max_new_tokens"])
        other = _successor_generate(c, [[5], [1, 2]], ex["max_new_tokens"])
        c.differential(ex, protocol.twice(same, "generate"), "the same generate twice")
        c.differential(ex, protocol.changed_by_caller(same, same, "generate again"),
                       "generate, its lists overwritten by the caller, then the same generate again")
        c.differential(ex, protocol.kept(same, other, "the lists generate returned", "another generate"),
                       "the lists one generate returned, held while another generate runs")

    ctx.case({"prompts": [[3, 12], [15, 9, 13], [7]], "max_new_tokens": 4, "model": "each token t is followed by t + 1"},
             body)


@CHECKS.add("sampling: the same generator seed gives the same tokens", uses="generate")
def sampling_is_reproducible(ctx):
    def body(c, ex):
        model, prompts = tiny_model(ex["seed"], c.device), _prompts(ex)

        def run(global_seed: int) -> list:  # the global RNG differs between the runs, the same in every grading
            with torch.random.fork_rng(devices=[c.device] if c.device.type == "cuda" else []):
                torch.manual_seed(global_seed)
                return _rows(c, c.t.generate(model, prompts, ex["max_new_tokens"], temperature=1.0,
                                             generator=torch.Generator(c.device).manual_seed(ex["seed"])),
                             len(prompts), ex)
        runs = [run(ex["seed"] + 1), run(ex["seed"] + 2)]
        if runs[0] != runs[1]:
            c.fail(f"two runs at temperature 1.0 with generators seeded alike gave\n  {runs[0]}\n  {runs[1]}\n  "
                   "draw with torch.multinomial(..., generator=generator), never from the global RNG",
                   {**ex, "temperature": 1.0}, ("not reproducible",))

    ctx.case({"lengths": [3, 7, 1], "max_new_tokens": 6, "seed": 11}, body)


@CHECKS.add("sampling: a tiny temperature gives the greedy tokens", uses="generate")
def tiny_temperature_is_greedy(ctx):
    T = 1e-4

    def body(c, ex):
        model, prompts, rows = _run(c, ex, temperature=T, generator=torch.Generator(c.device).manual_seed(0))
        # A token 40 T below the best has probability under e^-40: only ties within that are accepted.
        _verify(c, model, prompts, rows, {**ex, "temperature": T}, tie=40 * T)

    ctx.case({"lengths": [4, 2, 9], "max_new_tokens": 5, "pad_token_id": 0, "seed": 21}, body)

    def half(c, ex):  # logits / T of a float16 model overflow float16 (max 65504): scale them in float32
        model, N = successor_model(16, c.device, torch.float16, margin=10.0), ex["max_new_tokens"]
        got = _rows(c, c.t.generate(model, ex["prompts"], N, temperature=T,
                                    generator=torch.Generator(c.device).manual_seed(0)), len(ex["prompts"]), ex)
        expected = [[(p[-1] + 1 + i) % 16 for i in range(N)] for p in ex["prompts"]]
        if got != expected:
            c.fail(f"a float16 model whose logits after token t are +10 for t + 1 and -10 for every other token, at "
                   f"temperature {T}: every row should count up by one\n  expected {expected}\n  got      {got}\n  "
                   f"logits / temperature is 1e5, past float16's largest value: divide in float32 (or wider)",
                   {**ex, "temperature": T, "model": "float16, each token t followed by t + 1"}, got)

    ctx.case({"prompts": [[3], [9, 14]], "max_new_tokens": 4}, half)


SAMPLING_LOGITS = [1.0, 0.5, 0.0, -0.5, 2.0, -1.0, 0.25, 1.5]


@CHECKS.add("sampling: drawn tokens follow softmax(logits / temperature)", uses="generate")
def sampling_follows_the_distribution(ctx):
    def body(c, ex):
        logits = torch.tensor(SAMPLING_LOGITS, dtype=torch.float64)
        model, rows_n, N = FixedLogits(logits, c.device), ex["rows"], ex["max_new_tokens"]
        got = _rows(c, c.t.generate(model, [[1]] * rows_n, N, temperature=ex["temperature"],
                                    generator=torch.Generator(c.device).manual_seed(ex["seed"])), rows_n, ex)
        draws = [t for row in got for t in row]
        if len(draws) != rows_n * N or not all(0 <= t < len(SAMPLING_LOGITS) for t in draws):
            c.fail(f"expected {rows_n} rows of {N} tokens in 0 … {len(SAMPLING_LOGITS) - 1}", ex, ("draws", len(draws)))
        counts = torch.bincount(torch.tensor(draws), minlength=len(SAMPLING_LOGITS)).double()
        candidates = {
            "softmax(logits / temperature)": torch.softmax(logits / ex["temperature"], 0),
            "softmax(logits), the temperature ignored": torch.softmax(logits, 0),
            "softmax(logits * temperature)": torch.softmax(logits * ex["temperature"], 0),
        }
        stats = {name: float(((counts - len(draws) * p) ** 2 / (len(draws) * p)).sum()) for name, p in candidates.items()}
        if stats["softmax(logits / temperature)"] <= CHI2_DF7_P1E6:
            return
        looks = [name for name, s in stats.items() if s <= CHI2_DF7_P1E6]
        if int(counts.max()) == len(draws):
            looks = ["always one token (no sampling)"]
        expected = (len(draws) * candidates["softmax(logits / temperature)"]).round().long().tolist()
        c.fail(f"a model whose logits are always {SAMPLING_LOGITS}: over {len(draws)} draws at temperature "
               f"{ex['temperature']} the counts of tokens 0 … 7 were {counts.long().tolist()}, expected about "
               f"{expected} (chi-square {stats['softmax(logits / temperature)']:.0f}, over {CHI2_DF7_P1E6} happens by "
               f"chance with probability 1e-6)" + (f"; they look like {looks[0]}" if looks else ""),
               ex, ("distribution", looks[0] if looks else "neither"))

    ctx.case({"rows": 250, "max_new_tokens": 8, "temperature": 0.5, "seed": 1}, body)


@CHECKS.add("generate runs on the model's device " + ("(CUDA)" if CUDA else "(CPU: no CUDA device here to check)"),
            uses="generate")
def runs_on_the_model_device(ctx):
    device = torch.device("cuda") if CUDA else ctx.device

    def body(c, ex):
        model, prompts, rows = _run(c, ex, device=device, eos_token_id=ex["eos_token_id"])
        _verify(c, model, prompts, rows, ex, eos=ex["eos_token_id"], where=f"on {device.type}: ")
        away = [u["device"] for call in model.calls for u in call["updates"] if u["device"] != device.type]
        if away:
            c.fail(f"the model is on {device.type} but cache.update returned tensors on {away[0]}; allocate the "
                   "cache on model.device", ex, ("cache device", away[0]))

    ctx.case({"lengths": [6, 3, 11, 1], "max_new_tokens": 5, "pad_token_id": 0, "eos_token_id": 7, "seed": 8}, body)


def _device_scenario(s):
    model = devices.module_on(s, lambda: Llama(LlamaConfig(**DEVICE_MODEL)), dtype=torch.float64)
    prompts, generate = [[5, 9, 2], [7]], s.ctx.t.generate
    s.call("generate(model, [[5, 9, 2], [7]], 3, eos_token_id=0), the model on the test device", generate, model,
           prompts, 3, eos_token_id=0)
    s.call("generate(model, [[5, 9, 2], [7]], 2, temperature=1.0, generator=...), the model on the test device",
           generate, model, prompts, 2, temperature=1.0, generator=torch.Generator().manual_seed(0))


@CHECKS.add("generate keeps every tensor on the model's device (none made on the CPU by accident)", uses="generate")
def keeps_the_device(ctx):
    ctx.case({"lengths": [3, 1], "max_new_tokens": 3}, lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))
