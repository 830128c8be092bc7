"""The classroom: the instructor's commands, on top of grading.

    choice          which katas (a level, a level alone, single katas) and the points each is worth
    handouts        ``kvkata assign``: the chosen katas for students, without solutions; each kata's
                    public record (grader.public_record) lets its checks run there
    workflow        a handout's GitHub Classroom workflow (points through Classroom's autograding
                    actions) and its own pyproject
    cohort/         ``kvkata grade``: a cohort's submissions, each in a sandbox, judged against the reference
    autograder      ``kvkata autograder``: the same grading as a Gradescope autograder
    prairielearn    ``kvkata prairielearn``: the same grading as a PrairieLearn external grader
"""
