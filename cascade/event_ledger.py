"""Exactly-once in effect: the claim ledger of event ids per DAG, burst coalescing, and the
work records by which every event id is accounted for.

The ledger is SQLite in the state folder in the ``local`` profile (:class:`EventLedger`) and a
PostgreSQL table in the ``cluster`` profile (:class:`PostgresEventLedger`), shared by every
Airflow worker and the triggerer; :meth:`ClaimLedger.for_settings` picks the profile's. Both
make a second claim of an event impossible with the table's primary key (DAG, event id)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade.config import Settings, load_settings
from cascade.events import MAX_NAME_CHARS, InvalidEvent, parse_event

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class CoalesceConfig:
    """How a run gathers the events it works on."""

    window_s: float = 15.0
    """A run starts work once the asset has had no new event for this long (the burst window)."""
    max_wait_s: float = 300.0
    """Upper bound on that wait, so an endless trickle still gets processed."""
    lookback_s: float = 24 * 3600.0
    """How far back a run looks for unclaimed events (drains events no run took yet)."""
    poll_s: float = 2.0
    """How often the asset's events are re-read while waiting."""

    def __post_init__(self) -> None:
        if self.window_s < 0 or self.max_wait_s < 0:
            raise ValueError("window_s and max_wait_s must be >= 0 (CASCADE_COALESCE_WINDOW_S)")
        if self.lookback_s <= 0 or self.poll_s <= 0:
            raise ValueError("lookback_s and poll_s must be > 0")


def coalesce_config_from_env(env: Mapping[str, str] | None = None) -> CoalesceConfig:
    """The defaults, with the window and the wait of the settings (``CASCADE_COALESCE_*``)."""
    events = load_settings(env).events
    return CoalesceConfig(window_s=events.window_s, max_wait_s=events.max_wait_s)


