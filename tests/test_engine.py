"""The engine's own parts, each property on its own: how a result is compared with the reference's
(``report.compare``), how one body's run is classified (``engine.run_body``), and the time limit of
a check (``engine.time_limit``)."""
from __future__ import annotations

import math
import signal
import threading
import time

import pytest
import torch

from grader.engine import report, targets
from grader.engine import (Check, CheckTimeout, Ctx, Failure, LearnerCrash, NotImplementedYet, run_body, run_check,
                           time_limit)


# -- report.compare ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,close,far", [(torch.float32, 1e-7, 1e-2), (torch.float64, 1e-13, 1e-6),
                                             (torch.float16, 1e-3, 1e-1), (torch.bfloat16, 4e-3, 2e-1)])
def test_a_float_tensor_matches_within_its_dtypes_rounding_and_not_beyond(dtype, close, far):
    expected = torch.linspace(1, 2, 6, dtype=torch.float64).to(dtype)
    assert report.compare(expected, expected.clone()) is None
    assert report.compare(expected, (expected.double() * (1 + close)).to(dtype)) is None
    problem = report.compare(expected, (expected.double() * (1 + far)).to(dtype))
    assert problem and "differs" in problem and "tolerance" in problem, problem


# -- the tolerance derived from the computation (grader.engine.precision) ----------------------------------
def _narrow_run(error: float):
    """A ``run`` whose float32 result errs by ``error`` where the float64 run is exact: the reference of an
    ill-conditioned input (its error in float32 is ``error``), and the values a target returns."""
    exact = torch.linspace(90, 92, 8, dtype=torch.float64)

    def run(api, ex):
        if ex["dtype"] == torch.float64:
            assert ex["rounded"] == torch.float32  # the float64 run knows which dtype to round its inputs to
            return {"out": exact.clone()}
        return {"out": (exact + api.shift(error)).to(torch.float32)}
    return run


def _ctx(shift_target, shift_reference):
    return Ctx(targets.Target("t", "<t>", {"shift": shift_target}), targets.Target("r", "<r>", {"shift": shift_reference}),
               "cpu")


def test_an_ill_conditioned_input_widens_the_tolerance_by_the_references_own_error():
    """The reference errs by 0.03 on values near 91 (float32's floor there is about 0.009): a correct file in
    another order errs by 0.05 and passes; one that errs by far more than 8 × 0.03 fails, saying why."""
    example = {"dtype": torch.float32}
    ctx = _ctx(lambda e: -0.05, lambda e: e)
    ctx.differential(example, _narrow_run(0.03))  # no Failure
    ctx = _ctx(lambda e: 0.5, lambda e: e)
    with pytest.raises(Failure) as caught:
        ctx.differential(example, _narrow_run(0.03))
    assert "careful float32 computation" in caught.value.message and "8 × 0.03" in caught.value.message, caught.value.message


def test_a_well_conditioned_input_keeps_the_floor():
    """Where the reference is exact, nothing widens: an error of 0.05 on values near 91 fails (a file computing
    in a narrower dtype than its README asks)."""
    ctx = _ctx(lambda e: 0.05, lambda e: 0.0)
    with pytest.raises(Failure) as caught:
        ctx.differential({"dtype": torch.float32}, _narrow_run(0.0))
    assert "differs" in caught.value.message


def test_the_float64_run_sees_the_inputs_rounded_to_the_examples_dtype():
    from grader.checks.support.common import randn

    seen = {}

    def run(api, ex):
        seen[ex["dtype"]] = randn(5, 7, dtype=ex["dtype"])
        return {"x": seen[ex["dtype"]].sum()}
    ctx = _ctx(None, None)
    assert ctx.exact({"dtype": torch.float32}, run) is not None
    ctx.expected({"dtype": torch.float32}, run)
    assert seen[torch.float64].dtype == torch.float64
    assert torch.equal(seen[torch.float64], seen[torch.float32].double())
    assert not torch.equal(randn(5, 7), seen[torch.float32].double())  # outside the float64 run: not rounded


