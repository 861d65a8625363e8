"""Versioned event schemas, the producer, the dead-letter path, the Airflow watcher trigger and
the ledger that makes at-least-once delivery exactly-once in effect.

Publish from the shell::

    cascade events publish cascade.data.landed --dataset ml100k --partition 2026-11-22

Delivery, end to end:

1. Producers send with ``acks=all`` and retries; the key is the event id.
2. :class:`CascadeEventTrigger` (Airflow 3.3's ``KafkaSharedStreamTrigger``) reads the watched
   topics through one shared consumer; the offset is committed only after the asset event is
   stored (the connection sets ``enable.auto.commit=false``). A crash redelivers, never drops.
3. A malformed, unknown or unsupported event is published to ``cascade.dead-letter`` with its
   reason and rejected, so the trigger never raises and the event is never retried forever.
4. The first task of a run claims the event ids in :class:`EventLedger` (primary key: DAG +
   event id). A redelivered event, or one already taken by a coalescing run, is not claimed
   again; a run that claims nothing does no work (its tasks are skipped).
5. Bursts coalesce: the claiming task waits until the asset has been quiet for
   ``CoalesceConfig.window_s`` (at most ``max_wait_s``) and then claims every unclaimed event of
   the asset, including those that Airflow queued for later runs. Those later runs find their
   events claimed and skip, so a burst with no gap longer than the window is one run of work.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cascade.assets import (
    EVENT_TRIGGER,
    TOPIC_DATA_LANDED,
    TOPIC_DEAD_LETTER,
    TOPIC_DRIFT_DETECTED,
    TOPIC_MODEL_DEPLOYED,
    TOPIC_RETRAIN_REQUESTED,
    TOPICS,
)
from cascade.config import Settings, load_settings

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""The version producers write today; consumers accept every version in :data:`SCHEMAS`."""

RAW_KEEP_CHARS = 4096
"""How much of a dead-lettered message is kept (the whole message is rarely needed to debug)."""


class Event(BaseModel):
    """Envelope shared by every event: small, versioned JSON on the control plane."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(default_factory=lambda: uuid.uuid4().hex, min_length=1)
    type: str
    schema_version: int = Field(default=SCHEMA_VERSION, ge=1)
    time: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))
    source: str = Field(default="cascade-cli", min_length=1)
    payload: dict[str, Any] = Field(default_factory=dict)


class DataLanded(BaseModel):
    """``cascade.data.landed`` v1: a partition of a dataset is in the lake."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(min_length=1)
    partition: dt.date
    path: str | None = None


class RetrainRequested(BaseModel):
    """``cascade.retrain.requested`` v1: retrain a model (from the monitor or a person)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    reason: str = Field(min_length=1)
    partition: dt.date | None = None
    caused_by: list[str] = Field(default_factory=list)
    """Ids of the events (e.g. drift) that led to the request."""


class DriftDetected(BaseModel):
    """``cascade.drift.detected`` v1: the monitor saw a threshold crossed on a serving day."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    partition: dt.date
    max_psi: float = Field(ge=0)
    psi_threshold: float = Field(gt=0)
    drifted_features: dict[str, float] = Field(default_factory=dict)
    online_auc: float | None = Field(default=None, ge=0, le=1)
    auc_floor: float | None = Field(default=None, ge=0, le=1)


class ModelDeployed(BaseModel):
    """``cascade.model.deployed`` v1: an alias now points at a version the server follows."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    alias: str = Field(min_length=1)
    version: str = Field(min_length=1)
    previous_version: str | None = None
    reason: Literal["promotion", "rollback", "automatic-rollback"] = "promotion"


class DeadLetter(BaseModel):
    """``cascade.dead-letter`` v1: a message no consumer could accept, and why."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(min_length=1)
    """Short class of the reason, for counting: not-json, bad-envelope, unknown-type, ..."""
    reason: str = Field(min_length=1)
    fingerprint: str = Field(min_length=1)
    """sha256 of the raw message: a redelivered bad message has the same fingerprint."""
    raw: str
    """The message as text (first :data:`RAW_KEEP_CHARS` characters; undecodable bytes escaped)."""
    consumer: str = Field(min_length=1)


SCHEMAS: dict[tuple[str, int], type[BaseModel]] = {
    (TOPIC_DATA_LANDED, 1): DataLanded,
    (TOPIC_RETRAIN_REQUESTED, 1): RetrainRequested,
    (TOPIC_DRIFT_DETECTED, 1): DriftDetected,
    (TOPIC_MODEL_DEPLOYED, 1): ModelDeployed,
    (TOPIC_DEAD_LETTER, 1): DeadLetter,
}
"""(event type, schema version) -> payload model. A new version is a new entry; old ones stay
until no producer writes them."""
PAYLOADS: dict[str, type[BaseModel]] = {
    event_type: model for (event_type, version), model in SCHEMAS.items() if version == 1
}


