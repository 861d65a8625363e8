"""Event delivery, measured against a real private stack (broker + Airflow) on free ports.

    cascade bench events --events 1000 --out bench-results/events.json [--repeats 3]
    cascade bench events --partitions 3 --out bench-results/events.json
    cascade bench events --quick --out /tmp/events.json      # 20 events, one burst

Publishes ``--events`` probe events (``cascade.data.landed``, dataset ``probe``) in one burst,
dealt over ``--partitions`` days (default 1), plus a few malformed messages and one event naming
a partition two days ahead, which cannot be built; waits until DAG ``event_probe`` has recorded
work for every id, and writes: published, partitions_published, runs_started (one run per
partition: equal to partitions_published), expected_runs, runs_failed and stalled_runs (both 0
when every run ended well), lost, duplicates, dead_lettered, unbuildable_events_dead_lettered
(the claim step's dead letter for the event ahead), latency_p50_s / latency_p95_s (publish -> a
run claimed the event) and events_per_s.
One probe event goes through first, untimed (``warm_up_s``): on a fresh stack the first event
also waits for the watcher to start. Then ``--repeats`` bursts (default 3, 1 with ``--quick``)
go through the one stack, each after the previous one was accounted for and had settled. Each
timing is the median over the bursts (each burst's in ``*_runs``, every burst's own figures in
``bursts``); the counts are summed over them. ``expected_runs`` is what the bursts ask for:
one run per distinct run key, the (dataset, partition) its events name, each event id counted
once. Then one more burst with the Kafka broker SIGKILLed in its middle and restarted
(:func:`broker_kill_burst`): ``broker`` names the broker and its version, ``broker_kills``
counts the kills, ``kill_bursts`` holds each such burst's figures, and ``lost`` /
``duplicates`` (and the run counts) are summed over the kill bursts too. The fault tests
(``pytest -m faults``) use the same helpers.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cascade.assets import TOPIC_DATA_LANDED
from cascade.broker import publish_many, publish_raw
from cascade.config import Settings, load_settings
from cascade.event_claims import DEAD_LETTER_UNBUILDABLE
from cascade.event_ledger import ClaimLedger, work_recorded_at, work_records
from cascade.events import PARTITION_FUTURE_DAYS, Event, make_event
from infra.stack import private_stack

PROBE_DAG = "event_probe"


def wait_for_probe_dag(settings: Settings, timeout_s: float = 240) -> None:
    from cascade.airflow_client import AirflowClient

    client = AirflowClient(settings)
    client.wait_for_dag(PROBE_DAG, timeout_s=timeout_s)
    client.patch(f"/dags/{PROBE_DAG}", {"is_paused": False})


def warm_up(settings: Settings, *, timeout_s: float = 600) -> float:
    """One probe event through the whole path, and its run finished, before anything is timed:
    on a fresh stack the first event also waits for the triggerer to start the watcher, which
    is start-up, not delivery. Returns the seconds it took."""
    from cascade.airflow_client import AirflowClient

    started = time.monotonic()
    event = probe_events(1)
    publish_many(event, settings=settings, timeout_s=60)
    result = account([event[0].id], settings, timeout_s=timeout_s)
    if result["lost"]:
        raise TimeoutError(
            f"the warm-up event had no work record after {timeout_s:.0f} s: DAG {PROBE_DAG}"
            " is not consuming its events (see the stack's airflow log)"
        )
    AirflowClient(settings).wait_for_run(
        PROBE_DAG,
        match=lambda run: run["dag_run_id"] in result["runs"],
        timeout_s=timeout_s,
        echo=lambda _line: None,
    )
    return time.monotonic() - started


PROBE_LAST_PARTITION = dt.date(2026, 11, 22)
"""The newest partition the probe bursts name; more partitions go back a day each."""


def probe_partitions(partitions: int) -> list[str]:
    """The ``partitions`` days a burst's events name, newest first."""
    if partitions < 1:
        raise ValueError(f"a burst names at least one partition, not {partitions}")
    return [(PROBE_LAST_PARTITION - dt.timedelta(days=i)).isoformat() for i in range(partitions)]


