"""Mutation testing of the references: ``python -m grader.mutation NN [NN ...] [--jobs J] [--report PATH]``.

Each mutant is the kata's reference with one small edit (grader.mutation.operators); the test suite
is the kata's own checks, exactly what ``pytest katas/NN --kata-target=FILE`` runs, graded in
children forked from one warm process (grader.mutation.runner). A mutant is *killed* when a check
fails on it (or it times out, or crashes its process); one that passes every check *survives*, and
is either listed as equivalent, with the reason, in ``grader/mutation_equivalents.toml``, or is a
gap in the checks. The score of a kata is killed / (mutants - equivalent).

Why a small mutator of our own rather than mutmut or cosmic-ray: mutmut 3 rewrites the sources into
a ``mutants/`` copy of the project with trampolines inside functions, switched by an environment
variable, and runs its own pytest collection to map tests to functions; our grader loads the file
to grade by path, as a fresh module, so a mutant must be a whole file. cosmic-ray needs a config and
a session database per run, and runs a test command per mutant in a fresh process, which here means
importing torch again for each (seconds, against a fraction of one in a forked child). Neither knows
the operators this field needs (a dtype cast, a dropped ``.contiguous()``, ``if x`` for
``if x is not None``) without writing plugins. The standard library's ``ast`` gives the positions
that a mutator of about two hundred lines needs, with no new dependency.
"""
from grader.mutation.operators import Mutant, mutants
from grader.mutation.runner import Outcome, run

__all__ = ["Mutant", "Outcome", "mutants", "run"]
