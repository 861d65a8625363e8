"""Exactly-once in effect: the claim ledger of event ids per DAG, burst coalescing, and the
work records by which every event id is accounted for.

The ledger is SQLite in the state folder in the ``local`` profile (:class:`EventLedger`) and a
PostgreSQL table in the ``cluster`` profile (:class:`PostgresEventLedger`), shared by every
Airflow worker and the triggerer; :meth:`ClaimLedger.for_settings` picks the profile's. Both
make a second claim of an event impossible with the table's primary key (DAG, event id)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from cascade.assets import TOPIC_DATA_LANDED
from cascade.config import Settings, load_settings
from cascade.events import MAX_NAME_CHARS, Event, InvalidEvent, dead_letter_event, parse_event

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class CoalesceConfig:
    """How a run gathers the events it works on."""

    window_s: float = 15.0
    """A run starts work once the asset has had no new event for this long (the burst window)."""
    max_wait_s: float = 300.0
    """Upper bound on that wait, so an endless trickle still gets processed."""
    lookback_s: float = 24 * 3600.0
    """How far back a run re-reads the asset for unclaimed events (drains events no run took
    yet); events a failed run gave back come from the ledger, whatever their age."""
    poll_s: float = 2.0
    """How often the asset's events are re-read while waiting."""
    max_releases: int = 3
    """How many failed runs may give an event back; the next claim dead-letters it instead
    (``CASCADE_COALESCE_MAX_RELEASES``)."""

    def __post_init__(self) -> None:
        if self.window_s < 0 or self.max_wait_s < 0:
            raise ValueError("window_s and max_wait_s must be >= 0 (CASCADE_COALESCE_WINDOW_S)")
        if self.lookback_s <= 0 or self.poll_s <= 0:
            raise ValueError("lookback_s and poll_s must be > 0")
        if self.max_releases < 1:
            raise ValueError("max_releases must be >= 1 (CASCADE_COALESCE_MAX_RELEASES)")


def coalesce_config_from_env(env: Mapping[str, str] | None = None) -> CoalesceConfig:
    """The defaults, with the window and the wait of the settings (``CASCADE_COALESCE_*``)."""
    events = load_settings(env).events
    return CoalesceConfig(
        window_s=events.window_s, max_wait_s=events.max_wait_s, max_releases=events.max_releases
    )


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
    partition: str | None = None
    """The one partition the run works on: that of every event it claimed (None: its events
    name none, or it claimed nothing)."""
    pending: list[str] = field(default_factory=list)
    """Other buildable partitions whose events are still unclaimed, oldest first: each is
    another run's work (the DAG's ``next_partitions`` task queues a run for them)."""
    dead_lettered: dict[str, str] = field(default_factory=dict)
    """Event id -> why it was dead-lettered at this claim (its partition cannot be built, or
    runs failed on it too often); none of them is ever claimed."""

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.new + self.reclaimed

    @property
    def has_work(self) -> bool:
        return bool(self.new or self.reclaimed)


DEAD_LETTERED = "cascade:dead-lettered"
"""The owner of an event that was dead-lettered at claim time: no run ever claims it."""


class Released(NamedTuple):
    """An event waiting in the ledger for a later run (:meth:`ClaimLedger.released`): a failed
    run gave it back, or a run that took another partition kept it (:meth:`ClaimLedger.keep`)."""

    event: dict[str, Any]
    releases: int
    """How many failed runs have given it back (0: kept, never claimed yet)."""
    last_run_id: str
    """The run that last gave it back, or that kept it."""