def probe_events(n: int, *, partitions: int = 1) -> list[Event]:
    """``n`` probe events, dealt over ``partitions`` days in turn (every run builds one). They
    name no ``path``: an event naming a batch elsewhere is dead-lettered at claim time unless
    the batch is there (the first step would land it), and a probe has nothing to land."""
    days = probe_partitions(partitions)
    return [
        make_event(
            TOPIC_DATA_LANDED,
            {"dataset": "probe", "partition": days[i % len(days)]},
            source="cascade-bench",
        )
        for i in range(n)
    ]


def unbuildable_probe_event() -> Event:
    """A valid probe event whose partition cannot be built: two days ahead (UTC), still inside
    what the watcher accepts, so the claim step (not the watcher) must dead-letter it."""
    ahead = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=PARTITION_FUTURE_DAYS)
    return make_event(
        TOPIC_DATA_LANDED,
        {"dataset": "probe", "partition": ahead.isoformat()},
        source="cascade-bench",
    )


def settle_runs(
    settings: Settings, since: dt.datetime, *, timeout_s: float = 300
) -> dict[str, int]:
    """Wait until every probe run queued since ``since`` has ended (or ``timeout_s``), then
    count them: ``runs_failed`` (failed runs) and ``stalled_runs`` (still queued or running)."""
    from cascade.airflow_client import AirflowClient

    client = AirflowClient(settings)
    deadline = time.monotonic() + timeout_s
    while True:
        runs = client.get(
            f"/dags/{PROBE_DAG}/dagRuns", run_after_gte=since.isoformat(), limit=1000
        )["dag_runs"]
        open_runs = [run for run in runs if run["state"] in ("queued", "running")]
        if not open_runs or time.monotonic() >= deadline:
            break
        time.sleep(2)
    return {
        "runs_failed": sum(run["state"] == "failed" for run in runs),
        "stalled_runs": len(open_runs),
    }


def expected_run_count(events: Sequence[Event]) -> int:
    """Runs a burst asks for: one per distinct run key (dataset, partition) its events name,
    each event id once (a redelivered copy is the same event)."""
    unique = {event.id: event for event in events}
    return len({(e.payload.get("dataset"), e.payload.get("partition")) for e in unique.values()})


def publish_malformed(settings: Settings, count: int) -> None:
    """Messages the watcher must dead-letter: not JSON, unknown type, bad payload."""

    def body(i: int) -> bytes:
        # A unique id in each, so every one is a distinct dead letter (fingerprint).
        nonce = uuid.uuid4().hex
        kinds = [
            f"{{not json {nonce}",
            json.dumps({"type": "cascade.nope", "id": nonce}),
            json.dumps({"type": TOPIC_DATA_LANDED, "id": nonce}),
        ]
        return kinds[i % len(kinds)].encode()

    publish_raw([(TOPIC_DATA_LANDED, None, body(i)) for i in range(count)], settings=settings)


def account(
    ids: Sequence[str], settings: Settings, *, timeout_s: float, settle_s: float = 0.0
) -> dict[str, Any]:
    """Wait until every id has a work record (or the timeout), then count. ``settle_s`` keeps
    watching after that, so late duplicate runs would be seen."""
    wanted = set(ids)
    deadline = time.monotonic() + timeout_s
    records: dict[str, list[str]] = {}
    accounted_at = None
    while time.monotonic() < deadline:
        records = work_records(PROBE_DAG, settings=settings)
        done = {i for ids_ in records.values() for i in ids_}
        if wanted <= done:
            accounted_at = time.monotonic()
            break
        time.sleep(1)
    if settle_s:
        time.sleep(settle_s)
        records = work_records(PROBE_DAG, settings=settings)
    counts: dict[str, int] = {}
    for event_ids in records.values():
        for event_id in event_ids:
            counts[event_id] = counts.get(event_id, 0) + 1
    runs_with_work = [run for run, event_ids in records.items() if wanted & set(event_ids)]
    return {
        "published": len(wanted),
        "lost": sorted(wanted - set(counts)),
        "duplicates": sorted(i for i in wanted if counts.get(i, 0) > 1),
        "runs_started": len(runs_with_work),
        "runs": runs_with_work,
        "records": records,
        "accounted_at": accounted_at,
        "recorded_at": work_recorded_at(PROBE_DAG, settings=settings),
    }


