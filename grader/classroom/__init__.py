"""The classroom: handouts, and grading a cohort where nothing a submission does can change a grade.

    handouts        ``kvkata assign``: a level's katas for students, without solutions
    tape, public    a handout's public checks: the reference's answers recorded, and run from the record
    tape_keys       what the two agree on (the replay imports it, never the recorder)
    grading         ``kvkata grade``: find the submissions, grade them, write the reports
    cohort          workers forked from a warm server, each sandboxed, with time and memory limits
    server          what the warm server does once, before it forks anything
    worker          the learner's side, in the sandbox: record what the code returns (record)
    judge, replay   the grader's side: replay the records against the reference, name mistakes
    plain           the plain data that crosses between the two
    judging         judge processes forked from the warm server, judging rows as workers finish
    memo, traces    a judging process' memory: the reference's outputs, Hypothesis' runs
    autograder      ``kvkata autograder``: the same grading as a Gradescope autograder
"""
