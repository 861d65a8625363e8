"""``cascade bench events``: how bursts are summarized and what they ask for. Its ``--quick``
smoke run (a burst measured, summarized and stamped, every figure finite) runs on the fault
tests' stack, ``tests/faults/test_event_faults.py::test_events_benchmark_smoke``: a fresh
Airflow of its own would cost the suite two more minutes."""

from __future__ import annotations

import pytest

from benchmarks.event_delivery import (
    COUNTS,
    TIMINGS,
    expected_run_count,
    probe_events,
    summarize_bursts,
)
from benchmarks.provenance import spreads
from cascade.assets import TOPIC_DATA_LANDED
from cascade.event_claims import named_path
from cascade.events import make_event


def test_expected_runs_are_the_distinct_run_keys_of_the_published_events() -> None:
    burst = probe_events(5)
    assert expected_run_count(burst) == 1  # one dataset, one partition
    # A probe names no batch location: the claim step would dead-letter a path that is not there.
    assert all(named_path(e.model_dump(mode="json")) is None for e in burst)
    other_day = make_event(
        TOPIC_DATA_LANDED, {"dataset": "probe", "partition": "2026-11-23"}, source="cascade-bench"
    )
    # A redelivered copy (same id) asks for no run of its own; another partition does.
    assert expected_run_count([*burst, burst[0], other_day]) == 2
    assert expected_run_count([]) == 0


def test_a_burst_deals_its_events_over_its_partitions_and_one_event_cannot_be_built() -> None:
    import datetime as dt

    from benchmarks.event_delivery import unbuildable_probe_event
    from cascade.events import parse_event

    burst = probe_events(7, partitions=3)
    days = [e.payload["partition"] for e in burst]
    assert sorted(set(days)) == ["2026-11-20", "2026-11-21", "2026-11-22"]
    assert expected_run_count(burst) == 3
    ahead = unbuildable_probe_event()
    # Valid for the watcher (it reaches a run's claim step), yet after today: not buildable.
    assert parse_event(ahead.model_dump_json()).id == ahead.id
    assert dt.date.fromisoformat(ahead.payload["partition"]) > dt.datetime.now(dt.UTC).date()
    with pytest.raises(ValueError, match="at least one partition"):
        probe_events(1, partitions=0)


def _burst(**figures: float | None) -> dict[str, object]:
    burst: dict[str, object] = {key: 1.0 for key in TIMINGS}
    burst |= {key: 0 for key in COUNTS} | {"runs_started": 1, "expected_runs": 1}
    burst |= {"published": 20, "malformed_published": 3, "coalesce_window_s": 3.0}
    burst |= {"dead_letters_by_kind": {"not-json": 1}, "note": "n"}
    return burst | figures


def test_bursts_give_medians_of_timings_and_sums_of_counts() -> None:
    result = summarize_bursts(
        [
            _burst(latency_p50_s=4.0, lost=1),
            _burst(latency_p50_s=3.0, latency_p95_s=None),
            _burst(latency_p50_s=9.0, dead_lettered=3),
        ]
    )
    assert result["latency_p50_s"] == 4.0 and result["latency_p50_s_runs"] == [4.0, 3.0, 9.0]
    assert result["latency_p95_s_runs"] == [1.0, 1.0]  # a burst without the figure is left out
    assert (result["runs_started"], result["expected_runs"]) == (3, 3)
    assert (result["lost"], result["dead_lettered"]) == (1, 3)
    assert result["dead_letters_by_kind"] == {"not-json": 3}
    assert (result["published"], result["published_total"], result["repeats"]) == (20, 60, 3)
    assert len(result["bursts"]) == 3 and "note" not in result["bursts"][0]
    assert spreads(result)["latency_p50_s"] == {"min": 3.0, "median": 4.0, "max": 9.0, "n": 3}
    with pytest.raises(ValueError, match="no bursts"):
        summarize_bursts([])