def test_a_tensor_diff_names_the_first_bad_index_and_counts_the_wrong_entries():
    expected = torch.zeros(3, 4)
    got = expected.clone()
    got[1, 2], got[2, 0] = 5.0, -1.0
    problem = report.compare(expected, got)
    assert "first bad index [1, 2]" in problem and "2 of 12 entries wrong" in problem, problem
    assert "max |error| 5 at [1, 2]" in problem, problem
    assert "expected [0.0" in problem  # 12 entries: small enough to be shown whole


def test_a_large_tensor_is_summarised_not_printed():
    expected = torch.zeros(100)
    got = expected.clone()
    got[42] = 1.0
    problem = report.compare(expected, got)
    assert "first bad index [42]" in problem and "expected [" not in problem, problem


def test_nan_matches_nan_only():
    nan = torch.tensor([1.0, math.nan])
    assert report.compare(nan, nan.clone()) is None
    assert report.compare(nan, torch.tensor([1.0, 2.0])) is not None
    assert report.compare(torch.tensor([1.0, 2.0]), nan) is not None


def test_integer_and_boolean_tensors_match_exactly():
    assert report.compare(torch.tensor([3, 4]), torch.tensor([3, 4])) is None
    assert report.compare(torch.tensor([3, 4]), torch.tensor([3, 5])) is not None
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    problem = report.compare(mask, torch.ones(3, 3, dtype=torch.bool))
    assert "■" in problem and "·" in problem and "←" in problem, problem  # a small mask is drawn


@pytest.mark.parametrize("got,says", [
    (torch.zeros(2, 4), "shape (2, 4), expected (2, 3)"),
    (torch.zeros(2, 3, dtype=torch.float64), "dtype torch.float64, expected torch.float32"),
    (torch.zeros(2, 3, device="meta"), "on meta, expected on cpu"),
    ([[0.0] * 3] * 2, "your code returned a list of 2, expected a tensor of shape (2, 3)"),
    (None, "your code returned None"),
])
def test_a_tensor_of_the_wrong_kind_is_named_for_what_is_wrong(got, says):
    problem = report.compare(torch.zeros(2, 3), got)
    assert problem and says in problem, problem


def test_a_mask_of_the_wrong_dtype_is_told_what_a_mask_holds():
    problem = report.compare(torch.ones(2, 2, dtype=torch.bool), torch.ones(2, 2))
    assert "boolean mask" in problem, problem


def test_containers_match_element_by_element_and_say_where():
    assert report.compare((torch.ones(2), [1, 2]), (torch.ones(2), [1, 2])) is None
    assert report.compare((1, 2), [1, 2]) is None  # a tuple or a list: either is a sequence
    problem = report.compare((torch.ones(2), [1, 2]), (torch.ones(2), [1, 3]))
    assert problem.startswith("result[1][1]: got 3, expected 2"), problem
    short = report.compare([1, 2, 3], [1, 2])
    assert "a list of 2" in short and "expected [1, 2, 3]" in short and "got      [1, 2]" in short, short
    assert "expected a tuple of 2" in report.compare((1, 2), 7)


def test_dicts_match_key_by_key_with_no_key_missing_or_extra():
    expected = {"K": torch.zeros(2), "len": 3}
    assert report.compare(expected, {"K": torch.zeros(2), "len": 3}) is None
    assert report.compare(expected, {"K": torch.zeros(2)}) == "result: missing 'len'"
    assert report.compare(expected, {**expected, "V": 1}) == "result: unexpected 'V'"
    assert report.compare(expected, {"K": torch.zeros(2), "len": 4}).startswith("len: got 4, expected 3")
    nested = report.compare({"a": {"b": 1}}, {"a": {"b": 2}})
    assert nested.startswith("a · b: got 2"), nested
    assert "expected a dict" in report.compare(expected, [1])


@pytest.mark.parametrize("expected,same,other", [
    (3, 3, 4), (2.5, 2.5 * (1 + 1e-12), 2.5 * (1 + 1e-6)), (True, True, False), (None, None, 0), ("a", "a", "b"),
])
def test_plain_values_match_when_equal(expected, same, other):
    assert report.compare(expected, same) is None
    assert report.compare(expected, other) is not None


@pytest.mark.parametrize("expected,got", [(1, True), (0, False), (3, 3.0), (1.0, True), (True, 1), (None, False),
                                          ("1", 1), (1.0, "1.0")])
