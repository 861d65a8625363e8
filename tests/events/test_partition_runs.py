"""Every partition its own run: the claim step takes the events of one partition, queues a run
for the others, dead-letters events whose partition cannot be built, leaves a cron run on its
own date and retries what failed runs gave back, however old; the partitions an upstream
pipeline published (``Pipeline.after``) are dealt out the same way, and one this DAG built is
not built again. Through the watchers' in-memory stream, the SQLite ledger and the generated
DAG's own task functions (no Airflow server)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cascade.assets import (
    ASR_EVENT_SELECTORS,
    ASSET_CTR_CROSS_FEATURES,
    ASSET_PRERANKING_CHAMPION,
    TOPIC_DATA_LANDED,
)
from cascade.event_claims import (
    DEAD_LETTER_RETRIES,
    DEAD_LETTER_UNBUILDABLE,
    PENDING_XCOM_KEY,
    UPSTREAM_ID_PREFIX,
    CoalesceConfig,
    claim_run_events,
    upstream_events,
)
from cascade.event_ledger import DEAD_LETTERED, EventLedger
from cascade.events import Event, make_event, parse_event
from cascade.lake import lake_from_settings, nothing_landed
from cascade.partitions import resolve_partition
from tests.events.memory_stream import run_stream

TODAY = dt.datetime.now(dt.UTC).date()


def day(offset: int) -> str:
    return (TODAY + dt.timedelta(days=offset)).isoformat()


def speech(partition: str) -> Event:
    return make_event(TOPIC_DATA_LANDED, {"dataset": "speech", "partition": partition})


def land_speech(partition: str) -> Path:
    """A landed speech batch, as far as the first step's check looks (its transcripts)."""
    folder = lake_from_settings().landing("speech", partition)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "transcripts.jsonl").write_text(json.dumps({"id": partition}) + "\n")
    return folder


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setenv("CASCADE_COALESCE_WINDOW_S", "0")
    return tmp_path


def stored_through_the_watcher(events: list[Event]) -> list[tuple[dt.datetime, Any]]:
    """The asset events the watcher stores for ``events`` (the real shared-stream path)."""
    run = run_stream([e.model_dump_json().encode() for e in events], selectors=ASR_EVENT_SELECTORS)
    assert run.error is None and len(run.fired) == len(events)
    at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=30)
    return [(at, {"from_trigger": True, "payload": payload}) for payload in run.fired]


def claim_asr(
    ledger: EventLedger,
    run_id: str,
    visible: list[tuple[dt.datetime, Any]],
    config: CoalesceConfig | None = None,
    **options: Any,
) -> Any:
    """One claim of DAG ``asr``, the asset showing ``visible``, on the test's day (a suite that
    runs past midnight UTC keeps the same "today")."""
    options.setdefault("today", TODAY)
    return claim_run_events(
        dag_id="asr",
        run_id=run_id,
        triggering_extras=[],
        recent=lambda since: visible,
        ledger=ledger,
        config=config or CoalesceConfig(window_s=0),
        **options,
    )


class Inlet:
    def __init__(self, stored: list[tuple[dt.datetime, Any]]) -> None:
        self.stored = stored

    def after(self, _since: str) -> list[Any]:
        return [
            SimpleNamespace(id=i, timestamp=ts, extra=extra)
            for i, (ts, extra) in enumerate(self.stored)
        ]


class AnyKey(dict[Any, Any]):
    """Airflow's accessors are keyed by the asset object; these answer for any key."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value

    def __getitem__(self, _key: Any) -> Any:
        return self.value


class TaskInstance:
    def __init__(self) -> None:
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value

    def xcom_pull(self, task_ids: str, key: str) -> Any:
        assert task_ids == "resolve_partition"
        return self.xcom.get(key)


def dag_tasks(pipeline: str = "asr") -> tuple[Any, Any]:
    """The generated DAG's ``resolve_partition`` and ``next_partitions`` functions."""
    from cascade.dag_factory import build_dag
    from cascade.pipeline_registry import registered_pipelines

    dag = build_dag(registered_pipelines()[pipeline])
    return (
        dag.get_task("resolve_partition").python_callable,
        dag.get_task("next_partitions").python_callable,
    )


