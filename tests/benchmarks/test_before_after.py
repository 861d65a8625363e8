"""The before/after comparison: which figures it compares, and when a difference is noise."""

from __future__ import annotations

import pytest

from benchmarks.before_after import compare, figures


def test_figures_are_the_measured_numbers_by_path() -> None:
    result = {
        "machine": {"cores": 2},
        "git_dirty": False,
        "repeats": 3,
        "p50_ms": 6.5,
        "p50_ms_runs": [6.4, 6.5],
        "sizes": [{"rows": 10, "job_s": 1.5, "ok": True}],
        "name": "x",
    }
    assert figures(result) == {"p50_ms": 6.5, "sizes.0.rows": 10.0, "sizes.0.job_s": 1.5}


def test_a_difference_within_either_sides_range_is_noise_and_one_beyond_is_moved() -> None:
    before = [{"p50_ms": 10.0, "rps": 100.0}, {"p50_ms": 11.0, "rps": 101.0}]
    after = [{"p50_ms": 10.4, "rps": 120.0}, {"p50_ms": 10.8, "rps": 121.0, "new": 1.0}]
    report = compare(before, after)
    assert set(report["figures"]) == {"p50_ms", "rps"}  # only what every run reported
    assert report["figures"]["p50_ms"]["within_noise"]
    assert report["moved"] == ["rps"]
    assert report["figures"]["rps"]["change"] == pytest.approx(120.5 / 100.5 - 1)
    with pytest.raises(ValueError, match="at least two runs a side"):
        compare(before[:1], after)
