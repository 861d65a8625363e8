"""Exactly-once in effect: the claim ledger of event ids per DAG and the work records by
which every event id is accounted for.

The ledger is SQLite in the state folder in the ``local`` profile (:class:`EventLedger`) and a
PostgreSQL table in the ``cluster`` profile (:class:`PostgresEventLedger`), shared by every
Airflow worker and the triggerer; :meth:`ClaimLedger.for_settings` picks the profile's. Both
make a second claim of an event impossible with the table's primary key (DAG, event id).
How a DAG run gathers and claims its events is :mod:`cascade.event_claims`."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from cascade.config import Settings, load_settings

log = logging.getLogger(__name__)


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
        (:func:`cascade.event_claims.upstream_events`). An event a run owns stays that run's
        (its partition is built or being built: a repeat builds nothing); one dead-lettered
        before, or given back by failed runs, waits again with a fresh count (its upstream
        published it again, as a dead letter's advice asks). Returns the ids kept."""

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


def unique_events(events: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    unique: dict[str, dict[str, Any]] = {}
    for event in events:
        unique.setdefault(str(event["id"]), dict(event))
    return unique


def event_body(event: Mapping[str, Any]) -> str:
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
        unique = unique_events(events)
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
                        event_body(event),
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
            for event_id, event in unique_events(events).items():
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
                    (dag_id, event_id, event_body(event), run_id, now),
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

        unique = unique_events(events)
        result = Claim(run_id=run_id)
        if not unique:
            return result
        rows = [
            (dag_id, event_id, run_id, event.get("type"), str(event.get("time")), event_body(event))
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

        unique = unique_events(events)
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
            rows = [(dag_id, i, event_body(unique[i]), 0, run_id) for i in ids if i not in owned]
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
