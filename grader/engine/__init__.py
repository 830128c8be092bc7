"""The grading mechanism: it knows no kata, no command line and no classroom.

    core        checks and their context (``Ctx``): drawing inputs, comparing, failures
    hangs       a function that hung: stopped, and the other checks that call it not run
    run         one check run against a target: a ``Result``, with the known mistakes it names
    diagnosis   which known mistakes behave like the learner's code
    report      the messages and the comparison of values
    precision   float tolerances derived from the computation (the float64 run, the reference's own error)
    targets     what is graded: a stub, a solution, any file, a notebook's names
    plain       values and exceptions as plain data (what crosses between processes and into records)

The names the checks use are importable from here (``from grader.engine import Ctx, Failure``);
modules of this package import each other directly, never through this one.
"""
from grader.engine.core import (UNSET, Api, Check, Checks, CheckTimeout, Ctx, Failure, GraderBug, LearnerCrash,
                                NotImplementedYet, Result, Unrecorded, innermost_learner_function, run_body,
                                same_draws, time_limit)
from grader.engine.run import diagnose, explain, reconcile, run_check

__all__ = ["UNSET", "Api", "Check", "Checks", "CheckTimeout", "Ctx", "Failure", "GraderBug", "LearnerCrash",
           "NotImplementedYet", "Result", "Unrecorded", "diagnose", "explain", "innermost_learner_function", "reconcile",
           "run_body", "run_check", "same_draws", "time_limit"]
