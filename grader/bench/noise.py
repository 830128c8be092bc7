"""``kvkata bench``: when a timing can be trusted.

Every timed figure of the bench is the median of a few repeats. On a quiet machine the repeats
agree to within a few tens of percent; on a busy one (other programs running, or fewer free
cores than torch has threads, so each small operation waits for a thread the system has given
to someone else) they scatter by factors, and their median can draw a false picture, such as
concatenation costing the same at 256 and at 4,096 cached tokens. So each figure carries the
spread of its repeats, and a figure whose repeats disagree too much is flagged, never printed
as a result, and never judged against a target.
"""
from __future__ import annotations

import os
import statistics
import time

SPREAD_LIMIT = 0.5  # (upper quartile - lower quartile) / median above this: the repeats disagree
SHARE_LIMIT = 0.6  # CPU time / wall time of the repeats below this: the process mostly waited for a core
MIN_REPEATS = 3  # fewer repeats than this give no spread, so the figure cannot be judged

MISS_MEANS = ("ok / MISS: whether this run shows the effect a target names, at these sizes on this machine, from "
              "figures whose repeats agree. A MISS is a measurement, not a fault in your code (the bench runs "
              "the reference solutions): a GPU, other --threads or the full run (without --quick) move the ratios.")
NOISY_MEANS = ("NOISY marks a figure whose repeats spread by more than {limit:.0%} of their median, or "
               "whose process had a core for less than {share:.0%} of the time it measured (both are shown): "
               "the machine was busy{load}, so the figure is noise, not a result. Close other programs{fewer} "
               "and run again.")


def spread(times) -> float | None:
    """The spread of repeated timings, (upper quartile - lower quartile) / median; None when
    there are fewer than ``MIN_REPEATS`` of them or the median is not positive."""
    times = [float(t) for t in times]
    if len(times) < MIN_REPEATS:
        return None
    median = statistics.median(times)
    if median <= 0:
        return None
    lower, _, upper = statistics.quantiles(times, n=4, method="inclusive")
    return (upper - lower) / median


def noisy(times, cpu_share: float | None = None) -> bool:
    """Whether repeated timings are no result: they disagree, they are too few to tell, or the
    process had a core for too little of the time (``cpu_share``: CPU time / wall time, on a CPU)."""
    value = spread(times)
    return value is None or value > SPREAD_LIMIT or (cpu_share is not None and cpu_share < SHARE_LIMIT)


def figure(times, cpu_share: float | None = None) -> dict:
    """The median of repeated timings with what it takes to trust it:
    ``{"median", "spread", "cpu_share", "noisy"}``."""
    value = spread(times)
    return {"median": statistics.median(times), "spread": None if value is None else round(value, 3),
            "cpu_share": None if cpu_share is None else round(cpu_share, 3), "noisy": noisy(times, cpu_share)}


def repeat(fn, repeats: int, sync=None, on_cpu: bool = True) -> tuple[dict, object]:
    """``fn()`` timed ``repeats`` times (``sync()`` before and after each, e.g. a CUDA synchronize):
    the ``figure`` in seconds, with the CPU share when the work runs ``on_cpu``, and the last result."""
    times, result = [], None
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(repeats):
        if sync:
            sync()
        start = time.perf_counter()
        result = fn()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return figure(times, cpu / wall if on_cpu and measurable(wall) else None), result


def measurable(wall: float) -> bool:
    """Whether the process clock can tell a CPU share over ``wall`` seconds (its tick is coarse on
    some systems: then only windows of many ticks count)."""
    return wall > 0 and time.get_clock_info("process_time").resolution * 20 <= wall


def mark(timing: dict) -> str:
    """What a progress line adds to a figure: nothing, or `` [NOISY: repeats spread 240%]``."""
    if not timing["noisy"]:
        return ""
    why = []
    if timing["spread"] is None:
        why.append("too few repeats to tell")
    elif timing["spread"] > SPREAD_LIMIT:
        why.append(f"repeats spread {timing['spread']:.0%}")
    if timing.get("cpu_share") is not None and timing["cpu_share"] < SHARE_LIMIT:
        why.append(f"had a core {timing['cpu_share']:.0%} of the time")
    return f" [NOISY: {', '.join(why)}]"


def verdict(line: str, value: float, ok: bool, inputs_noisy: bool) -> str:
    """One target line: ``ok``, ``MISS`` or, when a figure it divides is noisy, ``NOISY`` (not judged)."""
    if inputs_noisy:
        return f"NOISY {line}: {value:.2f} — not judged, a figure it uses is noise (see below)"
    return f"{'ok  ' if ok else 'MISS'} {line}: {value:.2f}"


def load() -> str:
    """``, load average 7.9 on 2 cores`` where the system tells it, else an empty string."""
    try:
        one_minute = os.getloadavg()[0]
    except (AttributeError, OSError):
        return ""
    return f", load average {one_minute:.1f} on {os.cpu_count() or 1} cores"


DEFAULT_THREADS = 2


def busy() -> tuple[float | None, int]:
    """(the one-minute load average, or None where the system does not tell it; the cores)."""
    try:
        return os.getloadavg()[0], os.cpu_count() or 1
    except (AttributeError, OSError):
        return None, os.cpu_count() or 1


def threads(asked: int | None, load: float | None, cores: int) -> tuple[int, str]:
    """Torch threads for the bench and a note to print: ``asked`` when given; else 2, or 1 when
    other programs leave fewer free cores than that (each small operation would wait for a thread
    the system runs elsewhere: a run of minutes becomes one of a quarter of an hour)."""
    if asked is not None:
        return asked, ""
    free = cores if load is None else cores - load
    if free >= DEFAULT_THREADS - 0.5:  # half a core of background work is a quiet machine
        return DEFAULT_THREADS, ""
    return 1, (f"kvkata bench: the machine is busy (load average {load:.1f} on {cores} cores): timing with 1 "
               f"thread; --threads {DEFAULT_THREADS} insists")


def notes(flagged: int, threads: int = 1) -> list[str]:
    """What the verdicts mean, printed after them; the NOISY line only when something was flagged."""
    lines = [MISS_MEANS]
    if flagged:
        fewer = " (or pass --threads 1)" if threads > 1 else ""
        lines.append(f"{flagged} figure(s) flagged. " + NOISY_MEANS.format(limit=SPREAD_LIMIT, share=SHARE_LIMIT,
                                                                          load=load(), fewer=fewer))
    return lines
