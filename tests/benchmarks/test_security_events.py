"""The security benchmark's broker path, counted from a real ledger (SQLite) without a stack:
which valid partitions got a run, which runs failed, what was dead-lettered."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.event_delivery import PROBE_DAG, probe_events
from benchmarks.security_events import (
    dead_letter_growth,
    generated_messages,
    ledger_accounting,
)
from cascade.event_ledger import EventLedger


def _claim_and_work(ledger: EventLedger, run_id: str, events: list) -> None:
    rows = [json.loads(event.model_dump_json()) for event in events]
    ledger.claim(dag_id=PROBE_DAG, run_id=run_id, events=rows)
    ledger.record_work(PROBE_DAG, run_id, [event.id for event in events])


def test_every_partition_built_and_no_run_failed(tmp_path: Path) -> None:
    ledger = EventLedger(tmp_path / "ledger.sqlite")
    valid = probe_events(6, partitions=3)
    by_day: dict[str, list] = {}
    for event in valid:
        by_day.setdefault(event.payload["partition"], []).append(event)
    runs = {}
    for index, (_day, events) in enumerate(sorted(by_day.items())):
        runs[f"run-{index}"] = "success"
        _claim_and_work(ledger, f"run-{index}", events)
    counts = ledger_accounting(ledger, PROBE_DAG, valid, runs)
    assert counts["valid_partitions"] == 3
    assert counts["partitions_never_built"] == 0
    assert counts["valid_events_without_work"] == 0
    assert counts["runs_for_valid_events"] == 3
    assert counts["runs_failed_by_valid_events"] == 0
    assert counts["runs_not_ended"] == 0


def test_a_partition_without_work_and_a_failed_run_are_counted(tmp_path: Path) -> None:
    ledger = EventLedger(tmp_path / "ledger.sqlite")
    valid = probe_events(4, partitions=2)
    newest = [e for e in valid if e.payload["partition"] == valid[0].payload["partition"]]
    older = [e for e in valid if e not in newest]
    _claim_and_work(ledger, "run-built", newest)
    # The older partition's run claimed its events, then failed before its work record.
    ledger.claim(
        dag_id=PROBE_DAG,
        run_id="run-failed",
        events=[json.loads(e.model_dump_json()) for e in older],
    )
    states = {"run-built": "success", "run-failed": "failed", "run-late": "running"}
    counts = ledger_accounting(ledger, PROBE_DAG, valid, states)
    assert counts["partitions_never_built"] == 1
    assert counts["partitions_not_built"] == [older[0].payload["partition"]]
    assert counts["valid_events_without_work"] == len(older)
    assert counts["runs_failed_by_valid_events"] == 1
    assert counts["runs_failed"] == ["run-failed"]


def test_dead_letter_growth_is_what_was_added() -> None:
    before = {"by_kind": {"not-json": 2, "unbuildable": 1}}
    after = {"by_kind": {"not-json": 5, "unbuildable": 1, "bad-payload": 4}}
    assert dead_letter_growth(before, after) == {"not-json": 3, "bad-payload": 4}


def test_generated_messages_are_bytes_a_producer_can_send() -> None:
    messages = generated_messages(40)
    assert len(messages) == 40 and all(isinstance(m, bytes) for m in messages)
    envelopes = []
    for message in messages:
        try:
            envelopes.append(json.loads(message))
        except ValueError:
            continue
    assert any(isinstance(e, dict) and "payload" in e for e in envelopes)
