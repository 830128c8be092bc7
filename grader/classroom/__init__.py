"""The classroom: the instructor's commands, on top of grading.

    handouts        ``kvkata assign``: a level's katas for students, without solutions; each kata's
                    public record (grader.public_record) lets its checks run there
    cohort/         ``kvkata grade``: a cohort's submissions, each in a sandbox, judged against the reference
    autograder      ``kvkata autograder``: the same grading as a Gradescope autograder
"""
