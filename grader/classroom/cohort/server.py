"""Imported by the warm server (grader.classroom.cohort.sandbox.start_server) after the grader and before
it forks any worker or judge: work that every forked process would otherwise repeat, done once.

The first time a process runs a Hypothesis test case, Hypothesis creates its global Random and
registers it, which starts with a full ``gc.collect()`` and ``gc.get_referrers``: about 0.2 s in a
process holding torch, a fifth of what a worker costs. Done here, each fork inherits it (with the
thread that forks). The PRNG states are restored on the way out, as after any test case.
"""
from __future__ import annotations

try:
    from hypothesis.internal.entropy import deterministic_PRNG
except ImportError:  # another Hypothesis: each process registers its own, as before
    deterministic_PRNG = None

if deterministic_PRNG is not None:
    with deterministic_PRNG():
        pass