def run_context(
    run_id: str,
    stored: list[tuple[dt.datetime, Any]],
    *,
    run_type: str = "asset_triggered",
    logical_date: dt.datetime | None = None,
    dag_id: str = "asr",
) -> dict[str, Any]:
    return {
        "dag_run": SimpleNamespace(
            dag_id=dag_id,
            run_id=run_id,
            run_type=run_type,
            logical_date=logical_date,
            run_after=dt.datetime.now(dt.UTC),
        ),
        "params": {"ds": None},
        "triggering_asset_events": {},
        "inlet_events": AnyKey(Inlet(stored)),
        "outlet_events": AnyKey(SimpleNamespace(extra={})),
        "ti": TaskInstance(),
    }


def test_two_partitions_published_in_one_burst_start_two_runs_each_on_its_own_data(
    home: Path,
) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from cascade.event_ledger import ClaimLedger

    older, newer = day(-3), day(-2)
    land_speech(older)
    land_speech(newer)
    burst = [speech(newer), speech(older), speech(newer), speech(older), speech(older)]
    stored = stored_through_the_watcher(burst)
    resolve, next_partitions = dag_tasks()

    # The burst's run: the oldest partition's events only; the other waits for its own run,
    # which next_partitions queues by updating the DAG's own watched asset.
    first = run_context("asset_triggered__1", stored)
    assert resolve(**first) == older
    assert first["ti"].xcom[PENDING_XCOM_KEY] == [newer]
    assert next_partitions(**first) == [newer]
    assert first["outlet_events"]["asr"].extra == {"pending_partitions": [newer]}

    # The queued run: triggered by that asset update (no Cascade event in it), it claims the
    # other partition, and queues nothing more.
    second = run_context("asset_triggered__2", stored)
    second["triggering_asset_events"] = {
        "asr": [SimpleNamespace(extra={"pending_partitions": [newer]})]
    }
    assert resolve(**second) == newer
    assert second["ti"].xcom[PENDING_XCOM_KEY] == []
    with pytest.raises(AirflowSkipException, match="no other partition"):
        next_partitions(**second)

    owners = ClaimLedger.for_settings().owners("asr")
    by_run: dict[str, set[str]] = {}
    for event in burst:
        by_run.setdefault(owners[event.id], set()).add(event.payload["partition"])
    # Each run owns exactly the events of its own partition: nothing is recorded as done that
    # a run did not build.
    assert by_run == {"asset_triggered__1": {older}, "asset_triggered__2": {newer}}
    # A third run finds nothing left and skips.
    with pytest.raises(AirflowSkipException, match="nothing to do"):
        resolve(**run_context("asset_triggered__3", stored))


def test_an_event_for_a_partition_with_nothing_landed_is_dead_lettered_and_no_run_fails(
    home: Path,
) -> None:
    ledger = EventLedger(home / "ledger.sqlite")
    landed_day, empty_day = day(-2), day(-1)
    land_speech(landed_day)
    good, empty, tomorrow = speech(landed_day), speech(empty_day), speech(day(1))
    stored = stored_through_the_watcher([empty, tomorrow, good])
    sent: list[Event] = []

    def claim(run_id: str, sink: Any = sent.extend) -> Any:
        return claim_asr(
            ledger,
            run_id,
            stored,
            default_partition=day(0),
            unbuildable=nothing_landed("speech", "transcripts.jsonl", "wav"),
            dead_letter=sink,
        )

    def refuse(records: Any) -> None:
        raise ConnectionError("broker down")

    # A dead-letter topic that cannot be reached dead-letters nothing and fails nothing: the
    # run works on the buildable partition, the other events wait for the next claim.
    down = claim("r0", refuse)
    assert down.partition == landed_day and down.dead_lettered == {}
    ledger.release(dag_id="asr", run_id="r0")

    first = claim("r1")
    assert first.partition == landed_day and [e["id"] for e in first.new] == [good.id]
    assert first.pending == []  # nothing buildable is left: no run is queued for them
    assert "nothing landed for speech" in first.dead_lettered[empty.id]
    assert "in the future" in first.dead_lettered[tomorrow.id]
    records = [parse_event(r.model_dump_json()) for r in sent]
    assert {r.payload["kind"] for r in records} == {DEAD_LETTER_UNBUILDABLE}
    assert {json.loads(r.payload["raw"])["id"] for r in records} == {empty.id, tomorrow.id}
    assert ledger.owners("asr")[empty.id] == DEAD_LETTERED
    # Later runs neither claim them nor dead-letter them twice.
    later = claim("r2")
    assert not later.has_work and later.dead_lettered == {} and len(sent) == 2