def json_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schema of every (type, version) payload, keyed ``TYPE/vN``, for non-Python clients."""
    envelope = Event.model_json_schema()
    return {"envelope": envelope} | {
        f"{event_type}/v{version}": model.model_json_schema()
        for (event_type, version), model in SCHEMAS.items()
    }


class InvalidEvent(ValueError):
    """A message that is not a valid Cascade event; the reason says what is wrong."""

    def __init__(self, reason: str, *, kind: str = "invalid") -> None:
        super().__init__(reason)
        self.kind = kind


def parse_event(raw: bytes | str) -> Event:
    """Decode and validate one message value; raises :class:`InvalidEvent` with the reason."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidEvent(f"not JSON: {exc}", kind="not-json") from exc
    try:
        event = Event.model_validate(data)
    except ValidationError as exc:
        raise InvalidEvent(
            f"bad envelope: {exc.errors(include_url=False)}", kind="bad-envelope"
        ) from exc
    if event.type not in TOPICS:
        raise InvalidEvent(
            f"unknown event type {event.type!r}; known: {', '.join(TOPICS)}", kind="unknown-type"
        )
    payload_model = SCHEMAS.get((event.type, event.schema_version))
    if payload_model is None:
        known = sorted(v for (t, v) in SCHEMAS if t == event.type)
        raise InvalidEvent(
            f"bad envelope: {event.type} has no schema_version {event.schema_version} "
            f"(this consumer reads {known}); publish a supported version or upgrade the consumer",
            kind="unsupported-version",
        )
    try:
        payload_model.model_validate(event.payload)
    except ValidationError as exc:
        raise InvalidEvent(
            f"bad {event.type} payload: {exc.errors(include_url=False)}", kind="bad-payload"
        ) from exc
    return event


def make_event(event_type: str, payload: dict[str, Any], *, source: str = "cascade-cli") -> Event:
    if event_type not in TOPICS:
        raise InvalidEvent(
            f"unknown event type {event_type!r}; known: {', '.join(TOPICS)}", kind="unknown-type"
        )
    event = Event(type=event_type, payload=payload, source=source)
    return parse_event(event.model_dump_json())


def _producer(settings: Settings) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        acks="all",
        retries=5,
        linger_ms=5,
        key_serializer=str.encode,
        value_serializer=str.encode,
    )


def publish(
    event: Event, *, settings: Settings | None = None, timeout_s: float = 10.0
) -> dict[str, Any]:
    """Send one event to the topic named by its type; acks=all, retried. Returns where it landed."""
    return publish_many([event], settings=settings, timeout_s=timeout_s)[0]