def checked_events(
    events: Iterable[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Each event validated again and normalised as the watcher does (:func:`parse_event`);
    returns (valid events, event id -> reason for the others)."""
    valid: list[dict[str, Any]] = []
    refused: dict[str, str] = {}
    for event in events:
        try:
            text = json.dumps(event, default=str)
            valid.append(json.loads(parse_event(text).model_dump_json()))
        except (InvalidEvent, TypeError, ValueError, RecursionError) as exc:
            event_id = str(event.get("id"))[:MAX_NAME_CHARS] if isinstance(event, Mapping) else "?"
            refused[event_id] = str(exc)[:500]
    return valid, refused


def event_from_extra(extra: Any) -> dict[str, Any] | None:
    """The Cascade event inside an asset event's extra (``{"payload": event}`` from the
    trigger), or the event itself; None for asset events that carry no Cascade event."""
    if not isinstance(extra, Mapping):
        return None
    candidate = extra.get("payload") if "from_trigger" in extra else extra
    if isinstance(candidate, str):
        try:
            candidate = json.loads(candidate)
        except json.JSONDecodeError:
            return None
    if isinstance(candidate, Mapping) and candidate.get("id") and candidate.get("type"):
        return dict(candidate)
    return None


@dataclass
class Claim:
    """What one run took from the ledger."""

    run_id: str
    new: list[dict[str, Any]] = field(default_factory=list)
    """Events this call claimed for the run."""
    reclaimed: list[dict[str, Any]] = field(default_factory=list)
    """Events the same run had claimed before (a task retry): still this run's work."""
    taken: dict[str, str] = field(default_factory=dict)
    """Event id -> the other run that owns it (redelivered or coalesced into that run)."""
    refused: dict[str, str] = field(default_factory=dict)
    """Event id -> why it is not a valid event today: stored asset events are checked again
    (one stored before the watcher checked as strictly, say) and never claimed, so a bad one
    cannot fail run after run."""

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.new + self.reclaimed

    @property
    def has_work(self) -> bool:
        return bool(self.new or self.reclaimed)


class ClaimLedger(ABC):
    """Which run owns which event, per DAG."""

    @classmethod
    def for_settings(cls, settings: Settings | None = None) -> ClaimLedger:
        """The profile's ledger: SQLite under the state folder (``local``), PostgreSQL
        (``cluster``: ``CASCADE_POSTGRES_URL`` or the cluster stack's own database)."""
        settings = settings or load_settings()
        if settings.profile == "cluster":
            from cascade.data_services import postgres_url

            return PostgresEventLedger(postgres_url(settings))
        return EventLedger(settings.home / "events" / "ledger.sqlite")

    @abstractmethod
    def claim(self, *, dag_id: str, run_id: str, events: Iterable[Mapping[str, Any]]) -> Claim:
        """Claim ``events`` for the run: each event id once per DAG, whoever asks at once."""

    @abstractmethod
    def release(self, *, dag_id: str, run_id: str) -> int:
        """Forget a run's claims (it failed); returns how many events were released."""

    @abstractmethod
    def claimed_at(self, dag_id: str) -> dict[str, dt.datetime]:
        """Event id -> when a run claimed it (the event-to-run moment)."""

    @abstractmethod
    def owners(self, dag_id: str) -> dict[str, str]:
        """Event id -> run id, for one DAG."""

    @abstractmethod
    def record_work(self, dag_id: str, run_id: str, event_ids: Sequence[str]) -> str:
        """Store which events a run did its work for, replacing the run's earlier record (a
        retry); returns where. The records are the accounting of every event id (lost =
        published minus these, duplicates = ids in two records)."""

    @abstractmethod
    def work_records(self, dag_id: str) -> dict[str, list[str]]:
        """Run id -> event ids it did work for."""

    @abstractmethod
    def work_recorded_at(self, dag_id: str) -> dict[str, dt.datetime]:
        """Run id -> when its work record was last written."""


def _unique_events(events: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    unique: dict[str, dict[str, Any]] = {}
    for event in events:
        unique.setdefault(str(event["id"]), dict(event))
    return unique


class EventLedger(ClaimLedger):
    """The ledger in a SQLite file (the ``local`` profile's, in the state folder)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS claims (dag_id TEXT NOT NULL, event_id TEXT NOT NULL,"
                " run_id TEXT NOT NULL, event_type TEXT, event_time TEXT, claimed_at TEXT,"
                " PRIMARY KEY (dag_id, event_id))"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60, isolation_level=None)

    def claim(self, *, dag_id: str, run_id: str, events: Iterable[Mapping[str, Any]]) -> Claim:
        unique = _unique_events(events)
        result = Claim(run_id=run_id)
        now = dt.datetime.now(dt.UTC).isoformat()
        db = self._connect()
        try:
            # One write transaction: two runs claiming at once serialize here.
            db.execute("BEGIN IMMEDIATE")
            for event_id, event in unique.items():
                inserted = db.execute(
                    "INSERT OR IGNORE INTO claims VALUES (?, ?, ?, ?, ?, ?)",
                    (dag_id, event_id, run_id, event.get("type"), str(event.get("time")), now),
                ).rowcount
                if inserted:
                    result.new.append(event)
                    continue
                (owner,) = db.execute(
                    "SELECT run_id FROM claims WHERE dag_id = ? AND event_id = ?",
                    (dag_id, event_id),
                ).fetchone()
                if owner == run_id:
                    result.reclaimed.append(event)
                else:
                    result.taken[event_id] = owner
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        finally:
            db.close()
        return result

    def release(self, *, dag_id: str, run_id: str) -> int:
        with self._connect() as db:
            return db.execute(
                "DELETE FROM claims WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)
            ).rowcount

    def claimed_at(self, dag_id: str) -> dict[str, dt.datetime]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT event_id, claimed_at FROM claims WHERE dag_id = ?", (dag_id,)
            ).fetchall()
        return {event_id: dt.datetime.fromisoformat(at) for event_id, at in rows}

    def owners(self, dag_id: str) -> dict[str, str]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT event_id, run_id FROM claims WHERE dag_id = ?", (dag_id,)
            ).fetchall()
        return dict(rows)

    def work_folder(self, dag_id: str) -> Path:
        """The DAG's work records: one JSON file per run beside the ledger file."""
        return self.path.parent / "work" / dag_id

    def record_work(self, dag_id: str, run_id: str, event_ids: Sequence[str]) -> str:
        safe_run = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
        path = self.work_folder(dag_id) / f"{safe_run}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"dag_id": dag_id, "run_id": run_id, "event_ids": list(event_ids)}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        tmp.replace(path)
        return str(path)

    def work_record_paths(self, dag_id: str) -> dict[str, Path]:
        """Run id -> its work record file."""
        folder = self.work_folder(dag_id)
        return {json.loads(p.read_text())["run_id"]: p for p in sorted(folder.glob("*.json"))}

    def work_records(self, dag_id: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for path in sorted(self.work_folder(dag_id).glob("*.json")):
            body = json.loads(path.read_text())
            out[body["run_id"]] = body["event_ids"]
        return out

    def work_recorded_at(self, dag_id: str) -> dict[str, dt.datetime]:
        return {
            run: dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
            for run, path in self.work_record_paths(dag_id).items()
        }


class PostgresEventLedger(ClaimLedger):
    """The ledger in a PostgreSQL table (the ``cluster`` profile's), shared by every process
    on every host.

    A claim is one transaction: one multi-row ``INSERT ... ON CONFLICT DO NOTHING RETURNING``
    (what it returns is this run's new claims), then the owners of the rest. Two runs claiming
    the same event at once: the second insert waits on the first's uncommitted key, then does
    nothing once it commits, and reads it as taken (read committed sees the committed row). The
    rows go in event id order, so two overlapping claims wait on each other in one order and
    cannot deadlock."""

    TABLE = "event_claims"
    WORK_TABLE = "event_work"
    _SCHEMA_LOCK = 0x6361736361646531
    """Advisory lock key serializing the ``CREATE TABLE`` of processes starting at once."""
    _RETRIES = 3

    def __init__(self, url: str) -> None:
        self.url = url
        with self._connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (self._SCHEMA_LOCK,))
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.TABLE} (dag_id TEXT NOT NULL,"
                " event_id TEXT NOT NULL, run_id TEXT NOT NULL, event_type TEXT,"
                " event_time TEXT, claimed_at TIMESTAMPTZ NOT NULL DEFAULT now(),"
                " PRIMARY KEY (dag_id, event_id))"
            )
            cur.execute(
                f"CREATE INDEX IF NOT EXISTS {self.TABLE}_run ON {self.TABLE} (dag_id, run_id)"
            )
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.WORK_TABLE} (dag_id TEXT NOT NULL,"
                " run_id TEXT NOT NULL, event_ids JSONB NOT NULL,"
                " recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (dag_id, run_id))"
            )

    def __repr__(self) -> str:  # never the URL: it carries the password
        return f"{type(self).__name__}(table={self.TABLE})"

    def _connect(self) -> Any:
        import psycopg2

        try:
            return psycopg2.connect(self.url, connect_timeout=10)
        except psycopg2.OperationalError as exc:
            # The driver's message names host and port, not the password.
            raise ConnectionError(f"event ledger database unreachable: {exc}".strip()) from None

    def _transaction(self, work: Callable[[Any], Any]) -> Any:
        """Run ``work(cursor)`` in one transaction; a deadlock victim is retried."""
        import psycopg2.errors

        conn = self._connect()
        try:
            for attempt in range(self._RETRIES):
                try:
                    with conn, conn.cursor() as cur:
                        return work(cur)
                except psycopg2.errors.DeadlockDetected:
                    if attempt == self._RETRIES - 1:
                        raise
                    time.sleep(0.05 * (attempt + 1))
        finally:
            conn.close()
        raise AssertionError("unreachable")

    def claim(self, *, dag_id: str, run_id: str, events: Iterable[Mapping[str, Any]]) -> Claim:
        from psycopg2.extras import execute_values

        unique = _unique_events(events)
        result = Claim(run_id=run_id)
        if not unique:
            return result
        rows = [
            (dag_id, event_id, run_id, event.get("type"), str(event.get("time")))
            for event_id, event in sorted(unique.items())
        ]

        def work(cur: Any) -> tuple[set[str], dict[str, str]]:
            new: set[str] = set()
            owners: dict[str, str] = {}
            pending = rows
            # An owner may release between the insert and the read (its run failed): those
            # events are free again, so they are inserted again.
            for _ in range(self._RETRIES):
                inserted = execute_values(
                    cur,
                    f"INSERT INTO {self.TABLE} (dag_id, event_id, run_id, event_type, "
                    "event_time) VALUES %s ON CONFLICT (dag_id, event_id) DO NOTHING "
                    "RETURNING event_id",
                    pending,
                    page_size=1000,
                    fetch=True,
                )
                new.update(event_id for (event_id,) in inserted)
                rest = [row[1] for row in pending if row[1] not in new]
                if rest:
                    cur.execute(
                        f"SELECT event_id, run_id FROM {self.TABLE} "
                        "WHERE dag_id = %s AND event_id = ANY(%s)",
                        (dag_id, rest),
                    )
                    owners.update(cur.fetchall())
                pending = [row for row in pending if row[1] not in new and row[1] not in owners]
                if not pending:
                    return new, owners
            raise RuntimeError(f"events {[r[1] for r in pending][:5]} kept changing owner")

        new, owners = self._transaction(work)
        for event_id, event in unique.items():
            if event_id in new:
                result.new.append(event)
            elif owners[event_id] == run_id:
                result.reclaimed.append(event)
            else:
                result.taken[event_id] = owners[event_id]
        return result

    def release(self, *, dag_id: str, run_id: str) -> int:
        def work(cur: Any) -> int:
            cur.execute(
                f"DELETE FROM {self.TABLE} WHERE dag_id = %s AND run_id = %s", (dag_id, run_id)
            )
            return int(cur.rowcount)

        return int(self._transaction(work))

    def claimed_at(self, dag_id: str) -> dict[str, dt.datetime]:
        sql = f"SELECT event_id, claimed_at FROM {self.TABLE} WHERE dag_id = %s"
        return self._pairs(sql, dag_id)

    def owners(self, dag_id: str) -> dict[str, str]:
        return self._pairs(f"SELECT event_id, run_id FROM {self.TABLE} WHERE dag_id = %s", dag_id)

    def record_work(self, dag_id: str, run_id: str, event_ids: Sequence[str]) -> str:
        def work(cur: Any) -> None:
            cur.execute(
                f"INSERT INTO {self.WORK_TABLE} (dag_id, run_id, event_ids) VALUES (%s, %s, %s) "
                "ON CONFLICT (dag_id, run_id) DO UPDATE "
                "SET event_ids = excluded.event_ids, recorded_at = now()",
                (dag_id, run_id, json.dumps(list(event_ids))),
            )

        self._transaction(work)
        return f"PostgreSQL table {self.WORK_TABLE}, row ({dag_id}, {run_id})"

    def work_records(self, dag_id: str) -> dict[str, list[str]]:
        sql = f"SELECT run_id, event_ids FROM {self.WORK_TABLE} WHERE dag_id = %s"
        return {run: list(ids) for run, ids in self._pairs(sql, dag_id).items()}

    def work_recorded_at(self, dag_id: str) -> dict[str, dt.datetime]:
        sql = f"SELECT run_id, recorded_at FROM {self.WORK_TABLE} WHERE dag_id = %s"
        return self._pairs(sql, dag_id)

    def _pairs(self, sql: str, dag_id: str) -> dict[Any, Any]:
        """The two columns of ``sql``'s rows (for one DAG) as a dict."""

        def work(cur: Any) -> dict[Any, Any]:
            cur.execute(sql, (dag_id,))
            return dict(cur.fetchall())

        return dict(self._transaction(work))


