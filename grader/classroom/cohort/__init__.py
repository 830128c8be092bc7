"""``kvkata grade``: a cohort's submissions, each run in a sandbox, judged against the reference.

    grading         find the submissions, grade them, stamp and score the rows, merge, write the reports
    reports         CSV, JSON, JUnit, the gradebook and a feedback file per submission
    sandbox         workers forked from a warm server, each sandboxed, with time and memory limits
    server          what the warm server does once, before it forks anything
    confine, kernel the kernel's walls around each worker (Landlock, namespaces, seccomp), raised after the fork
    worker          the learner's side, in the sandbox: record what the code returns (record), watched (guard)
    judge, replay   the grader's side: replay the records against the reference, name mistakes
    judging         judge processes forked from the warm server, judging rows as workers finish
    memo, traces    a judging process' memory: the reference's outputs, Hypothesis' runs
"""
