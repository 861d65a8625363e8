"""Wall-clock medians of repeated calls: the latency measurements compile decisions rest on.

The compile gate times an artifact against eager (:func:`interleaved_ms`), ``winograd_conv1d``
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


def interleaved_ms(
    variants: dict[str, Callable[[], object]],
    *,
    rounds: int = 5,
    repeats: int = 5,
    warmup_each_round: bool = False,
) -> dict[str, float]:
    """Median milliseconds per variant; variants alternate each round so load hits all alike.

    Each round takes the median of ``repeats`` calls per variant. Every variant is called once
    before the first round (first calls allocate and page in the weights), or, with
    ``warmup_each_round``, once before its timed calls in every round.
    """
    if not warmup_each_round:
        for fn in variants.values():
            fn()
    warmup = 1 if warmup_each_round else 0
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            samples[name].append(median_seconds(fn, repeats=repeats, warmup=warmup) * 1000)
    return {name: statistics.median(values) for name, values in samples.items()}
