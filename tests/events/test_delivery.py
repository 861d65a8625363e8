"""Schemas, dead-lettering, the watcher's routing and the claim ledger, without a broker."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from cascade import event_trigger
from cascade.assets import (
    CROSS_EVENT_SELECTORS,
    CTR_EVENT_SELECTORS,
    PROBE_EVENT_SELECTORS,
    TOPIC_DATA_LANDED,
    TOPIC_DEAD_LETTER,
    TOPIC_DRIFT_DETECTED,
    TOPIC_MODEL_DEPLOYED,
    TOPIC_RETRAIN_REQUESTED,
    TOPICS,
)
from cascade.event_claims import (
    CoalesceConfig,
    claim_run_events,
    event_from_extra,
    wait_until_quiet,
)
from cascade.event_ledger import EventLedger
from cascade.event_trigger import parse_selector, route_message
from cascade.events import (
    SCHEMAS,
    InvalidEvent,
    dead_letter_event,
    json_schemas,
    make_event,
    parse_event,
)
from tests.events.memory_stream import MemoryDeadLetters, run_stream


def landed(dataset: str = "impressions", partition: str = "2026-11-22") -> dict[str, Any]:
    event = make_event(TOPIC_DATA_LANDED, {"dataset": dataset, "partition": partition})
    return json.loads(event.model_dump_json())


def test_every_topic_has_a_versioned_schema_and_a_json_schema() -> None:
    assert {t for t, _ in SCHEMAS} == set(TOPICS)
    schemas = json_schemas()
    assert "envelope" in schemas and f"{TOPIC_DRIFT_DETECTED}/v1" in schemas
    assert "max_psi" in schemas[f"{TOPIC_DRIFT_DETECTED}/v1"]["properties"]


@pytest.mark.parametrize(
    "event_type, payload",
    [
        (TOPIC_RETRAIN_REQUESTED, {"model": "preranking", "reason": "drift"}),
        (
            TOPIC_DRIFT_DETECTED,
            {
                "model": "preranking",
                "partition": "2026-11-22",
                "max_psi": 0.4,
                "psi_threshold": 0.2,
            },
        ),
        (TOPIC_MODEL_DEPLOYED, {"model": "preranking", "alias": "champion", "version": "3"}),
    ],
)
def test_each_event_type_round_trips(event_type: str, payload: dict[str, Any]) -> None:
    event = make_event(event_type, payload)
    assert parse_event(event.model_dump_json()).payload == event.payload


def test_unsupported_schema_version_names_the_supported_ones() -> None:
    raw = json.dumps({**landed(), "schema_version": 7})
    with pytest.raises(
        InvalidEvent, match=r"no schema_version 7 \(this consumer reads \[1\]\)"
    ) as e:
        parse_event(raw)
    assert e.value.kind == "unsupported-version"


def test_drift_payload_is_validated() -> None:
    with pytest.raises(InvalidEvent, match="bad cascade.drift.detected payload"):
        make_event(TOPIC_DRIFT_DETECTED, {"model": "m", "partition": "2026-11-22", "max_psi": -1})


def test_selectors_route_events_to_the_right_watcher() -> None:
    log = json.dumps(landed("impressions"))
    probe = json.dumps(landed("probe"))
    retrain = make_event(TOPIC_RETRAIN_REQUESTED, {"model": "preranking", "reason": "x"})
    assert route_message(log, CROSS_EVENT_SELECTORS).action == "fire"
    # New data reaches the pre-ranker through ctr_cross; a retrain request directly.
    assert route_message(log, CTR_EVENT_SELECTORS).action == "skip"
    assert route_message(probe, CROSS_EVENT_SELECTORS).action == "skip"
    assert route_message(probe, PROBE_EVENT_SELECTORS).action == "fire"
    assert route_message(retrain.model_dump_json(), CTR_EVENT_SELECTORS).action == "fire"
    assert route_message(retrain.model_dump_json(), CROSS_EVENT_SELECTORS).action == "skip"
    assert route_message(retrain.model_dump_json(), PROBE_EVENT_SELECTORS).action == "skip"
    bad = route_message(b"\xff garbage", CROSS_EVENT_SELECTORS)
    assert bad.action == "dead-letter" and bad.error is not None and bad.error.kind == "not-json"
    with pytest.raises(ValueError, match="unknown event type"):
        parse_selector("cascade.nope:dataset=x")
    with pytest.raises(ValueError, match="TYPE:payload_field=value"):
        parse_selector(f"{TOPIC_DATA_LANDED}:dataset")


def test_dead_letter_keeps_reason_kind_and_a_stable_id() -> None:
    raw = b'{"type": "cascade.nope"}'
    error = route_message(raw, CROSS_EVENT_SELECTORS).error
    assert error is not None
    first = dead_letter_event(raw, error, consumer="w")
    again = dead_letter_event(raw, error, consumer="w")
    other = dead_letter_event(raw + b" ", error, consumer="w")
    assert first.type == TOPIC_DEAD_LETTER and first.id == again.id != other.id
    assert first.payload["kind"] == "unknown-type"
    assert "unknown event type 'cascade.nope'" in first.payload["reason"]
    assert parse_event(first.model_dump_json()).payload["raw"] == raw.decode()


def test_watcher_fires_selected_events_and_dead_letters_the_rest_without_raising(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cascade.event_trigger import CascadeEventTrigger

    good = landed()
    values = [
        json.dumps(good).encode(),
        b"{not json",
        json.dumps(landed("probe")).encode(),
        b'{"type": "cascade.nope"}',
        json.dumps({**landed(), "payload": {"dataset": "x"}}).encode(),
    ]
    run = run_stream(values, selectors=CROSS_EVENT_SELECTORS)
    assert run.error is None
    assert [e["id"] for e in run.fired] == [good["id"]]
    kinds = ["not-json", "unknown-type", "bad-payload"]
    assert [r["payload"]["kind"] for r in run.dead_letters] == kinds
    assert all(r["type"] == TOPIC_DEAD_LETTER and r["payload"]["reason"] for r in run.dead_letters)
    assert run.rejected == run.counted == {"not-json": 1, "unknown-type": 1, "bad-payload": 1}
    # Every message, the dead-lettered ones included, is committed past.
    assert run.commits[-1] >= len(values) and run.seeks == []
    trigger = CascadeEventTrigger(
        topics=[TOPIC_DATA_LANDED], selectors=CROSS_EVENT_SELECTORS, dead_letter=True, name="ctr"
    )
    classpath, kwargs = trigger.serialize()
    assert (
        classpath == "cascade.event_trigger.CascadeEventTrigger" and kwargs["dead_letter"] is True
    )


def test_a_dead_letter_publish_is_retried_before_the_offset_is_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(event_trigger, "DEAD_LETTER_BACKOFF_S", 0.01)
    dlq = MemoryDeadLetters(fail_flushes=2)
    run = run_stream([b"x"], dead_letters=dlq)
    assert run.error is None
    assert run.extra["flushes"] == 3
    assert [r["payload"]["kind"] for r in run.dead_letters] == ["not-json"]
    assert run.counted == {"not-json": 1} and run.commits[-1] >= 1


def test_a_dead_letter_that_cannot_be_published_is_neither_counted_nor_committed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(event_trigger, "DEAD_LETTER_BACKOFF_S", 0.01)
    dlq = MemoryDeadLetters(fail_flushes=10**6)
    good = landed()
    with caplog.at_level(logging.ERROR, logger="cascade.event_trigger"):
        run = run_stream([json.dumps(good).encode(), b"x", b"y"], dead_letters=dlq)
    # The shared stream ends (Airflow restarts its watchers) and the broker redelivers from
    # the last commit: the good event before the bad one is committed, the bad ones are not.
    assert isinstance(run.error, event_trigger.DeadLetterPublishError)
    assert run.extra["flushes"] == event_trigger.DEAD_LETTER_ATTEMPTS
    assert run.dead_letters == [] and run.counted == {}
    assert all(offset <= 1 for offset in run.commits)
    assert "DEAD LETTERS NOT PUBLISHED" in caplog.text


def test_publish_dead_letters_backs_off_and_raises_after_the_last_try() -> None:
    record = dead_letter_event(b"x", InvalidEvent("not JSON", kind="not-json"), consumer="w")
    pauses: list[float] = []
    dlq = MemoryDeadLetters(fail_flushes=10**6)
    with pytest.raises(event_trigger.DeadLetterPublishError, match="after 4 tries"):
        event_trigger.publish_dead_letters(lambda: dlq, [record], attempts=4, sleep=pauses.append)
    assert pauses == [1.0, 2.0, 4.0] and dlq.sent == []

    def timing_out() -> Any:
        class Stuck(MemoryDeadLetters):
            def flush(self, timeout: float | None = None) -> int:
                return 1

        return Stuck()

    with pytest.raises(event_trigger.DeadLetterPublishError, match="not acknowledged"):
        event_trigger.publish_dead_letters(timing_out, [record], attempts=2, sleep=pauses.append)


def test_only_the_owning_watcher_dead_letters() -> None:
    run = run_stream([b"{bad"], selectors=PROBE_EVENT_SELECTORS, dead_letter=False)
    assert run.fired == [] and run.dead_letters == [] and run.rejected == {}
    # Skipped, not rejected: the other watcher's reject is what dead-letters it.
    assert run.commits[-1] >= 1


def test_ledger_claims_each_event_once_and_lets_a_retry_reclaim(tmp_path: Path) -> None:
    ledger = EventLedger(tmp_path / "ledger.sqlite")
    a, b, c = landed(), landed(), landed()
    first = ledger.claim(dag_id="d", run_id="r1", events=[a, b, a])
    assert [e["id"] for e in first.new] == [a["id"], b["id"]]
    retry = ledger.claim(dag_id="d", run_id="r1", events=[a, b])
    assert retry.new == [] and len(retry.reclaimed) == 2 and retry.has_work
    redelivered = ledger.claim(dag_id="d", run_id="r2", events=[b, c])
    assert [e["id"] for e in redelivered.new] == [c["id"]]
    assert redelivered.taken == {b["id"]: "r1"}
    only_dupes = ledger.claim(dag_id="d", run_id="r3", events=[a])
    assert not only_dupes.has_work
    # Another DAG consuming the same event does its own work.
    assert ledger.claim(dag_id="other", run_id="x", events=[a]).has_work
    assert ledger.owners("d") == {a["id"]: "r1", b["id"]: "r1", c["id"]: "r2"}
    assert set(ledger.claimed_at("d")) == {a["id"], b["id"], c["id"]}
    # r1 failed: its events go back, and the next run claims them.
    assert ledger.release(dag_id="d", run_id="r1") == 2
    assert {e["id"] for e in ledger.claim(dag_id="d", run_id="r4", events=[a, b, c]).new} == {
        a["id"],
        b["id"],
    }


def test_concurrent_claims_never_share_an_event(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    events = [landed() for _ in range(200)]
    results: dict[str, list[str]] = {}

    def worker(run_id: str) -> None:
        claim = EventLedger(path).claim(dag_id="d", run_id=run_id, events=events)
        results[run_id] = [e["id"] for e in claim.new]

    threads = [threading.Thread(target=worker, args=(f"r{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [i for ids in results.values() for i in ids]
    assert sorted(claimed) == sorted(e["id"] for e in events)


class FakeClock:
    def __init__(self) -> None:
        self.now = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += dt.timedelta(seconds=seconds)


def test_wait_until_quiet_waits_out_a_burst_then_returns_everything() -> None:
    clock = FakeClock()
    start = clock.now
    arrivals = [start + dt.timedelta(seconds=s) for s in (0, 1, 2, 3, 4, 9)]

    def recent(since: dt.datetime) -> list[tuple[dt.datetime, Any]]:
        return [(t, {"n": i}) for i, t in enumerate(arrivals) if since <= t <= clock.now]

    seen = wait_until_quiet(
        recent, CoalesceConfig(window_s=3, poll_s=0.5), clock=clock, sleep=clock.sleep
    )
    # Quiet from 4 s to 7 s: returns before the straggler at 9 s.
    assert len(seen) == 5 and (clock.now - start).total_seconds() == pytest.approx(7)
    clock.now = start
    capped = wait_until_quiet(
        recent, CoalesceConfig(window_s=30, max_wait_s=5, poll_s=1), clock=clock, sleep=clock.sleep
    )
    assert (clock.now - start).total_seconds() == pytest.approx(5) and len(capped) == 5


def test_wait_until_quiet_is_not_fooled_by_events_that_appear_late() -> None:
    clock = FakeClock()
    start = clock.now
    # (stamped at, visible from): the last two commit seconds after their timestamps, as
    # under a loaded triggerer. Timestamps alone would call it quiet at 5.5 s with 4 events.
    arrivals = [(0, 0), (1, 1), (2, 2), (2.5, 4.9), (3.0, 5.6)]

    def recent(since: dt.datetime) -> list[tuple[dt.datetime, Any]]:
        return [
            (start + dt.timedelta(seconds=stamp), {})
            for stamp, visible in arrivals
            if clock.now >= start + dt.timedelta(seconds=visible)
        ]

    seen = wait_until_quiet(
        recent, CoalesceConfig(window_s=3, poll_s=0.5), clock=clock, sleep=clock.sleep
    )
    assert len(seen) == 5 and (clock.now - start).total_seconds() == pytest.approx(9)


def test_a_burst_coalesces_into_the_first_run_and_later_runs_find_nothing(tmp_path: Path) -> None:
    ledger = EventLedger(tmp_path / "ledger.sqlite")
    burst = [landed() for _ in range(50)]
    now = dt.datetime.now(dt.UTC)
    stored = [(now - dt.timedelta(seconds=60), {"from_trigger": True, "payload": e}) for e in burst]
    config = CoalesceConfig(window_s=1)

    def claim(run_id: str, triggering: list[dict[str, Any]]) -> Any:
        return claim_run_events(
            dag_id="d",
            run_id=run_id,
            triggering_extras=[{"from_trigger": True, "payload": e} for e in triggering],
            recent=lambda since: stored,
            ledger=ledger,
            config=config,
        )

    # Airflow attached the first 3 events to run 1 and queued the rest for runs 2 and 3.
    first = claim("r1", burst[:3])
    assert len(first.new) == 50
    assert not claim("r2", burst[3:40]).has_work
    assert not claim("r3", burst[40:]).has_work


def test_event_from_extra_reads_trigger_extras_and_ignores_foreign_ones() -> None:
    event = landed()
    assert event_from_extra({"from_trigger": True, "payload": event}) == event
    assert event_from_extra({"from_trigger": True, "payload": json.dumps(event)}) == event
    assert event_from_extra(event) == event
    assert event_from_extra({"note": "manual asset event"}) is None
    assert event_from_extra(None) is None


def test_coalesce_config_validates() -> None:
    with pytest.raises(ValueError, match="CASCADE_COALESCE_WINDOW_S"):
        CoalesceConfig(window_s=-1)