def run_start_times(settings: Settings, run_ids: Sequence[str]) -> dict[str, dt.datetime]:
    from cascade.airflow_client import AirflowClient

    client = AirflowClient(settings)
    out = {}
    for run_id in run_ids:
        run = client.get(f"/dags/{PROBE_DAG}/dagRuns/{run_id}")
        out[run_id] = dt.datetime.fromisoformat(run["start_date"])
    return out


def _quantile(values: Sequence[float], q: float) -> float | None:
    return (
        round(float(statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]), 3)
        if len(values) >= 2
        else (round(values[0], 3) if values else None)
    )


def measure_events(
    settings: Settings,
    *,
    events: int,
    malformed: int,
    window_s: float,
    settle_s: float | None = None,
    partitions: int = 1,
) -> dict[str, Any]:
    """Publish a burst into a running stack (DAG ``event_probe`` unpaused) and account for it.
    ``window_s`` is the stack's CASCADE_COALESCE_WINDOW_S; after every id is accounted for,
    the count is repeated ``settle_s`` later (default two windows) to catch late duplicates.
    The burst's events name ``partitions`` days (each built by its own run), and one more
    event names a partition that cannot be built (the claim step dead-letters it)."""
    from cascade.broker import dead_letter_summary

    dead_before = dead_letter_summary(settings)
    batch = probe_events(events, partitions=partitions)
    queued_since = dt.datetime.now(dt.UTC)
    started = time.monotonic()
    publish_malformed(settings, malformed)
    publish_many([*batch, unbuildable_probe_event()], settings=settings, timeout_s=60)
    published_at = {e.id: e.time for e in batch}
    published_s = time.monotonic() - started
    settle_s = window_s * 2 if settle_s is None else settle_s
    result = account(list(published_at), settings, timeout_s=900, settle_s=settle_s)
    elapsed = (result["accounted_at"] or time.monotonic()) - started
    starts = run_start_times(settings, result["runs"])

    def latencies(done_at: dict[str, dt.datetime]) -> list[float]:
        return sorted(
            (done_at[run] - published_at[event_id]).total_seconds()
            for run in result["runs"]
            for event_id in result["records"][run]
            if event_id in published_at
        )

    claimed = ClaimLedger.for_settings(settings).claimed_at(PROBE_DAG)
    to_claim = sorted(
        (claimed[event_id] - at).total_seconds()
        for event_id, at in published_at.items()
        if event_id in claimed
    )
    to_start, to_work = latencies(starts), latencies(result["recorded_at"])
    runs = settle_runs(settings, queued_since)
    dead = dead_letter_summary(settings)
    unbuildable = dead["by_kind"].get(DEAD_LETTER_UNBUILDABLE, 0)
    return {
        "published": events,
        "malformed_published": malformed,
        "partitions_published": expected_run_count(batch),
        "runs_started": result["runs_started"],
        "expected_runs": expected_run_count(batch),
        **runs,
        "unbuildable_published": 1,
        "unbuildable_events_dead_lettered": unbuildable
        - dead_before["by_kind"].get(DEAD_LETTER_UNBUILDABLE, 0),
        "lost": len(result["lost"]),
        "duplicates": len(result["duplicates"]),
        "dead_lettered": dead["distinct"] - dead_before["distinct"],
        # This burst's: what the stack had dead-lettered before is subtracted.
        "dead_letters_by_kind": {
            kind: count - dead_before["by_kind"].get(kind, 0)
            for kind, count in dead["by_kind"].items()
            if count > dead_before["by_kind"].get(kind, 0)
        },
        "latency_p50_s": _quantile(to_claim, 0.5),
        "latency_p95_s": _quantile(to_claim, 0.95),
        "run_start_latency_p50_s": _quantile(to_start, 0.5),
        "run_start_latency_p95_s": _quantile(to_start, 0.95),
        "work_latency_p50_s": _quantile(to_work, 0.5),
        "work_latency_p95_s": _quantile(to_work, 0.95),
        "events_per_s": round(events / elapsed, 2),
        "publish_events_per_s": round(events / published_s, 1),
        "coalesce_window_s": window_s,
        "seconds_until_all_accounted": round(elapsed, 1),
        "note": "partitions_published: distinct partitions the burst's events name, each to"
        " be built by its own run (runs_started counts the runs that did work for the burst);"
        " runs_failed / stalled_runs: the burst's probe runs that failed / had not ended"
        " minutes after the last event was accounted for; unbuildable_events_dead_lettered:"
        " dead letters the claim step wrote for the burst's event naming a partition two days"
        " ahead (it publishes one: unbuildable_published);"
        " latency_*: publish -> a run claimed the event (event-to-run; includes the"
        " coalescing wait: a run claims once the burst has been quiet for coalesce_window_s);"
        " run_start_latency_*: publish -> start of the DAG run that did the work (negative"
        " when the event joined a run that had started earlier and was still gathering);"
        " work_latency_*: publish -> that run's work record written;"
        " events_per_s: published / seconds until every event had a work record",
    }


