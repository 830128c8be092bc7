"""A kata's public record: how a handout grades without the reference or the mistake catalogue.

    tape        made from the full repository: the reference's answers and the known mistakes'
                behaviour on the public inputs, as plain data
    public      replayed in a handout: the public checks, run on the learner's code from the record
    records     where a record lives, and whether this copy can grade a kata (no torch: the board asks)

Grading (grader.grade) uses it, so it sits below grade and above the checks it records.
"""