def test_a_plain_value_of_another_type_does_not_match(expected, got):
    """1 == True and 3 == 3.0 in Python, yet a count returned as a bool or a float is a different result."""
    assert report.compare(expected, got) is not None


def test_an_int_is_accepted_where_a_float_is_expected():
    assert report.compare(4.0, 4) is None


# -- engine.run_body --------------------------------------------------------------------------------------
LEARNER = '''
def stub():
    raise NotImplementedError("task 1")


def divide(a, b):
    return a / b


def leave():
    raise SystemExit(3)
'''


@pytest.fixture(scope="module")
def ctx() -> Ctx:
    learner = targets.from_source(LEARNER, "<learner for run_body>", "the learner")
    return Ctx(learner, learner, "cpu")


def _raised(ctx, body, example):
    with pytest.raises(BaseException) as caught:
        run_body(ctx, body, example)
    return caught.value


def test_a_body_that_returns_is_a_pass(ctx):
    ran = []
    assert run_body(ctx, lambda c, e: ran.append(e), {"n": 1}) is None
    assert ran == [{"n": 1}]


def test_a_failure_carries_its_input_and_body_and_says_the_input_once(ctx):
    def body(c, e):
        raise Failure("wrong length", observed=("len", 2))

    failure = _raised(ctx, body, {"batch": 2, "seed": 7})
    assert type(failure) is Failure and failure.example == {"batch": 2, "seed": 7} and failure.body is body
    assert failure.message == "on input batch=2, seed=7\n  wrong length" and failure.observed == ("len", 2)

    def said(c, e):
        raise Failure("on input batch=2\n  wrong length")

    assert _raised(ctx, said, {"batch": 2}).message.count("on input") == 1
    assert _raised(ctx, body, "not a dict").message == "wrong length"


def test_not_implemented_in_the_learners_own_function_is_a_stub(ctx):
    stopped = _raised(ctx, lambda c, e: c.t.stub(), {})
    assert isinstance(stopped, NotImplementedYet) and stopped.name == "stub"


def test_not_implemented_raised_outside_the_learners_code_is_a_crash(ctx):
    def body(c, e):
        raise NotImplementedError("a library feature")

    failure = _raised(ctx, body, {"n": 1})
    assert isinstance(failure, Failure) and not isinstance(failure, NotImplementedYet)
    assert "NotImplementedError: a library feature" in failure.message


def test_a_crash_in_learner_code_is_the_learners_with_their_frames_only(ctx):
    failure = _raised(ctx, lambda c, e: c.t.divide(1, 0), {"n": 1})
    assert isinstance(failure, LearnerCrash) and failure.observed == ("raised", "ZeroDivisionError", "division by zero")
    assert failure.message.startswith("on input n=1\n  your code raised ZeroDivisionError: division by zero")
    assert "<learner for run_body>" in failure.trace and "in divide" in failure.trace
    assert "engine.py" not in failure.trace and "test_engine.py" not in failure.trace
    assert failure.example == {"n": 1} and failure.body is not None


def test_a_crash_in_the_graders_code_says_so_and_matches_no_mistake(ctx):
    def body(c, e):
        return {}["missing"]

    failure = _raised(ctx, body, {"n": 1})
    assert not isinstance(failure, LearnerCrash) and failure.observed == ("grader-hit", "KeyError")
    assert "the grader hit KeyError" in failure.message


def test_a_learner_exit_is_a_crash_and_an_interrupt_is_not_caught(ctx):
    failure = _raised(ctx, lambda c, e: c.t.leave(), {})
    assert isinstance(failure, LearnerCrash) and failure.observed[:2] == ("raised", "SystemExit")

    def interrupted(c, e):
        raise KeyboardInterrupt

    assert isinstance(_raised(ctx, interrupted, {}), KeyboardInterrupt)


# -- engine.time_limit ----------------------------------------------------------------------------------
def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_code_past_the_limit_is_stopped_near_the_limit():
    started = time.perf_counter()
    with pytest.raises(CheckTimeout):
        with time_limit(0.2):
            _spin(30)
    assert time.perf_counter() - started < 10  # stopped: not left to spin its 30 s


def test_learner_code_that_catches_every_exception_is_still_stopped():
    def stubborn():
        end = time.perf_counter() + 30
        while time.perf_counter() < end:
            try:
                _spin(0.01)
            except Exception:
                pass

    with pytest.raises(CheckTimeout):
        with time_limit(0.2):
            stubborn()