REREAD_S = 120.0
"""How far behind the newest seen event a claiming run re-reads the asset's events."""

RecentEvents = Callable[[dt.datetime], list[tuple[dt.datetime, Any]]]
"""``since -> [(asset event timestamp, extra)]``: the asset's events stored after ``since``."""


def wait_until_quiet(
    recent: RecentEvents,
    config: CoalesceConfig,
    *,
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    sleep: Callable[[float], None] = time.sleep,
) -> list[tuple[dt.datetime, Any]]:
    """Re-read the asset's recent events until none arrived for ``window_s`` (or ``max_wait_s``
    passed); returns the last read.

    "None arrived" must hold twice: the newest event's timestamp is ``window_s`` old, and no new
    event became visible during the last ``window_s`` of watching. The second rule matters
    because the triggerer stamps an event before its transaction commits: on a loaded machine
    events appear seconds after their timestamps, and timestamps alone would call a burst
    quiet in the middle of it."""
    started = clock()
    since = started - dt.timedelta(seconds=config.lookback_s)
    seen: int | None = None
    last_change = started
    while True:
        events = recent(since)
        now = clock()
        if len(events) != seen:
            seen, last_change = len(events), now
        newest = max((ts for ts, _ in events), default=None)
        quiet_for = min(
            (now - newest).total_seconds() if newest else float("inf"),
            (now - last_change).total_seconds(),
        )
        waited = (now - started).total_seconds()
        if quiet_for >= config.window_s or waited >= config.max_wait_s:
            return events
        sleep(min(config.poll_s, config.window_s - quiet_for, config.max_wait_s - waited))