def broker_kill_burst(
    settings: Settings,
    *,
    events: int,
    window_s: float,
    node: str = "broker",
    down_s: float = 3.0,
    settle_s: float | None = None,
    partitions: int = 1,
) -> dict[str, Any]:
    """A burst with a Kafka node SIGKILLed in its middle: the first half is published and
    acknowledged (acks=all), the node is killed, the second half is published while it is down
    (the producer holds and retries it; in a three-node cluster the others take it), the node
    is restarted ``down_s`` later, and every event is accounted for: each id exactly once in
    the work records (the claim ledger absorbs what the consumer reads again after the crash)."""
    import threading

    from infra.stack import kill_service, start_service

    batch = probe_events(events, partitions=partitions)
    half = len(batch) // 2
    queued_since = dt.datetime.now(dt.UTC)
    started = time.monotonic()
    publish_many(batch[:half], settings=settings, timeout_s=60)
    killed_pid = kill_service(settings, node)
    killed_at = time.monotonic()
    errors: list[BaseException] = []

    def publish_rest() -> None:
        try:
            publish_many(batch[half:], settings=settings, timeout_s=180)
        except BaseException as exc:  # reported below
            errors.append(exc)

    publisher = threading.Thread(target=publish_rest, daemon=True)
    publisher.start()
    time.sleep(down_s)
    start_service(settings, node, echo=lambda _line: None)
    restarted_s = time.monotonic() - killed_at
    publisher.join(timeout=240)
    if errors or publisher.is_alive():
        raise RuntimeError(f"publishing across the {node} kill failed: {errors or 'timed out'}")
    settle_s = window_s * 2 if settle_s is None else settle_s
    result = account([e.id for e in batch], settings, timeout_s=900, settle_s=settle_s)
    return {
        "published": events,
        "partitions_published": expected_run_count(batch),
        **settle_runs(settings, queued_since),
        "killed": node,
        "killed_pid": killed_pid,
        "restarted_after_s": round(restarted_s, 1),
        "lost": len(result["lost"]),
        "duplicates": len(result["duplicates"]),
        "runs_started": result["runs_started"],
        "expected_runs": expected_run_count(batch),
        "seconds_until_all_accounted": round(
            (result["accounted_at"] or time.monotonic()) - started, 1
        ),
    }


TIMINGS = (
    "latency_p50_s",
    "latency_p95_s",
    "run_start_latency_p50_s",
    "run_start_latency_p95_s",
    "work_latency_p50_s",
    "work_latency_p95_s",
    "events_per_s",
    "publish_events_per_s",
    "seconds_until_all_accounted",
)
"""Figures of a burst that are timings: the median over the bursts, with their spread."""
COUNTS = (
    "runs_started",
    "expected_runs",
    "lost",
    "duplicates",
    "dead_lettered",
    "partitions_published",
    "runs_failed",
    "stalled_runs",
    "unbuildable_events_dead_lettered",
)
"""Figures of a burst that are counts: summed over the bursts."""


