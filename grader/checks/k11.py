"""Hidden checks of kata 11 — beam search over a shared prefix.

The learner's ``beam_search`` drives kata 08's tiny float64 Llama (or a stand-in whose logits
depend on the last token only) over a watched ``grader.paged.PagedKVCache``. The answer comes from
a brute-force beam search from plain uncached forwards (``k11_oracle``), following the SPEC's rules
(rank by summed log-probability, walk the top 2k, EOS candidates finish, the stopping rule).
Where two candidates at a decision are closer than float32 log-probabilities can tell apart, both
answers are accepted. The watched cache notes blocks in use and live sequences; the recording
model notes every forward (shape, positions), so the checks see how the answer was reached.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from grader.checks.k11_judge import decode_count, judge, same_programs
from grader.checks.k11_inputs import PINNED_CASES, PROGRAMS, UNIFORM_CASES, bad_inputs, program
from grader.checks.k11_oracle import ModelFailed, Probed, brute_force, cache_for, failing, stand_in
from grader.checks.support import devices
from grader.checks.support.common import SEEDS, expect_value_error, tiny_llama
from grader.checks.support.models import DEVICE_MODEL, Recording, tiny_model
from grader.nn import Llama, LlamaConfig
from grader.engine import Checks, GraderBug

CHECKS = Checks("11")

LENGTH_PENALTIES = [1.0, 0.0, 2.0, 0.5, -0.5]
# The large case's model: 16 query heads over 4 KV heads, a vocabulary of three-digit ids.
LARGE = dict(vocab_size=320, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=16,
             num_key_value_heads=4)


# -- inputs -------------------------------------------------------------------------------------
def _model(ex: dict, device, recording: type = Recording):
    """The tiny float64 Llama of ``ex``'s seed; the larger one (``LARGE``) when ``ex["large"]``."""
    if ex.get("large"):
        return tiny_llama(ex["seed"], device, cls=recording, **LARGE)
    return tiny_model(ex["seed"], device, recording)


def _prompt(ex: dict, model) -> list[int]:
    g = torch.Generator().manual_seed(ex["seed"] + 1)
    return torch.randint(0, model.config.vocab_size, (ex["prompt_len"],), generator=g).tolist()


@st.composite
def searches(draw, max_beams=4, max_new=12, max_prompt=20):
    return {"prompt_len": draw(st.integers(1, max_prompt)), "num_beams": draw(st.integers(1, max_beams)),
            "max_new_tokens": draw(st.integers(1, max_new)), "length_penalty": draw(st.sampled_from(LENGTH_PENALTIES)),
            "block_size": draw(st.sampled_from([1, 2, 4, 16])), "seed": draw(SEEDS)}


