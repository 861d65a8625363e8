"""Wall-clock medians of repeated calls: the latency measurements compile decisions rest on.

The compile gate times an artifact against eager (:func:`interleaved_ms`, the medians of
:func:`interleaved_runs_ms`), ``winograd_conv1d``
times the direct and the Winograd convolution (:func:`median_seconds`), and the benchmarks
report with the same two functions.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], *, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def interleaved_runs_ms(
    variants: dict[str, Callable[[], object]],
    *,
    rounds: int = 5,
    repeats: int = 5,
    warmup_each_round: bool = False,
) -> dict[str, list[float]]:
    """Milliseconds per variant per round (the median of ``repeats`` calls); the variants run
    in turn, their order rotating each round, so load hits all alike and none always runs
    first.

    Every variant is called once before the first round (first calls allocate and page in the
    weights), or, with ``warmup_each_round``, once before its timed calls in every round.
    """
    if not warmup_each_round:
        for fn in variants.values():
            fn()
    warmup = 1 if warmup_each_round else 0
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        start = round_ % len(names) if names else 0
        for name in names[start:] + names[:start]:
            samples[name].append(
                median_seconds(variants[name], repeats=repeats, warmup=warmup) * 1000
            )
    return samples


def interleaved_ms(
    variants: dict[str, Callable[[], object]],
    *,
    rounds: int = 5,
    repeats: int = 5,
    warmup_each_round: bool = False,
) -> dict[str, float]:
    """Median milliseconds per variant over the rounds of :func:`interleaved_runs_ms`."""
    runs = interleaved_runs_ms(
        variants, rounds=rounds, repeats=repeats, warmup_each_round=warmup_each_round
    )
    return {name: statistics.median(values) for name, values in runs.items()}