def summarize_bursts(bursts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One result from the bursts: each timing the median (its runs in ``<timing>_runs``),
    each count the sum; ``published`` and ``malformed_published`` are per burst."""
    if not bursts:
        raise ValueError("no bursts to summarize")
    first = bursts[0]
    result: dict[str, Any] = {k: v for k, v in first.items() if k != "note"}
    for key in COUNTS:
        result[key] = sum(burst[key] for burst in bursts)
    kinds: dict[str, int] = {}
    for burst in bursts:
        for kind, count in burst["dead_letters_by_kind"].items():
            kinds[kind] = kinds.get(kind, 0) + count
    result["dead_letters_by_kind"] = kinds
    for key in TIMINGS:
        runs = [burst[key] for burst in bursts if burst[key] is not None]
        result[key] = round(statistics.median(runs), 3) if runs else None
        result[f"{key}_runs"] = runs
    result["published_total"] = sum(burst["published"] for burst in bursts)
    result["repeats"] = len(bursts)
    result["bursts"] = [{k: v for k, v in b.items() if k != "note"} for b in bursts]
    result["note"] = first["note"] + (
        "; published and malformed_published are per burst; the timings are medians over the"
        " bursts (each burst's in *_runs), the counts sums"
    )
    return result


def bench_events(out: Path, quick: bool) -> dict[str, Any]:
    """See the module docstring. ``--quick``: one burst of 20 events, a 3 s window."""
    from benchmarks.provenance import bench_repeats

    bench = load_settings().bench
    n = 20 if quick else bench.events
    partitions = bench.event_partitions
    repeats = bench_repeats(3, quick=quick, quick_default=1)
    window_s = 3.0 if quick else 10.0
    env = {
        "CASCADE_COALESCE_WINDOW_S": str(window_s),
        "CASCADE_COALESCE_MAX_WAIT_S": "600",
        # No cron-scheduled runs beside the bursts: only the probe DAG works.
        "CASCADE_AIRFLOW_SCHEDULES": "0",
    }
    with tempfile.TemporaryDirectory(prefix="cascade-bench-events-") as tmp:
        with private_stack(Path(tmp), services=("broker", "airflow"), env=env) as settings:
            wait_for_probe_dag(settings)
            warm_up_s = warm_up(settings)
            bursts = [
                measure_events(
                    settings,
                    events=n,
                    malformed=3 if quick else 10,
                    window_s=window_s,
                    partitions=partitions,
                )
                for _ in range(repeats)
            ]
            kills = [
                broker_kill_burst(settings, events=n, window_s=window_s, partitions=partitions)
            ]
    return {
        **with_broker_kills(summarize_bursts(bursts), kills),
        "warm_up_s": round(warm_up_s, 1),
    }


KILL_COUNTS = (
    "lost",
    "duplicates",
    "runs_started",
    "expected_runs",
    "partitions_published",
    "runs_failed",
    "stalled_runs",
)
"""Counts a broker-kill burst adds to the summary."""


def with_broker_kills(result: dict[str, Any], kills: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The summary with the broker-kill bursts added: ``broker`` (name and version),
    ``broker_kills``, each kill burst in ``kill_bursts``, and the :data:`KILL_COUNTS` counted
    over the kill bursts too."""
    from infra.kafka_broker import broker_info

    out = dict(result)
    out["broker"] = broker_info()
    out["broker_kills"] = len(kills)
    out["kill_bursts"] = list(kills)
    for key in KILL_COUNTS:
        out[key] = result[key] + sum(k[key] for k in kills)
    out["lost_across_kills"] = sum(k["lost"] for k in kills)
    out["duplicates_across_kills"] = sum(k["duplicates"] for k in kills)
    out["note"] = result["note"] + (
        "; broker_kills: bursts during which the Kafka node was SIGKILLed and restarted"
        f" (kill_bursts); {', '.join(KILL_COUNTS)} include them"
    )
    return out