def test_a_cron_run_works_on_its_own_date_and_leaves_other_partitions_waiting(
    home: Path,
) -> None:
    own, other = day(-1), day(-4)
    land_speech(own)
    land_speech(other)
    on_own, on_other = speech(own), speech(other)
    stored = stored_through_the_watcher([on_other, on_own])
    resolve, _ = dag_tasks()
    midnight = dt.datetime.combine(TODAY - dt.timedelta(days=1), dt.time(4), dt.UTC)
    cron = run_context("scheduled__1", stored, run_type="scheduled", logical_date=midnight)
    # Not the events' oldest (or newest) partition: its own date, and only that date's event.
    assert resolve(**cron) == own
    assert cron["ti"].xcom[PENDING_XCOM_KEY] == [other]
    from cascade.event_ledger import ClaimLedger

    assert ClaimLedger.for_settings().owners("asr") == {on_own.id: "scheduled__1"}
    # A cron run with nothing for its date still works on its date.
    empty = dt.datetime.combine(TODAY - dt.timedelta(days=7), dt.time(4), dt.UTC)
    quiet = run_context("scheduled__2", stored, run_type="scheduled", logical_date=empty)
    assert resolve(**quiet) == day(-7)


def test_a_released_claim_is_retried_after_24_hours_then_dead_lettered(home: Path) -> None:
    ledger = EventLedger(home / "ledger.sqlite")
    failing, fresh = speech(day(-5)), speech(day(-3))
    config = CoalesceConfig(window_s=0, max_releases=2)
    sent: list[Event] = []
    stored = stored_through_the_watcher([failing])

    def claim(run_id: str, visible: list[tuple[dt.datetime, Any]]) -> Any:
        return claim_asr(ledger, run_id, visible, config, dead_letter=sent.extend)

    first = claim("r1", stored)
    assert [e["id"] for e in first.new] == [failing.id]
    assert ledger.release(dag_id="asr", run_id="r1") == 1
    # A day later the asset's events are past the lookback: the ledger still has the event.
    retry = claim("r2", [])
    assert [e["id"] for e in retry.new] == [failing.id] and retry.partition == day(-5)
    assert ledger.released("asr") == {}  # claimed again: nothing waits
    ledger.release(dag_id="asr", run_id="r2")
    assert ledger.released("asr")[failing.id].releases == 2
    # New data goes first; the twice-failed event is dead-lettered, never retried a third time.
    later = claim("r3", stored_through_the_watcher([fresh]))
    assert later.partition == day(-3) and [e["id"] for e in later.new] == [fresh.id]
    assert "2 runs failed on partition" in later.dead_lettered[failing.id]
    assert "r2" in later.dead_lettered[failing.id]
    assert [r.payload["kind"] for r in sent] == [DEAD_LETTER_RETRIES]
    assert resolve_partition(later.events, None, None) == day(-3)


def test_a_retried_task_keeps_its_runs_partition(home: Path) -> None:
    ledger = EventLedger(home / "ledger.sqlite")
    a, b = speech(day(-6)), speech(day(-5))
    stored = stored_through_the_watcher([a, b])

    first = claim_asr(ledger, "r1", stored)
    # The task's second try: the same partition, not the next one.
    again = claim_asr(ledger, "r1", stored)
    assert first.partition == again.partition == day(-6)
    assert [e["id"] for e in again.reclaimed] == [a.id] and again.new == []
    assert again.pending == [day(-5)]


