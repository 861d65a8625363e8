"""Medians of timed calls, and variants timed round by round with their warm-up calls."""

from __future__ import annotations

from compilers.timing import interleaved_ms, median_seconds


def test_median_of_timed_calls() -> None:
    calls: list[int] = []
    assert median_seconds(lambda: calls.append(1), repeats=5, warmup=2) >= 0
    assert len(calls) == 7


def test_interleaved_variants_warm_up_once_or_every_round() -> None:
    calls: dict[str, int] = {"a": 0, "b": 0}

    def call(name: str) -> None:
        calls[name] += 1

    variants = {name: (lambda name=name: call(name)) for name in calls}
    timings = interleaved_ms(variants, rounds=3, repeats=4)
    assert set(timings) == {"a", "b"} and all(ms >= 0 for ms in timings.values())
    assert calls == {"a": 1 + 3 * 4, "b": 1 + 3 * 4}
    calls.update(a=0, b=0)
    interleaved_ms(variants, rounds=3, repeats=4, warmup_each_round=True)
    assert calls == {"a": 3 * (1 + 4), "b": 3 * (1 + 4)}
