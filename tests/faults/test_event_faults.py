"""Fault tests against the real broker and Airflow: nothing lost, nothing done twice.

    .venv/bin/pytest -m faults tests/faults

Each test publishes probe events (DAG ``event_probe``: the production watcher, claim ledger and
coalescing, with trivial work) and checks that every event id has exactly one work record.
"""

from __future__ import annotations

import pytest

from benchmarks.event_delivery import account, broker_kill_burst, probe_events, publish_malformed
from cascade.broker import dead_letter_summary, publish_many
from cascade.config import Settings
from infra.stack import down
from tests.faults.conftest import WINDOW_S

pytestmark = [pytest.mark.faults, pytest.mark.slow]


def test_burst_of_1000_events_is_one_run_and_every_id_accounted(event_stack: Settings) -> None:
    events = probe_events(1000)
    publish_malformed(event_stack, 6)
    publish_many(events, settings=event_stack, timeout_s=60)
    result = account([e.id for e in events], event_stack, timeout_s=300, settle_s=2 * WINDOW_S)
    assert result["lost"] == [] and result["duplicates"] == []
    # The burst has no gap longer than the window: one run does the work of all of it.
    assert result["runs_started"] == 1, result["runs"]
    dead = dead_letter_summary(event_stack)
    assert dead["distinct"] == 6
    assert dead["by_kind"] == {"not-json": 2, "unknown-type": 2, "bad-payload": 2}


def test_three_partitions_in_one_burst_are_three_runs_each_on_its_own_events(
    event_stack: Settings,
) -> None:
    from benchmarks.event_delivery import measure_events

    burst = measure_events(event_stack, events=30, malformed=0, window_s=WINDOW_S, partitions=3)
    assert burst["lost"] == 0 and burst["duplicates"] == 0
    assert burst["partitions_published"] == burst["runs_started"] == 3, burst
    assert burst["runs_failed"] == 0 and burst["stalled_runs"] == 0
    assert burst["unbuildable_events_dead_lettered"] == 1


def test_triggerer_restart_with_pending_events_and_broker_restart_before_trigger(
    event_stack: Settings,
) -> None:
    """One Airflow restart (the slow part on 2 cores) covers both faults: events the
    triggerer was still working through when it stopped, and events published while it was
    down, before a broker restart."""
    from infra.stack import start_service

    pending = probe_events(200)
    publish_many(pending, settings=event_stack, timeout_s=60)
    down(event_stack, ("airflow",))  # the triggerer stops mid-way through the 200
    unseen = probe_events(30)
    publish_many(unseen, settings=event_stack, timeout_s=60)
    down(event_stack, ("broker",))  # clean stop: the broker keeps acked writes
    start_service(event_stack, "broker")
    start_service(event_stack, "airflow")
    ids = [e.id for e in pending + unseen]
    result = account(ids, event_stack, timeout_s=300, settle_s=2 * WINDOW_S)
    assert result["lost"] == [] and result["duplicates"] == []
    # Redelivered events can create extra DAG runs; those find their events claimed and skip.
    assert 1 <= result["runs_started"] <= 3, result["runs"]


def test_events_benchmark_smoke_with_a_broker_sigkill_mid_burst(event_stack: Settings) -> None:
    """What `cascade bench events --quick` measures, on the already running fault stack (a
    fresh Airflow alone takes longer than a smoke test may), its broker-kill burst included:
    Apache Kafka SIGKILLed while Airflow's watcher consumes a burst, half the events
    acknowledged before, half published while it is down. After the restart the watcher
    reconnects by itself and every event is worked exactly once (acks=all, commit after store,
    the claim ledger absorbing what is read again)."""
    from benchmarks.event_delivery import (
        COUNTS,
        TIMINGS,
        measure_events,
        summarize_bursts,
        with_broker_kills,
    )
    from benchmarks.provenance import provenance
    from benchmarks.registry import GENERATORS

    # No settle: the fault tests above already watch for late duplicates. One burst, summarized
    # and stamped as `cascade bench events --quick` writes it.
    burst = measure_events(event_stack, events=20, malformed=3, window_s=WINDOW_S, settle_s=0)
    kill = broker_kill_burst(event_stack, events=200, window_s=WINDOW_S)
    assert kill["lost"] == 0 and kill["duplicates"] == 0, kill
    assert kill["runs_started"] >= kill["expected_runs"] == 1
    result = with_broker_kills(summarize_bursts([burst]), [kill])
    assert result["broker"] == {"name": "Apache Kafka", "version": "4.4.0"}
    assert result["broker_kills"] == 1
    assert result["lost_across_kills"] == 0 and result["duplicates_across_kills"] == 0
    result.update(provenance(result, generators=GENERATORS["events"], parameters={"quick": True}))
    for key in (*TIMINGS, *COUNTS, "published", "malformed_published", "dead_letters_by_kind"):
        assert key in result, key
    for key in ("git_commit", "input_digest", "model_digest", "repeats", "spread", "machine"):
        assert key in result, key
    assert (result["published"], result["repeats"], result["expected_runs"]) == (20, 1, 2)
    assert all(result["spread"][key]["n"] == 1 for key in TIMINGS if result[key] is not None)
    assert result["runs_started"] >= result["expected_runs"]
    assert result["lost"] == 0 and result["duplicates"] == 0
    # The three malformed messages (the watcher's) and the event naming a partition two days
    # ahead (the claim step's): it fails no run and none stalls.
    assert result["dead_lettered"] == 4 and result["runs_started"] >= 1
    assert result["unbuildable_events_dead_lettered"] == 1
    assert result["dead_letters_by_kind"]["unbuildable"] == 1
    assert result["partitions_published"] == result["expected_runs"] == 2
    assert result["runs_failed"] == 0 and result["stalled_runs"] == 0
    # A run claims only after the burst was quiet for the window; the work record follows.
    assert WINDOW_S <= result["latency_p50_s"] <= result["latency_p95_s"]
    assert result["work_latency_p50_s"] >= result["latency_p50_s"]
    # The JSON's figures: every key the docs table shows, each a finite number.
    from benchmarks.docs import FIGURES
    from benchmarks.provenance import non_finite

    assert set(FIGURES["events"]) <= set(result) and non_finite(result) == []