class ClaimLedger(ABC):
    """Which run owns which event, per DAG; the events failed runs gave back (kept with their
    bodies and counts, so a later run retries them however old they are)."""

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
        """Give a failed run's claims back: each event is kept (with how many runs gave it
        back) for :meth:`released`; returns how many events were released."""

    @abstractmethod
    def released(self, dag_id: str) -> dict[str, Released]:
        """Event id -> the event failed runs gave back, or a run kept, that no run has claimed
        since."""

    @abstractmethod
    def keep(self, *, dag_id: str, run_id: str, events: Iterable[Mapping[str, Any]]) -> list[str]:
        """Keep ``events`` for later runs (:meth:`released` lists them, with no release yet),
        because nothing else stores them: the upstream partitions an asset-triggered run saw
        (:func:`upstream_events`). An event a run owns stays that run's (its partition is built
        or being built: a repeat builds nothing); one dead-lettered before, or given back by
        failed runs, waits again with a fresh count (its upstream published it again, as a
        dead letter's advice asks). Returns the ids kept."""

    @abstractmethod
    def run_events(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """The events a run has claimed (a retried task finds its run's partition here)."""

    def dead_letter(self, dag_id: str, events: Iterable[Mapping[str, Any]]) -> list[str]:
        """Mark events as dead-lettered (owned by :data:`DEAD_LETTERED`): no run claims them
        again. Returns the ids marked now (not those another run owned first)."""
        claim = self.claim(dag_id=dag_id, run_id=DEAD_LETTERED, events=events)
        return [str(event["id"]) for event in claim.new]

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


def _body(event: Mapping[str, Any]) -> str:
    return json.dumps(event, default=str, sort_keys=True)


class EventLedger(ClaimLedger):
    """The ledger in a SQLite file (the ``local`` profile's, in the state folder)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS claims (dag_id TEXT NOT NULL, event_id TEXT NOT NULL,"
                " run_id TEXT NOT NULL, event_type TEXT, event_time TEXT, claimed_at TEXT,"
                " event_json TEXT, PRIMARY KEY (dag_id, event_id))"
            )
            columns = {row[1] for row in db.execute("PRAGMA table_info(claims)")}
            if "event_json" not in columns:  # a ledger written before bodies were kept
                db.execute("ALTER TABLE claims ADD COLUMN event_json TEXT")
            db.execute(
                "CREATE TABLE IF NOT EXISTS released (dag_id TEXT NOT NULL,"
                " event_id TEXT NOT NULL, event_json TEXT NOT NULL, releases INTEGER NOT NULL,"
                " last_run_id TEXT NOT NULL, released_at TEXT NOT NULL,"
                " PRIMARY KEY (dag_id, event_id))"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60, isolation_level=None)

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: two processes writing at once serialize here."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            yield db
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    def claim(self, *, dag_id: str, run_id: str, events: Iterable[Mapping[str, Any]]) -> Claim:
        unique = _unique_events(events)
        result = Claim(run_id=run_id)
        now = dt.datetime.now(dt.UTC).isoformat()
        with self._write() as db:
            for event_id, event in unique.items():
                inserted = db.execute(
                    "INSERT OR IGNORE INTO claims VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        dag_id,
                        event_id,
                        run_id,
                        event.get("type"),
                        str(event.get("time")),
                        now,
                        _body(event),
                    ),
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
        return result

    def release(self, *, dag_id: str, run_id: str) -> int:
        now = dt.datetime.now(dt.UTC).isoformat()
        with self._write() as db:
            # Claims written before bodies were kept are only forgotten: the lookback re-reads
            # them, as it did then.
            db.execute(
                "INSERT INTO released SELECT dag_id, event_id, event_json, 1, run_id, ?"
                " FROM claims WHERE dag_id = ? AND run_id = ? AND event_json IS NOT NULL"
                " ON CONFLICT (dag_id, event_id) DO UPDATE SET releases = releases + 1,"
                " last_run_id = excluded.last_run_id, released_at = excluded.released_at",
                (now, dag_id, run_id),
            )
            count = db.execute(
                "DELETE FROM claims WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)
            ).rowcount
        return int(count)

    def released(self, dag_id: str) -> dict[str, Released]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT r.event_id, r.event_json, r.releases, r.last_run_id FROM released r"
                " LEFT JOIN claims c ON c.dag_id = r.dag_id AND c.event_id = r.event_id"
                " WHERE r.dag_id = ? AND c.event_id IS NULL",
                (dag_id,),
            ).fetchall()
        return {
            event_id: Released(json.loads(body), int(releases), last)
            for event_id, body, releases, last in rows
        }

    def keep(self, *, dag_id: str, run_id: str, events: Iterable[Mapping[str, Any]]) -> list[str]:
        now = dt.datetime.now(dt.UTC).isoformat()
        kept: list[str] = []
        with self._write() as db:
            for event_id, event in _unique_events(events).items():
                owner = db.execute(
                    "SELECT run_id FROM claims WHERE dag_id = ? AND event_id = ?",
                    (dag_id, event_id),
                ).fetchone()
                if owner is not None and owner[0] != DEAD_LETTERED:
                    continue
                db.execute(
                    "DELETE FROM claims WHERE dag_id = ? AND event_id = ?", (dag_id, event_id)
                )
                db.execute(
                    "INSERT INTO released VALUES (?, ?, ?, 0, ?, ?)"
                    " ON CONFLICT (dag_id, event_id) DO UPDATE SET releases = 0,"
                    " event_json = excluded.event_json, last_run_id = excluded.last_run_id,"
                    " released_at = excluded.released_at",
                    (dag_id, event_id, _body(event), run_id, now),
                )
                kept.append(event_id)
        return kept

    def run_events(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT event_json FROM claims WHERE dag_id = ? AND run_id = ?"
                " AND event_json IS NOT NULL ORDER BY event_id",
                (dag_id, run_id),
            ).fetchall()
        return [json.loads(body) for (body,) in rows]

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
    RELEASED_TABLE = "event_released"
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
                " event_json TEXT, PRIMARY KEY (dag_id, event_id))"
            )
            cur.execute(f"ALTER TABLE {self.TABLE} ADD COLUMN IF NOT EXISTS event_json TEXT")
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.RELEASED_TABLE} (dag_id TEXT NOT NULL,"
                " event_id TEXT NOT NULL, event_json TEXT NOT NULL, releases INTEGER NOT NULL,"
                " last_run_id TEXT NOT NULL, released_at TIMESTAMPTZ NOT NULL DEFAULT now(),"
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
            (dag_id, event_id, run_id, event.get("type"), str(event.get("time")), _body(event))
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
                    "event_time, event_json) VALUES %s ON CONFLICT (dag_id, event_id) DO NOTHING "
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
                f"INSERT INTO {self.RELEASED_TABLE} (dag_id, event_id, event_json, releases,"
                f" last_run_id) SELECT dag_id, event_id, event_json, 1, run_id FROM {self.TABLE}"
                " WHERE dag_id = %s AND run_id = %s AND event_json IS NOT NULL"
                " ON CONFLICT (dag_id, event_id) DO UPDATE SET"
                f" releases = {self.RELEASED_TABLE}.releases + 1,"
                " last_run_id = excluded.last_run_id, released_at = now()",
                (dag_id, run_id),
            )
            cur.execute(
                f"DELETE FROM {self.TABLE} WHERE dag_id = %s AND run_id = %s", (dag_id, run_id)
            )
            return int(cur.rowcount)

        return int(self._transaction(work))

    def released(self, dag_id: str) -> dict[str, Released]:
        def work(cur: Any) -> list[tuple[Any, ...]]:
            cur.execute(
                f"SELECT r.event_id, r.event_json, r.releases, r.last_run_id"
                f" FROM {self.RELEASED_TABLE} r LEFT JOIN {self.TABLE} c"
                " ON c.dag_id = r.dag_id AND c.event_id = r.event_id"
                " WHERE r.dag_id = %s AND c.event_id IS NULL",
                (dag_id,),
            )
            return list(cur.fetchall())

        return {
            event_id: Released(json.loads(body), int(releases), last)
            for event_id, body, releases, last in self._transaction(work)
        }

    def keep(self, *, dag_id: str, run_id: str, events: Iterable[Mapping[str, Any]]) -> list[str]:
        from psycopg2.extras import execute_values

        unique = _unique_events(events)
        if not unique:
            return []

        def work(cur: Any) -> list[str]:
            ids = sorted(unique)
            cur.execute(
                f"DELETE FROM {self.TABLE} WHERE dag_id = %s AND event_id = ANY(%s)"
                " AND run_id = %s",
                (dag_id, ids, DEAD_LETTERED),
            )
            cur.execute(
                f"SELECT event_id FROM {self.TABLE} WHERE dag_id = %s AND event_id = ANY(%s)",
                (dag_id, ids),
            )
            owned = {event_id for (event_id,) in cur.fetchall()}
            rows = [(dag_id, i, _body(unique[i]), 0, run_id) for i in ids if i not in owned]
            if rows:
                execute_values(
                    cur,
                    f"INSERT INTO {self.RELEASED_TABLE} (dag_id, event_id, event_json, releases,"
                    " last_run_id) VALUES %s ON CONFLICT (dag_id, event_id) DO UPDATE SET"
                    " releases = 0, event_json = excluded.event_json,"
                    " last_run_id = excluded.last_run_id, released_at = now()",
                    rows,
                )
            return [row[1] for row in rows]

        return list(self._transaction(work))

    def run_events(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        def work(cur: Any) -> list[tuple[Any, ...]]:
            cur.execute(
                f"SELECT event_json FROM {self.TABLE} WHERE dag_id = %s AND run_id = %s"
                " AND event_json IS NOT NULL ORDER BY event_id",
                (dag_id, run_id),
            )
            return list(cur.fetchall())

        return [json.loads(body) for (body,) in self._transaction(work)]

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


Unbuildable = Callable[[str], str | None]
"""``ds -> reason``: why partition ``ds`` cannot be built now (nothing landed for it), or None
when it can; a pipeline's :attr:`~cascade.pipeline_spec.Trigger.unbuildable`."""
DeadLetterSink = Callable[[Sequence[Event]], None]
"""Sends dead-letter records where the watchers send theirs; raises when they were not
acknowledged (the events then stay unclaimed, and a later claim tries again)."""
DEAD_LETTER_UNBUILDABLE = "unbuildable"
"""Dead-letter kind of an event whose partition cannot be built (in the future, nothing
landed)."""
DEAD_LETTER_RETRIES = "retries-exhausted"
"""Dead-letter kind of an event that :attr:`CoalesceConfig.max_releases` failed runs gave back."""
PENDING_XCOM_KEY = "pending_partitions"
"""XCom key under which the claiming task leaves the partitions still waiting for a run."""


def event_partition(event: Mapping[str, Any]) -> str | None:
    """The partition an event names (None: it names none, e.g. a retrain request)."""
    payload = event.get("payload")
    partition = payload.get("partition") if isinstance(payload, Mapping) else None
    return str(partition) if partition else None


def named_path(event: Mapping[str, Any]) -> str | None:
    """The batch location a data-landed event names by ``path`` (None when it names none)."""
    payload = event.get("payload")
    where = payload.get("path") if isinstance(payload, Mapping) else None
    return str(where) if where else None


UPSTREAM_ID_PREFIX = "after:"
"""Id prefix of the event standing for an upstream partition (:func:`upstream_events`)."""


def upstream_events(asset_events: Iterable[Any], after: Collection[str]) -> list[dict[str, Any]]:
    """One event per distinct partition that the asset events of ``after`` (other pipelines'
    published data: :attr:`~cascade.pipeline_spec.Pipeline.after`) name in their ``ds``, so
    the claim step deals them out one partition per run as it deals Kafka events.

    Each is a ``cascade.data.landed`` event (dataset: the asset's URI, source: the pipeline
    that published it) with the id ``after:DS``: an id per partition, not per asset event, so
    an upstream that publishes a partition again finds it claimed by the run that built it and
    starts no second build. Asset events of other assets, or without a valid ``ds``, give none.
    """
    found: dict[str, dict[str, Any]] = {}
    for asset_event in asset_events:
        uri = getattr(getattr(asset_event, "asset", None), "uri", None)
        extra = getattr(asset_event, "extra", None) or {}
        ds = extra.get("ds") if isinstance(extra, Mapping) else None
        if uri not in after or not isinstance(ds, str) or UPSTREAM_ID_PREFIX + ds in found:
            continue
        source = extra.get("pipeline")
        try:
            event = Event(
                id=UPSTREAM_ID_PREFIX + ds,
                type=TOPIC_DATA_LANDED,
                time=getattr(asset_event, "timestamp", None) or dt.datetime.now(dt.UTC),
                source=source if isinstance(source, str) and source else "airflow",
                payload={"dataset": uri, "partition": ds},
            )
            found[event.id] = json.loads(parse_event(event.model_dump_json()).model_dump_json())
        except (InvalidEvent, ValueError) as exc:  # pydantic's errors are ValueErrors
            log.warning("asset event of %s names no partition to build (%s): ignored", uri, exc)
    return list(found.values())


def future_partition(ds: str, today: dt.date) -> str | None:
    """Why ``ds`` cannot be built yet because its day lies ahead (None when it does not)."""
    if dt.date.fromisoformat(ds) <= today:
        return None
    return (
        f"partition {ds} is in the future (today is {today} UTC): nothing can have landed for "
        "it yet; publish the event once its data has landed"
    )


def _dead_letter(
    ledger: ClaimLedger,
    dag_id: str,
    doomed: Sequence[tuple[dict[str, Any], str, str]],
    sink: DeadLetterSink | None,
) -> dict[str, str]:
    """Dead-letter ``(event, kind, reason)``: the records go to ``sink`` first, then the ledger
    marks the events so no run claims them; returns event id -> reason of those marked. A sink
    that fails leaves the events unclaimed (logged), never the run failed."""
    if not doomed:
        return {}
    consumer = f"claim:{dag_id}"[:MAX_NAME_CHARS]
    records = [
        dead_letter_event(_body(event), InvalidEvent(reason, kind=kind), consumer=consumer)
        for event, kind, reason in doomed
    ]
    try:
        if sink is not None:
            sink(records)
    except Exception as exc:  # the broker client raises its own errors
        log.warning(
            "could not dead-letter %d event(s) (%s); they stay unclaimed and the next claim "
            "tries again",
            len(records),
            exc,
        )
        return {}
    marked = set(ledger.dead_letter(dag_id, [event for event, _, _ in doomed]))
    reasons = {str(event["id"]): reason for event, _, reason in doomed if event["id"] in marked}
    for event_id, reason in reasons.items():
        log.warning("dead-lettered event %s: %s", event_id, reason)
    return reasons


def claim_run_events(
    *,
    dag_id: str,
    run_id: str,
    triggering_extras: Iterable[Any],
    recent: RecentEvents | None,
    ledger: ClaimLedger,
    config: CoalesceConfig,
    partition: str | None = None,
    default_partition: str | None = None,
    unbuildable: Unbuildable | None = None,
    dead_letter: DeadLetterSink | None = None,
    upstream: Sequence[Mapping[str, Any]] = (),
    today: dt.date | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Claim:
    """Claim the events of one partition for the run, out of its triggering events, every
    unclaimed event the asset received (after the burst went quiet) and every event the ledger
    keeps (failed runs gave them back, or earlier runs kept them; however old). ``recent=None``
    skips the coalescing wait.

    - ``upstream`` (:func:`upstream_events`: the partitions other pipelines published) are kept
      in the ledger first (:meth:`ClaimLedger.keep`), since no asset re-reads them: those this
      run does not take wait there for the runs :attr:`Claim.pending` queues. One whose
      partition a run of this DAG built (or is building) is taken, never built again.

    - Events that are not valid today are not claimed (:attr:`Claim.refused` says why).
    - An event without a partition counts as ``default_partition`` (the run's own date).
    - An event whose partition cannot be built (after ``today``, or ``unbuildable`` gives a
      reason), and one that :attr:`CoalesceConfig.max_releases` failed runs gave back, is
      dead-lettered through ``dead_letter`` with its reason and never claimed.
    - A run with a fixed ``partition`` (a scheduled run's date, a backfill's ``ds``, an
      upstream pipeline's partition) claims only that partition's events. Any other run keeps
      the partition it claimed on an earlier try, or takes the oldest partition waiting (those
      no failed run gave back first, so retries never hold up new data).
    - :attr:`Claim.pending` lists the other partitions still waiting, each another run's work.
    """
    events = [e for e in map(event_from_extra, triggering_extras) if e is not None]
    if upstream:
        kept = ledger.keep(dag_id=dag_id, run_id=run_id, events=upstream)
        log.info("upstream partitions kept for a run: %s", sorted(kept))
        events.extend(dict(event) for event in upstream)
    if recent is not None:
        for _ts, extra in wait_until_quiet(recent, config, sleep=sleep):
            event = event_from_extra(extra)
            if event is not None:
                events.append(event)
    retries = ledger.released(dag_id)
    events.extend(released.event for released in retries.values())
    valid, refused = checked_events(events)
    for event_id, why in refused.items():
        log.warning("not claiming event %s: %s", event_id, why)
    unique = _unique_events(valid)
    owners = ledger.owners(dag_id)
    own = ledger.run_events(dag_id, run_id)
    result = Claim(run_id=run_id, refused=refused)
    result.taken = {i: owners[i] for i in unique if owners.get(i, run_id) != run_id}

    def partition_of(event: Mapping[str, Any]) -> str | None:
        return event_partition(event) or default_partition

    groups: dict[str | None, list[dict[str, Any]]] = {}
    for event_id, event in unique.items():
        if event_id not in owners:
            groups.setdefault(partition_of(event), []).append(event)
    today = today or dt.datetime.now(dt.UTC).date()
    doomed: list[tuple[dict[str, Any], str, str]] = []
    for ds in list(groups):
        reason: str | None = None if ds is None else future_partition(ds, today)
        named = [where for event in groups[ds] if (where := named_path(event))]
        if ds is not None and reason is None and named:
            # The batch is elsewhere: the first step lands it from there (cascade.landing).
            if not any(Path(where).exists() for where in named):
                reason = (
                    f"nothing to land for ds={ds}: {named[0]} does not exist; publish the "
                    "event once the batch is there"
                )
        elif ds is not None and reason is None and unbuildable is not None:
            try:
                reason = unbuildable(ds)
            except Exception as exc:  # a check that cannot look decides nothing
                log.warning("cannot check partition %s (%s); its events wait", ds, exc)
                del groups[ds]
                continue
        if reason is not None:
            doomed += [(event, DEAD_LETTER_UNBUILDABLE, reason) for event in groups.pop(ds)]
            continue
        for event in list(groups[ds]):
            released = retries.get(str(event["id"]))
            if released is not None and released.releases >= config.max_releases:
                groups[ds].remove(event)
                doomed.append(
                    (
                        event,
                        DEAD_LETTER_RETRIES,
                        f"{released.releases} runs failed on partition {ds} (the last "
                        f"{released.last_run_id}); see that run's logs, fix the cause and "
                        "publish the event again",
                    )
                )
        if not groups[ds]:
            del groups[ds]
    result.dead_lettered = _dead_letter(ledger, dag_id, doomed, dead_letter)

    def retried(ds: str | None) -> int:
        return max(
            (retries[str(e["id"])].releases for e in groups[ds] if str(e["id"]) in retries),
            default=0,
        )

    if own:
        candidates: list[str | None] = [partition_of(own[0])]
        result.reclaimed = own
    elif partition is not None:
        candidates = [partition]
    else:
        candidates = sorted(groups, key=lambda ds: (retried(ds), ds or ""))
    for ds in candidates:
        claimed = ledger.claim(dag_id=dag_id, run_id=run_id, events=groups.get(ds, []))
        result.taken.update(claimed.taken)
        result.new = claimed.new
        if claimed.new or own or partition is not None:
            result.partition = ds
            break
    result.pending = sorted(ds for ds in groups if ds is not None and ds != result.partition)
    return result


def _publish_dead_letters(settings: Settings) -> DeadLetterSink:
    def sink(records: Sequence[Event]) -> None:
        from cascade.broker import publish_many

        publish_many(list(records), settings=settings, timeout_s=10.0)

    return sink


def run_partition(dag_run: Any, *, lag_days: int = 0) -> str:
    """A DAG run's own partition (:func:`cascade.partitions.own_partition`)."""
    from cascade.partitions import own_partition

    return own_partition(
        getattr(dag_run, "logical_date", None),
        getattr(dag_run, "run_after", None),
        lag_days=lag_days,
    )


def claim_for_run(
    context: Mapping[str, Any],
    asset: Any,
    *,
    partition: str | None = None,
    lag_days: int = 0,
    unbuildable: Unbuildable | None = None,
    after: Collection[str] = (),
    coalesce: bool = True,
    settings: Settings | None = None,
    config: CoalesceConfig | None = None,
) -> Claim:
    """Claim the events of one partition for the running Airflow task's DAG run (``asset``
    must be an inlet): ``partition`` when the run has one of its own, else the oldest waiting
    (:func:`claim_run_events`). The partitions that the triggering events of the ``after``
    assets name count as events too (:func:`upstream_events`). ``coalesce`` waits for the
    asset's burst to go quiet (an asset no watcher feeds has no burst). Events whose partition
    cannot be built are dead-lettered on the broker's dead-letter topic, as the watchers' are.
    The partitions still waiting are left in the task's XCom :data:`PENDING_XCOM_KEY` for the
    task that queues the next run.

    Raises Airflow's skip exception when an asset-triggered run has nothing left to claim: its
    events were redelivered copies or were coalesced into another run, so its work is done."""
    from airflow.sdk.exceptions import AirflowSkipException

    settings = settings or load_settings()
    config = config or coalesce_config_from_env()
    dag_run = context["dag_run"]
    triggering = context.get("triggering_asset_events") or {}
    asset_events = [event for batch in triggering.values() for event in batch]
    extras = [event.extra for event in asset_events]

    # The first read covers the lookback; later reads only the last REREAD_S (events can commit
    # a little after their timestamp), merged by asset event id: re-reading thousands of
    # events every poll through the one API server slowed it down for every task.
    seen: dict[Any, tuple[dt.datetime, Any]] = {}
    newest: list[dt.datetime] = []

    def recent(since: dt.datetime) -> list[tuple[dt.datetime, Any]]:
        start = max(since, newest[0] - dt.timedelta(seconds=REREAD_S)) if newest else since
        for event in context["inlet_events"][asset].after(start.isoformat()):
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
        recent=recent if coalesce else None,
        ledger=ClaimLedger.for_settings(settings),
        config=config,
        partition=partition,
        default_partition=run_partition(dag_run, lag_days=lag_days),
        unbuildable=unbuildable,
        dead_letter=_publish_dead_letters(settings),
        upstream=upstream_events(asset_events, after),
    )
    log.info(
        "run %s claimed %d new event(s), %d from an earlier try, of partition %s; %d owned by "
        "other runs; %d invalid, not claimed; %d dead-lettered; partitions waiting: %s",
        dag_run.run_id,
        len(claim.new),
        len(claim.reclaimed),
        claim.partition,
        len(claim.taken),
        len(claim.refused),
        len(claim.dead_lettered),
        claim.pending,
    )
    ti = context.get("ti")
    if ti is not None:
        ti.xcom_push(key=PENDING_XCOM_KEY, value=claim.pending)
    if not claim.has_work and str(dag_run.run_type) in (
        "asset_triggered",
        "DagRunType.ASSET_TRIGGERED",
    ):
        owners = sorted(set(claim.taken.values()))
        raise AirflowSkipException(
            f"nothing to do: {len(claim.taken)} triggering event(s) already claimed by "
            f"{owners[:5]} (redelivered, coalesced, or their partition built by that run), "
            f"{len(claim.refused)} invalid, "
            f"{len(claim.dead_lettered)} dead-lettered (their partition cannot be built)"
        )
    return claim


def release_failed_run(context: Mapping[str, Any]) -> None:
    """DAG and task ``on_failure_callback``: a failed run gives its events back. The ledger
    keeps them (with their bodies and how many runs gave them back), so a later run of the DAG
    retries them however old they are; :attr:`CoalesceConfig.max_releases` releases and the
    next claim dead-letters them instead. A run that failed after partly working redoes that
    work, which the idempotent tasks allow. Releasing when a task fails for good (not only when
    the run is marked failed) lets the run already queued after this one see them."""
    dag_run = context["dag_run"]
    released = ClaimLedger.for_settings().release(dag_id=dag_run.dag_id, run_id=dag_run.run_id)
    if released:
        log.warning("run %s failed: released %d event(s) for a later run", dag_run.run_id, released)


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