def claim_run_events(
    *,
    dag_id: str,
    run_id: str,
    triggering_extras: Iterable[Any],
    recent: RecentEvents | None,
    ledger: ClaimLedger,
    config: CoalesceConfig,
    sleep: Callable[[float], None] = time.sleep,
) -> Claim:
    """Claim the run's triggering events plus every unclaimed event the asset received (after
    the burst went quiet). ``recent=None`` skips the coalescing wait (e.g. no inlet asset).
    Events that are not valid today are not claimed (:attr:`Claim.refused` says why)."""
    events = [e for e in map(event_from_extra, triggering_extras) if e is not None]
    if recent is not None:
        for _ts, extra in wait_until_quiet(recent, config, sleep=sleep):
            event = event_from_extra(extra)
            if event is not None:
                events.append(event)
    valid, refused = checked_events(events)
    for event_id, reason in refused.items():
        log.warning("not claiming event %s: %s", event_id, reason)
    claim = ledger.claim(dag_id=dag_id, run_id=run_id, events=valid)
    claim.refused = refused
    return claim


def claim_for_run(
    context: Mapping[str, Any],
    asset: Any,
    *,
    settings: Settings | None = None,
    config: CoalesceConfig | None = None,
) -> Claim:
    """Claim the events of the running Airflow task's DAG run (``asset`` must be an inlet).

    Raises Airflow's skip exception when an asset-triggered run has nothing left to claim: its
    events were redelivered copies or were coalesced into another run, so its work is done."""
    from airflow.sdk.exceptions import AirflowSkipException

    settings = settings or load_settings()
    config = config or coalesce_config_from_env()
    dag_run = context["dag_run"]
    triggering = context.get("triggering_asset_events") or {}
    extras = [event.extra for batch in triggering.values() for event in batch]
    inlet_events = context["inlet_events"]

    # The first read covers the lookback; later reads only the last REREAD_S (events can commit
    # a little after their timestamp), merged by asset event id: re-reading thousands of
    # events every poll through the one API server slowed it down for every task.
    seen: dict[Any, tuple[dt.datetime, Any]] = {}
    newest: list[dt.datetime] = []

    def recent(since: dt.datetime) -> list[tuple[dt.datetime, Any]]:
        start = max(since, newest[0] - dt.timedelta(seconds=REREAD_S)) if newest else since
        for event in inlet_events[asset].after(start.isoformat()):
            key = getattr(event, "id", None) or (
                event.timestamp,
                json.dumps(event.extra, default=str),
            )
            seen[key] = (event.timestamp, event.extra)
        if seen:
            newest[:] = [max(ts for ts, _ in seen.values())]
        return list(seen.values())

    claim = claim_run_events(
        dag_id=dag_run.dag_id,
        run_id=dag_run.run_id,
        triggering_extras=extras,
        recent=recent,
        ledger=ClaimLedger.for_settings(settings),
        config=config,
    )
    log.info(
        "run %s claimed %d new event(s), %d from an earlier try; %d owned by other runs; "
        "%d invalid, not claimed",
        dag_run.run_id,
        len(claim.new),
        len(claim.reclaimed),
        len(claim.taken),
        len(claim.refused),
    )
    if not claim.has_work and str(dag_run.run_type) in (
        "asset_triggered",
        "DagRunType.ASSET_TRIGGERED",
    ):
        owners = sorted(set(claim.taken.values()))
        raise AirflowSkipException(
            f"nothing to do: {len(claim.taken)} triggering event(s) already claimed by "
            f"{owners[:5]} (redelivered or coalesced), {len(claim.refused)} invalid"
        )
    return claim


