"""Cascade's events: small versioned JSON envelopes, validated on the way in and out.

    cascade events publish cascade.data.landed --dataset ml100k --partition 2026-11-22

:class:`Event` is the envelope (id, type, schema version, time, source, payload); each type's
payload has a schema. A message that fails them raises :class:`InvalidEvent` and becomes a
dead-letter record (:func:`dead_letter_event`). The broker side is :mod:`cascade.broker`, the
Airflow watcher :mod:`cascade.event_trigger`, the claim ledger :mod:`cascade.event_ledger`.

Delivery, end to end:

1. Producers send with ``acks=all`` and retries; the key is the event id.
2. :class:`~cascade.event_trigger.CascadeEventTrigger` (Airflow 3.3's ``KafkaSharedStreamTrigger``)
   reads the watched topics through one shared consumer; the offset is committed only after the
   asset event is stored (the connection sets ``enable.auto.commit=false``). A crash redelivers,
   never drops.
3. A malformed, unknown or unsupported event is published to ``cascade.dead-letter`` with its
   reason and rejected, so the trigger never raises and the event is never retried forever.
4. The first task of a run claims the event ids in
   :class:`~cascade.event_ledger.EventLedger` (primary key: DAG + event id). A redelivered
   event, or one already taken by a coalescing run, is not claimed again; a run that claims
   nothing does no work (its tasks are skipped).
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
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cascade.assets import (
    TOPIC_DATA_LANDED,
    TOPIC_DEAD_LETTER,
    TOPIC_DRIFT_DETECTED,
    TOPIC_MODEL_DEPLOYED,
    TOPIC_RETRAIN_REQUESTED,
    TOPICS,
)

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
