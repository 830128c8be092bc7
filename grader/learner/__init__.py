"""The learner's side, on top of grading (grader.grade):

    tools       what ``kvkata`` does for one kata: grade a file, hints, reset, the solution diff
    watch       ``kvkata watch``: re-grade on every save (changes: file-change notifications)
    sessions    ``kvkata interview`` / ``submit`` / ``quiz`` / ``history``
    notebooks   the generated notebooks, one a kata (``python -m grader.learner.notebooks``)
    pictures    the notebooks' pictures, drawn from the reference solutions
    playground  ``kvkata generate``: run a loop on a real model
"""
