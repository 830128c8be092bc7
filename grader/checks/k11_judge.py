"""How kata 11's checks judge a search: the learner's result read as [(tokens, score)], compared with
the brute force (equal scores within the tolerance in either order), the decode forwards counted
against the stopping rule, and the results of a protocol program (state and aliasing) compared with
the reference's at the same tolerance.
"""
from __future__ import annotations

import numbers

from grader.checks.k11_oracle import TIE, close, score_of
from grader.engine import report


def hypotheses(c, got, ex) -> list[tuple[list[int], float]]:
    """The learner's result as [(tokens, score)], or a clear failure about its form."""
    if not isinstance(got, (list, tuple)):
        c.fail(f"beam_search should return a list of (new tokens, score) pairs; got {report.describe(got)}",
               ex, ("returned", report.describe(got)))
    out = []
    for i, item in enumerate(got):
        ok = isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], (list, tuple))
        ok = ok and all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in item[0])
        ok = ok and isinstance(item[1], numbers.Real) and not isinstance(item[1], bool)
        if not ok:
            c.fail(f"item {i} of the result should be a pair (list of int token ids, float score); got "
                   f"{item!r:.200} (call .tolist() and float() on tensors)", ex, ("item type", i, report.describe(item)))
        out.append(([int(t) for t in item[0]], float(item[1])))
    return out


def show(hyps) -> str:
    return "[" + ", ".join(f"({tokens}, {score:.6f})" for tokens, score in hyps) + "]"


def observed(hyps):
    return [(tokens, float(f"{score:.5g}")) for tokens, score in hyps]


def difference(hyps, want, exact: bool, tol: float) -> str | None:
    """Why ``hyps`` is not ``want`` (equal scores within ``tol``: either order unless ``exact``), or None."""
    if len(hyps) != len(want):
        return f"{len(hyps)} hypotheses, expected {len(want)}"
    i = 0
    while i < len(want):
        j = i + 1  # [i, j): a group of equal scores
        while not exact and j < len(want) and close(want[j][1], want[i][1], tol):
            j += 1
        mine, theirs = [t for t, _ in hyps[i:j]], [t for t, _ in want[i:j]]
        if (mine != theirs) if exact else (sorted(mine) != sorted(theirs)):
            return f"hypothesis {i}: {hyps[i][0]}, expected {want[i][0]}"
        for tokens, score in hyps[i:j]:
            expected = next(s for t, s in want[i:j] if t == tokens)
            if not close(score, expected, tol):
                return f"hypothesis {tokens}: score {score:.8f}, expected {expected:.8f}"
        i = j
    return None


def judge(c, model, prompt, ex, got, expected: dict, *, exact=False, tol=TIE) -> None:
    """The learner's hypotheses against the brute force: the same hypotheses in the same order
    (equal scores: either order unless ``exact``), scores to 1e-6 relative."""
    hyps, want = hypotheses(c, got, ex), expected["result"]
    shown, eos, lp = {**ex, "prompt": prompt}, ex.get("eos_token_id"), ex.get("length_penalty", 1.0)
    for tokens, _ in hyps:
        if eos is not None and eos in tokens[:-1]:
            c.fail(f"hypothesis {tokens} goes on after the EOS {eos}; a candidate ending in EOS is finished and "
                   f"never extended\n  got {show(hyps)}", shown, observed(hyps))
    if expected["ambiguous"]:  # a decision too close to call: only each hypothesis's own score is checked
        for tokens, score in hyps:
            if tokens and not close(score, score_of(model, prompt, tokens, lp), tol):
                c.fail(f"hypothesis {tokens} has score {score:.6f}; its tokens score "
                       f"{score_of(model, prompt, tokens, lp):.6f}", shown, observed(hyps))
        return
    problem = difference(hyps, want, exact, tol)
    if problem:
        c.fail(f"{problem}\n  expected {show(want)}\n  got      {show(hyps)}", shown, observed(hyps))


def decode_count(c, decodes: int, expected: dict, ex) -> None:
    """As many decode forwards as the brute force ran steps past the first: the stopping rule, exactly."""
    want = len(expected["steps"])
    if expected["ambiguous"] or decodes == want:
        return
    if decodes > want:
        why = ("the search should have stopped: num_beams hypotheses were finished and the best live sum / "
               "L ** length_penalty was no better than the num_beams-th best finished score (or no live beam "
               "was left); a decode forward after that is wasted")
    else:
        why = ("the search stopped before the stopping rule allows: fewer than num_beams hypotheses were "
               "finished, or a live beam could still beat them")
    c.fail(f"{decodes} decode forward(s) after the prefill, expected {want}: {why}", ex, ("decode count", decodes))


def same_programs(c, ex, want: dict, got: dict) -> None:
    """A protocol program's results, learner against reference: each labelled call's hypotheses (equal
    scores within the tolerance in either order) and the prompt list after it, exactly."""
    for label, expected in want.items():
        mine = got.get(label) if isinstance(got, dict) else None
        if not isinstance(mine, dict):
            c.fail(f"{label}: no result", ex, ("program", label))
        theirs, hyps = expected["hypotheses"], hypotheses(c, mine["hypotheses"], ex)
        problem = difference(hyps, theirs, False, TIE)
        if problem:
            c.fail(f"{label}: {problem}\n  expected {show(theirs)}\n  got      {show(hyps)}", ex,
                   ("program", label, observed(hyps)))
        if mine["prompt"] != expected["prompt"]:
            c.fail(f"{label}: the prompt list was {expected['prompt']} before the call and {mine['prompt']} after; "
                   "beam_search leaves its inputs unchanged (copy the list before you extend it)", ex,
                   ("prompt changed", label))