def publish_many(
    events: Sequence[Event], *, settings: Settings | None = None, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    """Send events through one producer (acks=all, retried); returns where each landed."""
    settings = settings or load_settings()
    producer = _producer(settings)
    try:
        futures = [
            producer.send(event.type, key=event.id, value=event.model_dump_json())
            for event in events
        ]
        producer.flush(timeout=timeout_s)
        metas = [future.get(timeout=timeout_s) for future in futures]
    finally:
        producer.close(timeout=timeout_s)
    return [
        {"id": e.id, "topic": m.topic, "partition": m.partition, "offset": m.offset}
        for e, m in zip(events, metas, strict=True)
    ]


def ensure_topics(settings: Settings | None = None) -> list[str]:
    """Create the Cascade topics that do not exist yet; returns the ones created."""
    from kafka.admin import KafkaAdminClient, NewTopic

    settings = settings or load_settings()
    admin = KafkaAdminClient(bootstrap_servers=settings.bootstrap_servers, request_timeout_ms=10000)
    try:
        existing = set(admin.list_topics())
        missing = [t for t in TOPICS if t not in existing]
        if missing:
            admin.create_topics(
                [NewTopic(t, num_partitions=1, replication_factor=1) for t in missing]
            )
        return missing
    finally:
        admin.close()


def to_asset_event(message: Any) -> dict[str, Any] | None:
    """``apply_function`` for Airflow's plain ``MessageQueueTrigger``: the return value becomes
    the asset event's extra. Invalid messages are logged and skipped (None), never raised: an
    exception here would kill the trigger. (The DAGs use :class:`CascadeEventTrigger`.)"""
    raw = message.value() if callable(getattr(message, "value", None)) else message
    try:
        event = parse_event(raw)
    except InvalidEvent as exc:
        log.warning("skipping invalid event: %s", exc)
        return None
    return json.loads(event.model_dump_json())


# --- dead letters ---------------------------------------------------------------------------


def dead_letter_event(raw: bytes | str, error: InvalidEvent, *, consumer: str) -> Event:
    """The dead-letter record of one rejected message (reason, class of reason, fingerprint)."""
    raw_bytes = raw if isinstance(raw, bytes) else str(raw).encode("utf-8", "backslashreplace")
    fingerprint = hashlib.sha256(raw_bytes).hexdigest()
    text = raw_bytes.decode("utf-8", "backslashreplace")[:RAW_KEEP_CHARS]
    payload = DeadLetter(
        kind=error.kind,
        reason=str(error)[:2000],
        fingerprint=fingerprint,
        raw=text,
        consumer=consumer,
    )
    # The id derives from the fingerprint and consumer so a redelivered bad message yields the
    # same dead-letter id and DLQ readers can drop the repeat.
    return Event(
        id=f"dl-{fingerprint[:32]}-{hashlib.sha1(consumer.encode()).hexdigest()[:8]}",
        type=TOPIC_DEAD_LETTER,
        source=consumer,
        payload=payload.model_dump(),
    )


def read_topic(
    topic: str, *, settings: Settings | None = None, timeout_s: float = 10.0
) -> list[tuple[int, str | None, bytes]]:
    """Every message of ``topic`` as (offset, key, value), read without a consumer group."""
    from kafka import KafkaConsumer, TopicPartition

    settings = settings or load_settings()
    consumer = KafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        enable_auto_commit=False,
        consumer_timeout_ms=int(timeout_s * 1000),
    )
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return []
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: list[tuple[int, str | None, bytes]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    key = record.key.decode() if record.key is not None else None
                    out.append((record.offset, key, record.value))
        return out
    finally:
        consumer.close()


def dead_letter_summary(
    settings: Settings | None = None, *, timeout_s: float = 10.0
) -> dict[str, Any]:
    """Count the dead-letter topic by reason class; repeats of one bad message count once in
    ``distinct`` (redelivery after a crash may dead-letter a message twice)."""
    by_kind: dict[str, int] = {}
    ids: set[str] = set()
    fingerprints: set[str] = set()
    total = 0
    for _offset, _key, value in read_topic(
        TOPIC_DEAD_LETTER, settings=settings, timeout_s=timeout_s
    ):
        total += 1
        try:
            event = parse_event(value)
            kind = str(event.payload["kind"])
            fingerprints.add(str(event.payload["fingerprint"]))
            ids.add(event.id)
        except InvalidEvent:
            kind = "unreadable-dead-letter"
        by_kind[kind] = by_kind.get(kind, 0) + 1
    return {"messages": total, "distinct": len(ids), "by_kind": by_kind}


# --- the watcher trigger ----------------------------------------------------------------------


class Selector(NamedTuple):
    """``TYPE`` or ``TYPE:field=value``: which events a watcher passes on."""

    event_type: str
    field: str | None
    value: str | None


def parse_selector(text: str) -> Selector:
    event_type, _, condition = text.partition(":")
    if event_type not in TOPICS:
        raise ValueError(f"selector {text!r}: unknown event type; one of {', '.join(TOPICS)}")
    if not condition:
        return Selector(event_type, None, None)
    name, sep, value = condition.partition("=")
    if not sep or not name or not value:
        raise ValueError(f"selector {text!r}: write TYPE or TYPE:payload_field=value")
    return Selector(event_type, name, value)


def event_matches(event: Event, selectors: Iterable[str]) -> bool:
    for selector in map(parse_selector, selectors):
        if event.type != selector.event_type:
            continue
        if selector.field is None or str(event.payload.get(selector.field)) == selector.value:
            return True
    return False


class Route(NamedTuple):
    """What a watcher does with one message."""

    action: Literal["fire", "skip", "dead-letter"]
    event: Event | None
    error: InvalidEvent | None


def route_message(raw: bytes | str, selectors: Sequence[str]) -> Route:
    """Fire for a valid event a selector matches, skip other valid events, dead-letter the rest."""
    try:
        event = parse_event(raw)
    except InvalidEvent as exc:
        return Route("dead-letter", None, exc)
    if event_matches(event, selectors):
        return Route("fire", event, None)
    return Route("skip", event, None)


_trigger_class: type | None = None


def _build_trigger_class() -> type:
    """Define the trigger on first use: it subclasses an Airflow provider class, and importing
    Airflow in every ``cascade`` command (publish, score) would cost seconds for nothing."""
    from airflow.providers.apache.kafka.triggers.shared_stream import KafkaSharedStreamTrigger
    from airflow.triggers.base import TriggerEvent
    from airflow.triggers.shared_stream import reject_shared_stream_event
    from asgiref.sync import sync_to_async

    class CascadeEventTrigger(KafkaSharedStreamTrigger):
        """``KafkaSharedStreamTrigger`` that validates Cascade events, fires for the selected
        ones and dead-letters invalid ones with their reason.

        All watchers name the same topics, so they share one consumer; each sees every
        message. Only the watcher with ``dead_letter=True`` publishes dead letters (one
        record per bad message); the others skip invalid messages.
        """

        def __init__(
            self,
            *,
            topics: Sequence[str],
            kafka_config_id: str = "kafka_default",
            poll_timeout: float = 1.0,
            selectors: Sequence[str] = (),
            dead_letter: bool = False,
            name: str = "cascade-watcher",
        ) -> None:
            # dlq_topic stays None: the provider would re-publish the raw bytes without a
            # reason; we publish a DeadLetter event (reason, kind, fingerprint) ourselves.
            super().__init__(
                topics=topics, kafka_config_id=kafka_config_id, poll_timeout=poll_timeout
            )
            for selector in selectors:
                parse_selector(selector)
            self.selectors = list(selectors)
            self.dead_letter = dead_letter
            self.name = name
            self.dead_letters: dict[str, int] = {}
            self._dl_producer: Any = None

        def serialize(self) -> tuple[str, dict[str, Any]]:
            return (
                EVENT_TRIGGER,
                {
                    "topics": self.topics,
                    "kafka_config_id": self.kafka_config_id,
                    "poll_timeout": self.poll_timeout,
                    "selectors": self.selectors,
                    "dead_letter": self.dead_letter,
                    "name": self.name,
                },
            )

        @classmethod
        def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> Any:
            return KafkaSharedStreamTrigger.create_shared_stream_producer(
                {**kwargs, "dlq_topic": None}
            )

        def _publish_dead_letter(self, record: Event) -> None:
            if self._dl_producer is None:
                from airflow.providers.apache.kafka.hooks.produce import KafkaProducerHook

                self._dl_producer = KafkaProducerHook(
                    kafka_config_id=self.kafka_config_id
                ).get_producer()
            self._dl_producer.produce(
                TOPIC_DEAD_LETTER, key=record.id.encode(), value=record.model_dump_json().encode()
            )
            # Flushed before the reject lets the offset be committed past the bad message.
            remaining = self._dl_producer.flush(30)
            if remaining:
                raise RuntimeError(f"{remaining} dead letter(s) not acknowledged in 30 s")

        async def filter_shared_stream(self, shared_stream: Any) -> Any:
            async for value in shared_stream:
                route = route_message(value, self.selectors)
                if route.action == "fire":
                    assert route.event is not None
                    yield TriggerEvent(json.loads(route.event.model_dump_json()))
                    continue
                if route.action == "skip" or not self.dead_letter:
                    continue
                assert route.error is not None
                record = dead_letter_event(value, route.error, consumer=self.name)
                try:
                    await sync_to_async(self._publish_dead_letter)(record)
                except Exception:
                    # Never raise out of the filter (that would fail every watcher on the
                    # shared consumer); the message is logged in full and rejected anyway.
                    log.exception("could not dead-letter %s: %s", record.id, record.payload)
                kind = route.error.kind
                self.dead_letters[kind] = self.dead_letters.get(kind, 0) + 1
                log.warning(
                    "dead-lettered %s (%s): %s; dead letters so far by kind: %s",
                    record.id,
                    kind,
                    route.error,
                    self.dead_letters,
                )
                reject_shared_stream_event()

    CascadeEventTrigger.__module__ = __name__
    return CascadeEventTrigger


def __getattr__(name: str) -> Any:
    # Module-level __getattr__ (PEP 562) so ``cascade.events.CascadeEventTrigger`` resolves for
    # the triggerer's import_string while plain users of this module never import Airflow.
    global _trigger_class
    if name == "CascadeEventTrigger":
        if _trigger_class is None:
            _trigger_class = _build_trigger_class()
        return _trigger_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- exactly-once in effect: the claim ledger ------------------------------------------------


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

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.new + self.reclaimed

    @property
    def has_work(self) -> bool:
        return bool(self.new or self.reclaimed)


class EventLedger:
    """Which run owns which event, per DAG: SQLite in the state folder (a shared database in
    the cluster profile). The primary key makes a second claim of an event impossible."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS claims (dag_id TEXT NOT NULL, event_id TEXT NOT NULL,"
                " run_id TEXT NOT NULL, event_type TEXT, event_time TEXT, claimed_at TEXT,"
                " PRIMARY KEY (dag_id, event_id))"
            )

    @classmethod
    def for_settings(cls, settings: Settings | None = None) -> EventLedger:
        settings = settings or load_settings()
        return cls(settings.home / "events" / "ledger.sqlite")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60, isolation_level=None)

    def claim(self, *, dag_id: str, run_id: str, events: Iterable[Mapping[str, Any]]) -> Claim:
        unique: dict[str, dict[str, Any]] = {}
        for event in events:
            unique.setdefault(str(event["id"]), dict(event))
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
        """Forget a run's claims (it failed); returns how many events were released."""
        with self._connect() as db:
            return db.execute(
                "DELETE FROM claims WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)
            ).rowcount

    def claimed_at(self, dag_id: str) -> dict[str, dt.datetime]:
        """Event id -> when a run claimed it (the event-to-run moment)."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT event_id, claimed_at FROM claims WHERE dag_id = ?", (dag_id,)
            ).fetchall()
        return {event_id: dt.datetime.fromisoformat(at) for event_id, at in rows}

    def owners(self, dag_id: str) -> dict[str, str]:
        """Event id -> run id, for one DAG."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT event_id, run_id FROM claims WHERE dag_id = ?", (dag_id,)
            ).fetchall()
        return dict(rows)


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
    ledger: EventLedger,
    config: CoalesceConfig,
    sleep: Callable[[float], None] = time.sleep,
) -> Claim:
    """Claim the run's triggering events plus every unclaimed event the asset received (after
    the burst went quiet). ``recent=None`` skips the coalescing wait (e.g. no inlet asset)."""
    events = [e for e in map(event_from_extra, triggering_extras) if e is not None]
    if recent is not None:
        for _ts, extra in wait_until_quiet(recent, config, sleep=sleep):
            event = event_from_extra(extra)
            if event is not None:
                events.append(event)
    return ledger.claim(dag_id=dag_id, run_id=run_id, events=events)


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
        ledger=EventLedger.for_settings(settings),
        config=config,
    )
    log.info(
        "run %s claimed %d new event(s), %d from an earlier try; %d owned by other runs",
        dag_run.run_id,
        len(claim.new),
        len(claim.reclaimed),
        len(claim.taken),
    )
    if not claim.has_work and str(dag_run.run_type) in (
        "asset_triggered",
        "DagRunType.ASSET_TRIGGERED",
    ):
        owners = sorted(set(claim.taken.values()))
        raise AirflowSkipException(
            f"nothing to do: {len(claim.taken)} triggering event(s) already claimed by "
            f"{owners[:5]} (redelivered or coalesced)"
        )
    return claim


