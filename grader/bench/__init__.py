"""Measurements, never part of grading.

    suite       ``kvkata bench``: the benchmark of the reference solutions (one section a kata: k09, k11, k12, k13)
    roofline    ``kvkata bench --roofline``: this machine's peaks, kata 08's loop on them (kata 18's counts)
    watch       ``python -m grader.bench.watch``: save-to-verdict latency of ``kvkata watch``
    cohort      ``python -m grader.bench.cohort``: grading a cohort, warm server against fresh workers
"""