def test_code_within_the_limit_runs_to_its_end_and_leaves_no_alarm():
    before = signal.getsignal(signal.SIGALRM)
    with time_limit(5):
        _spin(0.05)
        done = True
    assert done and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is before
    _spin(0.1)  # a stray alarm would raise here


def test_the_alarm_is_disarmed_when_the_body_raises():
    before = signal.getsignal(signal.SIGALRM)
    with pytest.raises(ValueError):
        with time_limit(5):
            raise ValueError("the check's own failure")
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) is before


@pytest.mark.parametrize("seconds", [None, 0])
def test_no_limit_means_none(seconds):
    with time_limit(seconds):
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        _spin(0.3)


def test_a_timeout_a_library_turns_into_its_own_error_is_still_a_timeout(ctx):
    """Hypothesis, replaying a failing example, may call the CheckTimeout raised there "flaky" and raise its own
    error: the check timed out all the same, and is never called an internal grader error."""
    def renamed(c):
        try:
            _spin(30)
        except CheckTimeout as exc:
            raise RuntimeError("Inconsistent results from replaying a test case") from exc

    result = run_check(Check("00", "a check", renamed, ""), ctx, (), 0.2)
    assert result.status == "timeout" and "internal grader error" not in result.message, result.message

    def own_error(c):
        raise RuntimeError("the grader's own bug")

    assert run_check(Check("00", "a check", own_error, ""), ctx, (), 5).status == "error"  # no alarm: an error


def test_outside_the_main_thread_there_is_no_limit_and_no_error():
    """Signals reach only the main thread; a check run in another thread (a notebook's) runs unlimited."""
    outcome = []

    def run():
        try:
            with time_limit(0.05):
                _spin(0.3)
            outcome.append("finished")
        except BaseException as exc:  # the test reports what happened instead of losing it in the thread
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert outcome == ["finished"]


# -- floats as the learner reads them --------------------------------------------------------------------
def test_floats_are_printed_with_the_digits_that_differ():
    """An error of 3e-8 on -0.158 is far beyond float64's tolerance; six digits would print the two values
    the same. Every number of a wrong entry is printed with enough digits to show the difference."""
    expected = torch.tensor([0.584216852, -0.157941263], dtype=torch.float64)
    got = expected + torch.tensor([0.0, -3.19e-8], dtype=torch.float64)
    problem = report.compare(expected, got)
    first = [line for line in problem.splitlines() if "first bad index" in line][0]
    shown = first.split("expected ", 1)[1].split(" (")[0]
    e, g = (s.split()[-1] for s in shown.split(", got "))
    assert e != g, first
    lists = [line.split(" (flattened")[0].split(None, 1)[1] for line in problem.splitlines()
             if line.strip().startswith(("expected [", "got "))]
    assert len(lists) == 2 and eval(lists[0])[1] != eval(lists[1])[1], problem
    assert report.significant_digits([(1.0, 2.0)]) == 6  # no more digits than it takes


def _kata01(old: str, new: str):
    from grader import grade, manifest

    kata = manifest.get("01")
    source = (manifest.REPO_ROOT / kata.solution).read_text()
    assert source.count(old) == 1
    target = targets.from_source(source.replace(old, new), "<kata 01 edit>", "edit")
    return [r for r in grade.grade("01", target, diagnose=False, only=["attention_prefill"]) if not r.passed]


def test_an_error_the_size_of_a_narrower_dtype_names_it():
    """A softmax in float32 on float64 inputs: an error far above float64's tolerance, at float32's level."""
    [failed] = _kata01("out = torch.softmax(scores, dim=-1) @ V",
                       "out = torch.softmax(scores.float(), dim=-1).to(scores.dtype) @ V")
    assert "dtype=float64" in failed.message and "compute in float32 rather than float64" in failed.message, \
        failed.message


def test_an_error_of_another_size_names_no_dtype():
    """A wrong scale is a bug of its own, far beyond any dtype's rounding: no dtype is named."""
    [failed] = _kata01("out = torch.softmax(scores, dim=-1) @ V", "out = torch.softmax(scores * 1.5, dim=-1) @ V")
    assert "rather than" not in failed.message, failed.message