def test_an_event_naming_a_batch_elsewhere_is_claimed_and_a_missing_one_dead_lettered(
    home: Path,
) -> None:
    """The first step lands a batch an event names by ``path``: the claim does not dead-letter
    its partition for an empty landing folder, only when the named batch does not exist."""
    ledger = EventLedger(home / "ledger.sqlite")
    batch = home / "producer" / "batch"
    batch.mkdir(parents=True)
    elsewhere = make_event(
        TOPIC_DATA_LANDED,
        {"dataset": "speech", "partition": day(-2), "path": str(batch), "format": "jsonl"},
    )
    gone = make_event(
        TOPIC_DATA_LANDED,
        {"dataset": "speech", "partition": day(-1), "path": str(home / "nowhere")},
    )
    sent: list[Event] = []
    claim = claim_asr(
        ledger,
        "r1",
        stored_through_the_watcher([elsewhere, gone]),
        default_partition=day(0),
        unbuildable=nothing_landed("speech", "transcripts.jsonl", "wav"),
        dead_letter=sent.extend,
    )
    assert claim.partition == day(-2) and [e["id"] for e in claim.new] == [elsewhere.id]
    assert "does not exist" in claim.dead_lettered[gone.id] and len(sent) == 1


UPSTREAM = {"ctr_preranking": ASSET_CTR_CROSS_FEATURES, "ctr_monitor": ASSET_PRERANKING_CHAMPION}
"""Each pipeline chained by data, and the asset of the upstream pipeline that starts it."""


def published(uri: str, ds: str, minute: int = 0) -> SimpleNamespace:
    """An upstream step's asset event as a run it triggered sees it: the extra names its
    partition (what the producing step task sets)."""
    return SimpleNamespace(
        asset=SimpleNamespace(uri=uri),
        extra={"ds": ds, "pipeline": "upstream", "step": "publish"},
        timestamp=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=60 - minute),
    )


def run_queue_uri(pipeline: str) -> str:
    """The asset the DAG's ``next_partitions`` task updates; the DAG is scheduled on it."""
    from cascade.dag_factory import build_dag
    from cascade.pipeline_registry import registered_pipelines

    dag = build_dag(registered_pipelines()[pipeline])
    (queue,) = dag.get_task("next_partitions").outlets
    assert queue.uri in str(dag.timetable.asset_condition)
    assert [a.uri for a in dag.get_task("resolve_partition").inlets] == [queue.uri]
    return str(queue.uri)


@pytest.mark.parametrize("pipeline", sorted(UPSTREAM))
def test_two_upstream_partitions_in_one_runs_asset_events_start_two_runs_each_on_its_own(
    home: Path, pipeline: str
) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from cascade.event_ledger import ClaimLedger

    uri, older, newer = UPSTREAM[pipeline], day(-3), day(-2)
    queue = run_queue_uri(pipeline)
    if pipeline == "ctr_monitor":  # no Kafka trigger: an asset of its own queues its runs
        assert queue == f"cascade://pipelines/{pipeline}/next-run"
    resolve, next_partitions = dag_tasks(pipeline)

    # The upstream published two partitions (the newer, a backfill of the older, the newer
    # again) before this pipeline started: Airflow folds them into one run's asset events.
    first = run_context("asset_triggered__1", [], dag_id=pipeline)
    first["triggering_asset_events"] = {
        uri: [published(uri, newer, 1), published(uri, older, 2), published(uri, newer, 3)]
    }
    assert resolve(**first) == older  # not the newest: the oldest waiting
    assert first["ti"].xcom[PENDING_XCOM_KEY] == [newer]
    assert next_partitions(**first) == [newer]
    assert first["outlet_events"][queue].extra == {"pending_partitions": [newer]}

    # The run that update queued: no upstream event among its own, the ledger kept the other.
    second = run_context("asset_triggered__2", [], dag_id=pipeline)
    second["triggering_asset_events"] = {
        queue: [
            SimpleNamespace(
                asset=SimpleNamespace(uri=queue), extra=first["outlet_events"][queue].extra
            )
        ]
    }
    assert resolve(**second) == newer
    assert second["ti"].xcom[PENDING_XCOM_KEY] == []
    with pytest.raises(AirflowSkipException, match="no other partition"):
        next_partitions(**second)
    assert ClaimLedger.for_settings().owners(pipeline) == {
        UPSTREAM_ID_PREFIX + older: "asset_triggered__1",
        UPSTREAM_ID_PREFIX + newer: "asset_triggered__2",
    }