def _eos_for(model, prompt, ex) -> int:
    """An EOS the search really meets: a token of the top hypotheses found without EOS, mid-way if possible."""
    plain = brute_force(model, prompt, ex["num_beams"], ex["max_new_tokens"], None, ex["length_penalty"])
    for tokens, _ in plain["result"]:
        if len(tokens) > 2:
            return tokens[len(tokens) // 2]
    return plain["result"][0][0][0]


def _search(c, model, prompt, ex, cache, eos=None):
    """The learner's search of ``ex``; ``length_penalty`` left to its default (1.0) when ``ex["default_penalty"]``."""
    penalty = {} if ex.get("default_penalty") else {"length_penalty": ex["length_penalty"]}
    return c.t.beam_search(model, prompt, ex["num_beams"], ex["max_new_tokens"], cache=cache, eos_token_id=eos,
                           **penalty)


# -- checks ---------------------------------------------------------------------------------------
@CHECKS.add("without EOS: the hypotheses and scores of a brute-force beam search", uses="beam_search")
def matches_brute_force_without_eos(ctx):
    def body(c, ex):
        model = _model(ex, c.device)
        prompt = _prompt(ex, model)
        got = _search(c, model, prompt, ex, cache_for(model, block_size=ex["block_size"], watched=False))
        want = brute_force(model, prompt, ex["num_beams"], ex["max_new_tokens"], None, ex["length_penalty"])
        judge(c, model, prompt, ex, got, want)

    ctx.case({"prompt_len": 7, "num_beams": 3, "max_new_tokens": 6, "length_penalty": 1.0, "default_penalty": True,
              "block_size": 4, "seed": 3}, body)  # length_penalty left out: 1.0
    ctx.case({"prompt_len": 3, "num_beams": 4, "max_new_tokens": 20, "length_penalty": 0.5, "block_size": 16,
              "seed": 8}, body)  # the longest search the SPEC's 1e-6 tolerance is sized for
    ctx.forall(searches(), body, max_examples=10)


@CHECKS.add("with EOS: finished hypotheses, the 2k walk, the stopping rule and the order of the result",
            uses="beam_search")
def matches_brute_force_with_eos(ctx):
    def body(c, ex):
        model = _model(ex, c.device)
        prompt = _prompt(ex, model)
        eos = ex["eos_token_id"] if "eos_token_id" in ex else _eos_for(model, prompt, ex)
        got = _search(c, model, prompt, ex, cache_for(model, block_size=ex["block_size"], watched=False), eos)
        want = brute_force(model, prompt, ex["num_beams"], ex["max_new_tokens"], eos, ex["length_penalty"])
        judge(c, model, prompt, {**ex, "eos_token_id": eos}, got, want)

    ctx.case({"prompt_len": 5, "num_beams": 4, "max_new_tokens": 10, "length_penalty": 1.0, "block_size": 4,
              "seed": 11}, body)
    ctx.case({"prompt_len": 11, "num_beams": 3, "max_new_tokens": 6, "length_penalty": 1.0, "block_size": 4,
              "seed": 96}, body)  # an EOS candidate ranks within the top num_beams while live beams remain
    ctx.case({"prompt_len": 260, "num_beams": 4, "max_new_tokens": 6, "length_penalty": 1.0, "block_size": 16,
              "large": True, "eos_token_id": 247, "seed": 1}, body)  # positions past 256, 16 query heads, 3-digit ids
    ctx.forall(searches(max_new=14).filter(lambda e: e["max_new_tokens"] >= 3), body, max_examples=10)


@st.composite
def small_vocab(draw):
    return {"vocab": draw(st.integers(3, 7)), "prompt": draw(st.lists(st.integers(0, 2), min_size=1, max_size=4)),
            "num_beams": draw(st.integers(1, 4)), "max_new_tokens": draw(st.integers(1, 8)),
            "eos_token_id": draw(st.sampled_from([None, 0, 1])), "length_penalty": draw(st.sampled_from(LENGTH_PENALTIES)),
            "spread": draw(st.sampled_from([1.0, 3.0])), "seed": draw(SEEDS)}


@CHECKS.add("a model whose logits depend on the last token: ties, EOS everywhere, few candidates", uses="beam_search")
def small_vocabulary_and_ties(ctx):
    def body(c, ex):
        model, prompt = stand_in(ex, c.device), ex["prompt"]
        cache = cache_for(model, block_size=2, watched=False)
        got = _search(c, model, prompt, ex, cache, ex["eos_token_id"])
        want = brute_force(model, prompt, ex["num_beams"], ex["max_new_tokens"], ex["eos_token_id"],
                           ex["length_penalty"], exact_ties=True)
        judge(c, model, prompt, ex, got, want, exact=bool(ex.get("uniform")))
        decode_count(c, model.calls - 1, want, ex)  # the stopping rule, exactly: ties stop too

    for case in UNIFORM_CASES + PINNED_CASES:
        ctx.case(case, body)
    ctx.forall(small_vocab(), body, max_examples=25)


@CHECKS.add("the prompt is prefilled once (batch 1); each decode step is one batch of the live beams' last tokens",
            uses="beam_search")
def prefill_once_then_batched_steps(ctx):
    def body(c, ex):
        model = _model(ex, c.device, Probed)
        prompt = _prompt(ex, model)
        eos = _eos_for(model, prompt, ex) if ex["eos"] else None
        model.calls.clear()
        _search(c, model, prompt, ex, cache_for(model, block_size=ex["block_size"]), eos)
        want = brute_force(model, prompt, ex["num_beams"], ex["max_new_tokens"], eos, ex["length_penalty"])
        shown, P, calls = {**ex, "eos_token_id": eos, "prompt": prompt}, len(prompt), model.calls
        first = calls[0]["ids"] if calls else None
        if first is None or tuple(first.shape) != (1, P) or first[0].tolist() != prompt:
            c.fail(f"the first forward should prefill the prompt once, input_ids (1, {P}) = [{prompt}]; it was "
                   f"{'missing' if first is None else first.tolist()}", shown,
                   ("prefill", None if first is None else tuple(first.shape)))
        for s, call in enumerate(calls[1:], start=1):
            ids, pos = call["ids"], call["positions"]
            if ids.shape[1] != 1 or not 1 <= ids.shape[0] <= ex["num_beams"]:
                c.fail(f"forward {s + 1} sent input_ids of shape {tuple(ids.shape)}; after the prefill every forward "
                       f"is a decode step: one row per live beam (at most num_beams = {ex['num_beams']}), one new "
                       "token each, everything older read from the cache", shown, ("decode shape", s, tuple(ids.shape)))
            if pos is None or pos.flatten().tolist() != [P + s - 1] * ids.shape[0]:
                c.fail(f"decode step {s}: position ids {None if pos is None else pos.flatten().tolist()}, expected "
                       f"{P + s - 1} for every row (the beams hold {P} prompt + {s - 1} new tokens before it)",
                       shown, ("positions", s))
            if not want["ambiguous"] and s <= len(want["steps"]):
                rows = sorted(t[-1] for t in want["steps"][s - 1])
                if sorted(ids.flatten().tolist()) != rows:
                    c.fail(f"decode step {s} fed the tokens {sorted(ids.flatten().tolist())}; the live beams after step "
                           f"{s} end in {rows} (a finished hypothesis is not a live beam)", shown,
                           ("decode rows", s, sorted(ids.flatten().tolist())))
        if len(calls) - 1 > ex["max_new_tokens"] - 1:
            c.fail(f"{len(calls) - 1} decode forwards for max_new_tokens = {ex['max_new_tokens']}; the prefill's "
                   f"logits give the first new token, so at most {ex['max_new_tokens'] - 1} decode forwards are needed",
                   shown, ("decode count", len(calls) - 1))
        decode_count(c, len(calls) - 1, want, shown)

    ctx.case({"prompt_len": 9, "num_beams": 3, "max_new_tokens": 5, "length_penalty": 1.0, "block_size": 4,
              "eos": False, "seed": 5}, body)
    ctx.forall(searches(max_new=8).map(lambda e: {**e, "eos": e["seed"] % 2 == 0}), body, max_examples=6)


def _bound(P: int, b: int, k: int, longest: int) -> int:
    """Blocks a shared-prefix search may hold: the prompt's blocks once, and per beam its partly
    filled prompt block (copied) and the blocks of its own tokens, up to the longest sequence."""
    return -(-P // b) + k * (-(-max(longest, P) // b) - P // b)


@CHECKS.add("beams share the prompt's blocks, dropped beams are freed before the next step, all freed at the end",
            uses="beam_search")
def blocks_shared_and_freed(ctx):
    def body(c, ex):
        model = _model(ex, c.device, Probed)
        prompt = _prompt(ex, model)
        eos = _eos_for(model, prompt, ex) if ex["eos"] else None
        model.calls.clear()
        cache = cache_for(model, num_blocks=512, block_size=ex["block_size"])
        _search(c, model, prompt, ex, cache, eos)
        P, b, k, shown = len(prompt), ex["block_size"], ex["num_beams"], {**ex, "eos_token_id": eos, "prompt": prompt}
        for s, call in enumerate(model.calls[1:], start=1):
            rows, alive = call["ids"].shape[0], call["alive"]
            if alive is not None and alive > rows + 1:
                c.fail(f"decode step {s} ran {rows} beam(s) while the cache held {alive} sequences; only the live "
                       "beams (and the prompt's own sequence) may be there: free a dropped beam before the next step",
                       shown, ("alive", s, alive - rows))
        for i, (what, used, longest) in enumerate(cache.events):
            limit = _bound(P, b, k, longest)
            if used > limit:
                c.fail(f"after {what} (call {i + 1} on the cache) {used} blocks were in use; sharing the prompt "
                       f"allows at most {limit}: the prompt's {-(-P // b)} block(s) once, and per beam its partly "
                       f"filled prompt block and its own tokens' blocks (block size {b}, sequences up to {longest} "
                       "tokens)", shown, ("blocks", i, used - limit))
        if cache.in_use or cache.alive:
            c.fail(f"after beam_search returned, {cache.in_use} block(s) were still in use and {len(cache.alive)} "
                   "sequence(s) were still in the cache; free every sequence before returning", shown,
                   ("left", cache.in_use, len(cache.alive)))

    ctx.case({"prompt_len": 10, "num_beams": 4, "max_new_tokens": 9, "length_penalty": 1.0, "block_size": 4,
              "eos": False, "seed": 2}, body)
    ctx.forall(searches(max_new=10).map(lambda e: {**e, "eos": e["seed"] % 3 == 0}), body, max_examples=8)


def _caused_by(exc: BaseException, kind: type) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


@CHECKS.add("every sequence is freed even when the model raises: nothing is left in the cache", uses="beam_search")
def freed_when_the_model_raises(ctx):
    # The README: "Free every sequence before returning, even when something raised." The model raises
    # half-way through a forward (after one layer wrote into the cache): on its third forward (the second
    # decode step, beams forked from the prompt and from each other), and on its first (the prefill).
    def body(c, ex):
        model = failing(ex, c.device)
        cache = cache_for(model, block_size=ex["block_size"])
        shown = {k: v for k, v in ex.items()}
        try:
            result = c.t.beam_search(model, ex["prompt"], ex["num_beams"], ex["max_new_tokens"], cache=cache,
                                     eos_token_id=ex["eos_token_id"])
        except NotImplementedError:
            raise
        except Exception as exc:
            if not _caused_by(exc, ModelFailed):
                c.fail(f"the model raised ModelFailed on its forward {ex['fail_at']}; beam_search raised "
                       f"{type(exc).__name__}: {exc} instead (while cleaning up?)", shown, ("raised", type(exc).__name__))
        else:
            c.fail(f"the model raised ModelFailed on its forward {ex['fail_at']}, but beam_search returned "
                   f"{result!r}: let the model's error through", shown, ("returned",))
        if model.calls < ex["fail_at"]:
            raise GraderBug(f"the failing model was called {model.calls} times, never reaching forward {ex['fail_at']}")
        if cache.in_use or cache.alive:
            c.fail(f"the model raised on its forward {ex['fail_at']}; after beam_search let the error through, "
                   f"{cache.in_use} block(s) were still in use and {len(cache.alive)} sequence(s) "
                   f"({sorted(map(repr, cache.alive))}) still in the cache. Free every sequence before returning, even "
                   "when something raised (try / finally)", shown, ("left after an error", cache.in_use, len(cache.alive)))

    base = {"vocab": 6, "prompt": [3, 1, 4], "num_beams": 3, "max_new_tokens": 6, "eos_token_id": None,
            "spread": 3.0, "seed": 23, "block_size": 2}
    ctx.case({**base, "fail_at": 3}, body)
    ctx.case({**base, "fail_at": 1}, body)
    ctx.case({**base, "fail_at": 4, "num_beams": 2, "eos_token_id": 0, "block_size": 4}, body)


@CHECKS.add("a float32 model with a float32 cache (scores are Python floats)", uses="beam_search")
def works_in_float32(ctx):
    def body(c, ex):
        model = tiny_model(ex["seed"], c.device).float()
        prompt = _prompt(ex, model)
        got = _search(c, model, prompt, ex, cache_for(model, block_size=ex["block_size"], watched=False))
        want = brute_force(model, prompt, ex["num_beams"], ex["max_new_tokens"], None, ex["length_penalty"], tie=1e-4)
        judge(c, model, prompt, {**ex, "dtype": torch.float32}, got, want, tol=1e-4)

    ctx.case({"prompt_len": 6, "num_beams": 2, "max_new_tokens": 5, "length_penalty": 1.0, "block_size": 4,
              "seed": 13}, body)


@CHECKS.add("bad input raises ValueError naming the argument; the first and last valid values are accepted",
            uses="beam_search")
def rejects_bad_input(ctx):
    def body(c, ex):
        model = tiny_model(ex["seed"], c.device)
        V = model.config.vocab_size
        for what, args, kwargs, name in bad_inputs(model, V):
            kwargs = {"cache": cache_for(model, watched=False), **kwargs}
            expect_value_error(c, c.t.beam_search, model, *args, what=f"beam_search with {what}", names=(name,),
                               example=ex, **kwargs)
        single = tiny_model(ex["seed"], c.device).float()
        expect_value_error(c, c.t.beam_search, single, [1, 2], 2, 3, cache=cache_for(single, dtype=torch.float64,
                           watched=False), what="beam_search with a float64 cache for a float32 model",
                           names=("cache",), example=ex)
        edge = {"num_beams": 1, "max_new_tokens": 1, "eos_token_id": V - 1, "length_penalty": 1.0}
        prompt = [0, V - 1]  # the first and last token ids, the last one EOS too
        got = _search(c, model, prompt, edge, cache_for(model, watched=False), V - 1)
        judge(c, model, prompt, edge, got, brute_force(model, prompt, 1, 1, V - 1, 1.0))

    ctx.case({"seed": 0}, body)


@CHECKS.add("a bfloat16 or float16 model: log-probabilities in float32 or wider", uses="beam_search")
def half_precision_models(ctx):
    def body(c, ex):
        model, prompt = stand_in(ex, c.device), ex["prompt"]
        got = _search(c, model, prompt, ex, cache_for(model, block_size=2, watched=False), ex["eos_token_id"])
        want = brute_force(model, prompt, ex["num_beams"], ex["max_new_tokens"], ex["eos_token_id"],
                           ex["length_penalty"], exact_ties=True)  # in float64 from the half logits
        judge(c, model, prompt, ex, got, want)

    for dtype in (torch.bfloat16, torch.float16):
        ctx.case({"vocab": 6, "prompt": [3, 1], "num_beams": 3, "max_new_tokens": 5, "eos_token_id": 0,
                  "length_penalty": 1.0, "spread": 3.0, "seed": 17, "dtype": dtype}, body)


@CHECKS.add("the result and the prompt are the caller's: a second search on the same cache is unchanged",
            uses="beam_search")
def results_are_the_callers(ctx):
    def body(c, ex):
        for what, kind in PROGRAMS.items():
            run = program(kind, c.device)
            same_programs(c, {**ex, "program": what}, c.expected(ex, run, what), run(c.t, ex))

    ctx.case({"vocab": 6, "prompt": [2, 5], "num_beams": 3, "max_new_tokens": 4, "eos_token_id": 0,
              "length_penalty": 1.0, "spread": 3.0, "seed": 21}, body)


# -- the device -------------------------------------------------------------------------------
def _device_scenario(s):
    from grader.paged import PagedKVCache

    model = devices.module_on(s, lambda: Llama(LlamaConfig(**DEVICE_MODEL)), dtype=torch.float64)
    heads, width = DEVICE_MODEL["num_key_value_heads"], DEVICE_MODEL["hidden_size"] // DEVICE_MODEL["num_attention_heads"]
    with torch.inference_mode():  # the pages and every write into them alike, whether or not beam_search says so
        cache = PagedKVCache(16, 2, DEVICE_MODEL["num_hidden_layers"], heads, width, dtype=torch.float64, device=s.device)
        s.call("beam_search(model, [5, 9, 2], 2, 3, cache=...), the model and the cache on the test device",
               s.ctx.t.beam_search, model, [5, 9, 2], 2, 3, cache=cache, eos_token_id=0)


@CHECKS.add("beam_search runs on the model's device (no tensor made on the CPU by accident)", uses="beam_search")
def keeps_the_device(ctx):
    ctx.case({"prompt": [5, 9, 2], "num_beams": 2, "max_new_tokens": 3},
             lambda c, ex: devices.keeps_the_device(c, ex, _device_scenario))