def release_failed_run(context: Mapping[str, Any]) -> None:
    """DAG ``on_failure_callback``: a failed run gives its events back, so the next run (its
    lookback reads unclaimed events) does their work instead of them being owned by a run
    that never finished. A run that failed after partly working redoes that work, which the
    idempotent tasks allow."""
    dag_run = context["dag_run"]
    released = ClaimLedger.for_settings().release(dag_id=dag_run.dag_id, run_id=dag_run.run_id)
    log.warning("run %s failed: released %d event(s) for the next run", dag_run.run_id, released)


def claim_and_resolve(context: Mapping[str, Any], asset: Any, *, lag_days: int = 0) -> str:
    """A pipeline DAG's first task: claim the run's events, return the partition."""
    from cascade.partitions import resolve_partition

    claim = claim_for_run(context, asset)
    dag_run = context["dag_run"]
    return resolve_partition(
        claim.events, dag_run.logical_date, getattr(dag_run, "run_after", None), lag_days=lag_days
    )


def record_work(
    dag_id: str, run_id: str, event_ids: Sequence[str], *, settings: Settings | None = None
) -> str:
    """Store which events a run did its work for in the profile's ledger (one JSON file per run
    in the state folder locally, a row of PostgreSQL in the cluster profile), replacing the
    run's earlier record on a retry; returns where."""
    return ClaimLedger.for_settings(settings).record_work(dag_id, run_id, event_ids)


def work_records(dag_id: str, *, settings: Settings | None = None) -> dict[str, list[str]]:
    """Run id -> event ids it did work for (see :func:`record_work`)."""
    return ClaimLedger.for_settings(settings).work_records(dag_id)


def work_recorded_at(dag_id: str, *, settings: Settings | None = None) -> dict[str, dt.datetime]:
    """Run id -> when its work record was last written."""
    return ClaimLedger.for_settings(settings).work_recorded_at(dag_id)