def test_a_repeated_upstream_partition_is_built_by_one_run(home: Path) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    uri, ds = ASSET_PRERANKING_CHAMPION, day(-2)
    resolve, next_partitions = dag_tasks("ctr_monitor")
    first = run_context("asset_triggered__1", [], dag_id="ctr_monitor")
    first["triggering_asset_events"] = {uri: [published(uri, ds, 1), published(uri, ds, 2)]}
    assert resolve(**first) == ds
    with pytest.raises(AirflowSkipException, match="no other partition"):
        next_partitions(**first)
    # The upstream publishes the partition again (its rerun): this DAG built it, no run builds
    # it twice.
    again = run_context("asset_triggered__2", [], dag_id="ctr_monitor")
    again["triggering_asset_events"] = {uri: [published(uri, ds, 30)]}
    with pytest.raises(AirflowSkipException, match=r"1 triggering event\(s\) already claimed"):
        resolve(**again)
    # A backfill from the form still rebuilds it: a person asked.
    form = run_context("manual__3", [], run_type="manual", dag_id="ctr_monitor")
    form["params"] = {"ds": ds}
    assert resolve(**form) == ds


def test_an_upstream_partition_a_run_failed_on_is_retried_and_published_again_revived(
    home: Path,
) -> None:
    ledger = EventLedger(home / "ledger.sqlite")
    uri, ds = ASSET_CTR_CROSS_FEATURES, day(-4)
    config = CoalesceConfig(window_s=0, max_releases=2)
    sent: list[Event] = []
    upstream = upstream_events([published(uri, ds), published("file://other", day(-5))], (uri,))
    assert [e["id"] for e in upstream] == [UPSTREAM_ID_PREFIX + ds]
    payload = upstream[0]["payload"]
    assert (payload["dataset"], payload["partition"], payload["path"]) == (uri, ds, None)

    def claim(run_id: str, *events: dict[str, Any]) -> Any:
        return claim_run_events(
            dag_id="ctr_preranking",
            run_id=run_id,
            triggering_extras=[],
            recent=None,
            ledger=ledger,
            config=config,
            upstream=events,
            dead_letter=sent.extend,
        )

    assert claim("r1", *upstream).partition == ds
    ledger.release(dag_id="ctr_preranking", run_id="r1")  # the run failed
    # No asset event names it any more: the ledger still does, and a later run retries it.
    retry = claim("r2")
    assert retry.partition == ds and [e["id"] for e in retry.new] == [UPSTREAM_ID_PREFIX + ds]
    ledger.release(dag_id="ctr_preranking", run_id="r2")
    dead = claim("r3")
    assert "2 runs failed on partition" in dead.dead_lettered[UPSTREAM_ID_PREFIX + ds]
    assert not dead.has_work and len(sent) == 1
    # The cause fixed, the upstream publishes the partition again: it waits with a fresh count.
    revived = claim("r4", *upstream)
    assert revived.partition == ds and [e["id"] for e in revived.new] == [UPSTREAM_ID_PREFIX + ds]
    assert not claim("r5", *upstream).has_work  # built by r4: taken, not built again
    assert ledger.owners("ctr_preranking") == {UPSTREAM_ID_PREFIX + ds: "r4"}