def release_failed_run(context: Mapping[str, Any]) -> None:
    """DAG ``on_failure_callback``: a failed run gives its events back, so the next run (its
    lookback reads unclaimed events) does their work instead of them being owned by a run
    that never finished. A run that failed after partly working redoes that work, which the
    idempotent tasks allow."""
    dag_run = context["dag_run"]
    released = EventLedger.for_settings().release(dag_id=dag_run.dag_id, run_id=dag_run.run_id)
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
) -> Path:
    """Write which events a run did its work for: one file per run, overwritten on retry, so
    the file set is the accounting of every event id (lost = published minus these)."""
    settings = settings or load_settings()
    safe_run = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
    path = settings.home / "events" / "work" / dag_id / f"{safe_run}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"dag_id": dag_id, "run_id": run_id, "event_ids": list(event_ids)}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(path)
    return path


def work_record_paths(dag_id: str, *, settings: Settings | None = None) -> dict[str, Path]:
    """Run id -> its work record file."""
    settings = settings or load_settings()
    folder = settings.home / "events" / "work" / dag_id
    return {json.loads(p.read_text())["run_id"]: p for p in sorted(folder.glob("*.json"))}


def work_records(dag_id: str, *, settings: Settings | None = None) -> dict[str, list[str]]:
    """Run id -> event ids it did work for (see :func:`record_work`)."""
    settings = settings or load_settings()
    folder = settings.home / "events" / "work" / dag_id
    out: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*.json")):
        body = json.loads(path.read_text())
        out[body["run_id"]] = body["event_ids"]
    return out
