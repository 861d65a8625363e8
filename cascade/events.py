"""Cascade's events: small versioned JSON envelopes, validated on the way in and out.

    cascade events publish cascade.data.landed --dataset impressions --partition 2026-11-22

:class:`Event` is the envelope (id, type, schema version, time, source, payload); each type's
payload has a schema. A message that fails them raises :class:`InvalidEvent` and becomes a
dead-letter record (:func:`dead_letter_event`). The broker side is :mod:`cascade.broker`, the
Airflow watcher :mod:`cascade.event_trigger`, the claim ledger :mod:`cascade.event_ledger`
(claimed per run by :mod:`cascade.event_claims`).

Delivery, end to end:

1. Producers send with ``acks=all`` and retries; the key is the event id.
2. :class:`~cascade.event_trigger.CascadeEventTrigger` (Airflow 3.3's ``KafkaSharedStreamTrigger``)
   reads the watched topics through one shared consumer; the offset is committed only after the
   asset event is stored (the connection sets ``enable.auto.commit=false``). A crash redelivers,
   never drops.
3. A malformed, unknown, unsupported, oversized or out-of-range event is rejected by the
   dead-lettering watcher; the shared consumer publishes it to ``cascade.dead-letter`` with its
   reason (retried) before it commits the offset, so the trigger never raises, the event never
   reaches a run, and a failed publish leaves the offset uncommitted (it is read again).
4. The first task of a run claims the event ids in
   :class:`~cascade.event_ledger.EventLedger` (primary key: DAG + event id). A redelivered
   event, or one already taken by a coalescing run, is not claimed again; a run that claims
   nothing does no work (its tasks are skipped).
5. Bursts coalesce, one run per partition: the claiming task waits until the asset has been
   quiet for ``CoalesceConfig.window_s`` (at most ``max_wait_s``) and then claims the unclaimed
   events of one partition, including those that Airflow queued for later runs; when other
   partitions wait, the DAG's ``next_partitions`` task queues one more run for them. Runs
   queued for the rest of the burst find their events claimed and skip, so a burst with no gap
   longer than the window is one run of work per partition it names. An event whose partition
   cannot be built (in the future, nothing landed) is dead-lettered at claim time with its
   reason; a failed run's events are kept and retried by a later run, up to
   ``CoalesceConfig.max_releases`` times.

What travels is the validated, normalised event (:func:`parse_event` returns the payload as its
schema dumps it, never the raw dict), within these bounds:

- a message is at most :data:`MAX_EVENT_BYTES`; names and ids at most :data:`MAX_NAME_CHARS`,
  free text :data:`MAX_TEXT_CHARS`, paths :data:`MAX_PATH_CHARS`, lists and maps
  :data:`MAX_ITEMS` entries;
- types are strict: a partition is a ``"YYYY-MM-DD"`` string (not a timestamp number, not
  ``20261122`` or ``2026-W47-1``), counts are integers, not ``true`` or ``"1"``; floats are finite;
- a partition date lies in :data:`PARTITION_MIN` .. today (UTC) + :data:`PARTITION_FUTURE_DAYS`:
  a typo'd or hostile ``9999-12-31`` would otherwise be the newest partition of every
  coalesced burst.

Anything else is an :class:`InvalidEvent` with a ``kind`` (``too-large``, ``not-json``,
``bad-envelope``, ``unknown-type``, ``unsupported-version``, ``bad-payload``) and is
dead-lettered, so it never reaches a run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from cascade.assets import (
    TOPIC_DATA_LANDED,
    TOPIC_DEAD_LETTER,
    TOPIC_DRIFT_DETECTED,
    TOPIC_MODEL_DEPLOYED,
    TOPIC_RETRAIN_REQUESTED,
    TOPIC_RUN_FAILED,
    TOPICS,
)
from cascade.lake import check_ds

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""The version producers write today; consumers accept every version in :data:`SCHEMAS`."""

RAW_KEEP_CHARS = 4096
"""How much of a dead-lettered message is kept (the whole message is rarely needed to debug)."""

MAX_EVENT_BYTES = 64 * 1024
"""Largest message accepted (UTF-8 bytes). Events are small control-plane records; anything
bigger is refused before it is parsed."""
MAX_NAME_CHARS = 128
"""Ids, types, sources, dataset/model/alias/version names, dead-letter kinds."""
MAX_TEXT_CHARS = 2000
"""Free text: a retrain reason, a dead-letter reason."""
MAX_PATH_CHARS = 1024
MAX_ITEMS = 256
"""Entries of any list or map in a payload (``caused_by``, ``drifted_features``)."""
PARTITION_MIN = dt.date(2000, 1, 1)
"""Earliest partition date an event may name."""
PARTITION_FUTURE_DAYS = 2
"""How far past today (UTC) a partition date may lie: time zones ahead of UTC and clock skew,
nothing more."""


def partition_max(today: dt.date | None = None) -> dt.date:
    """The latest partition date an event may name now."""
    return (today or dt.datetime.now(dt.UTC).date()) + dt.timedelta(days=PARTITION_FUTURE_DAYS)


def _partition_date(value: Any) -> dt.date:
    """A partition: the string ``YYYY-MM-DD`` (nothing else), a real day, within range."""
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        value = value.isoformat()
    if not isinstance(value, str):
        raise ValueError(f"a partition is a YYYY-MM-DD string, not {type(value).__name__}")
    day = dt.date.fromisoformat(check_ds(value))
    high = partition_max()
    if not PARTITION_MIN <= day <= high:
        raise ValueError(f"partition {value} is outside {PARTITION_MIN} .. {high}")
    return day


def _event_time(value: Any) -> dt.datetime:
    """The envelope time: an ISO-8601 string (or datetime); naive times are read as UTC."""
    if isinstance(value, str):
        if len(value) > 64:
            raise ValueError("time is longer than 64 characters")
        value = dt.datetime.fromisoformat(value)
    if not isinstance(value, dt.datetime):
        raise ValueError(f"time is an ISO-8601 string, not {type(value).__name__}")
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


PartitionDate = Annotated[dt.date, BeforeValidator(_partition_date)]
EventTime = Annotated[dt.datetime, BeforeValidator(_event_time)]
Name = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_NAME_CHARS)]
EventId = Annotated[
    str,
    StringConstraints(
        strict=True,
        min_length=1,
        max_length=MAX_NAME_CHARS,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$",
    ),
]
Text = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_TEXT_CHARS)]
PathText = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_PATH_CHARS)]
FiniteFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class Event(BaseModel):
    """Envelope shared by every event: small, versioned JSON on the control plane."""

    model_config = ConfigDict(extra="forbid")

    id: EventId = Field(default_factory=lambda: uuid.uuid4().hex)
    type: Name
    schema_version: int = Field(default=SCHEMA_VERSION, ge=1, le=1000, strict=True)
    time: EventTime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))
    source: Name = "cascade-cli"
    payload: dict[str, Any] = Field(default_factory=dict)
    """The type's payload; after :func:`parse_event`, as its schema dumps it (normalised)."""


class DataLanded(BaseModel):
    """``cascade.data.landed`` v1: a partition of a dataset is in the lake."""

    model_config = ConfigDict(extra="forbid")

    dataset: Name
    partition: PartitionDate
    path: PathText | None = None
    """The landed partition's folder (``cascade land`` publishes it), or a batch elsewhere that
    the pipeline's first step lands through the dataset's importer (:mod:`cascade.landing`)."""
    format: Name | None = None
    """The landing format of the batch at ``path`` (guessed from its files when absent)."""
    source: Name | None = None
    """The named source the batch came from (``generated``, ``synthetic``, a log source)."""
    counts: dict[Name, Annotated[int, Field(strict=True, ge=0)]] = Field(
        default_factory=dict, max_length=MAX_ITEMS
    )
    """What the importer counted: rows, quarantined rows, key collisions, ..."""


class RetrainRequested(BaseModel):
    """``cascade.retrain.requested`` v1: retrain a model (from the monitor or a person)."""

    model_config = ConfigDict(extra="forbid")

    model: Name
    reason: Text
    partition: PartitionDate | None = None
    caused_by: list[EventId] = Field(default_factory=list, max_length=MAX_ITEMS)
    """Ids of the events (e.g. drift) that led to the request."""


class DriftDetected(BaseModel):
    """``cascade.drift.detected`` v1: the monitor saw a threshold crossed on a serving day."""

    model_config = ConfigDict(extra="forbid")

    model: Name
    partition: PartitionDate
    max_psi: FiniteFloat = Field(ge=0)
    psi_threshold: FiniteFloat = Field(gt=0)
    drifted_features: dict[Name, FiniteFloat] = Field(default_factory=dict, max_length=MAX_ITEMS)
    online_auc: FiniteFloat | None = Field(default=None, ge=0, le=1)
    auc_floor: FiniteFloat | None = Field(default=None, ge=0, le=1)


class ModelDeployed(BaseModel):
    """``cascade.model.deployed`` v1: an alias now points at a version the server follows."""

    model_config = ConfigDict(extra="forbid")

    model: Name
    alias: Name
    version: Name
    previous_version: Name | None = None
    reason: Literal["promotion", "rollback", "automatic-rollback"] = "promotion"


class DeadLetter(BaseModel):
    """``cascade.dead-letter`` v1: a message no consumer could accept, and why."""

    model_config = ConfigDict(extra="forbid")

    kind: Name
    """Short class of the reason, for counting: not-json, bad-envelope, unknown-type, ..."""
    reason: Text
    fingerprint: Annotated[str, StringConstraints(strict=True, pattern=r"^[0-9a-f]{64}$")]
    """sha256 of the raw message: a redelivered bad message has the same fingerprint."""
    raw: Annotated[str, StringConstraints(strict=True, max_length=RAW_KEEP_CHARS)]
    """The message as text (first :data:`RAW_KEEP_CHARS` characters; undecodable bytes escaped)."""
    consumer: Name


class RunFailed(BaseModel):
    """``cascade.run.failed`` v1: a pipeline task failed for good (its retries spent)."""

    model_config = ConfigDict(extra="forbid")

    pipeline: Name
    """The DAG id."""
    run_id: Text
    task: Name
    try_number: int = Field(ge=1, le=1000, strict=True)
    partition: PartitionDate | None = None
    error: Text
    """The error's type and first line (no traceback)."""


SCHEMAS: dict[tuple[str, int], type[BaseModel]] = {
    (TOPIC_DATA_LANDED, 1): DataLanded,
    (TOPIC_RETRAIN_REQUESTED, 1): RetrainRequested,
    (TOPIC_DRIFT_DETECTED, 1): DriftDetected,
    (TOPIC_MODEL_DEPLOYED, 1): ModelDeployed,
    (TOPIC_DEAD_LETTER, 1): DeadLetter,
    (TOPIC_RUN_FAILED, 1): RunFailed,
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


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_event(raw: bytes | bytearray | memoryview | str | None) -> Event:
    """Decode and validate one message value; raises :class:`InvalidEvent` (and nothing else)
    with the reason. The returned event's payload is the normalised dump of its schema
    (partitions as ``YYYY-MM-DD`` strings), which is what goes on to the asset event."""
    if raw is None:
        raise InvalidEvent("empty message (no value)", kind="not-json")
    if isinstance(raw, bytearray | memoryview):
        raw = bytes(raw)
    if not isinstance(raw, bytes | str):
        raise InvalidEvent(f"a message is bytes or text, not {type(raw).__name__}", kind="not-json")
    # A character is 1 to 4 bytes on the wire: a str over the limit in characters is over it
    # in bytes too, and is refused before it is encoded.
    size = len(raw)
    if isinstance(raw, str) and size <= MAX_EVENT_BYTES:
        size = len(raw.encode("utf-8", "surrogatepass"))
    if size > MAX_EVENT_BYTES:
        raise InvalidEvent(
            f"message of {size} bytes is over the {MAX_EVENT_BYTES}-byte limit", kind="too-large"
        )
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError, NaN
        raise InvalidEvent(f"not JSON: {str(exc)[:200]}", kind="not-json") from exc
    return validate_event(data)


def validate_event(data: Any) -> Event:
    """Validate a decoded message (a JSON object) and normalise its payload; raises
    :class:`InvalidEvent` with the reason."""
    if not isinstance(data, dict):
        raise InvalidEvent(
            f"bad envelope: a JSON object is expected, not {type(data).__name__}",
            kind="bad-envelope",
        )
    try:
        event = Event.model_validate(data)
    except (ValidationError, RecursionError) as exc:
        raise InvalidEvent(f"bad envelope: {_errors(exc)}", kind="bad-envelope") from exc
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
        payload = payload_model.model_validate(event.payload)
    except (ValidationError, RecursionError) as exc:
        raise InvalidEvent(f"bad {event.type} payload: {_errors(exc)}", kind="bad-payload") from exc
    event = event.model_copy(update={"payload": payload.model_dump(mode="json")})
    try:
        # What travels is this event's JSON; text that cannot be written as UTF-8 (a lone
        # surrogate from a "\\ud800" escape) is refused here, not where it is forwarded.
        event.model_dump_json()
    except ValueError as exc:  # PydanticSerializationError
        raise InvalidEvent(
            f"bad {event.type} event: not writable as JSON ({str(exc)[:200]})", kind="bad-payload"
        ) from exc
    return event


def _errors(exc: Exception) -> str:
    """Pydantic's errors without the offending input (which may be large or hostile), capped."""
    if not isinstance(exc, ValidationError):
        return f"{type(exc).__name__}: nested too deeply"
    parts = [
        f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}"
        for e in exc.errors(include_url=False, include_input=False, include_context=False)
    ]
    return "; ".join(parts)[: MAX_TEXT_CHARS // 2]


def make_event(event_type: str, payload: dict[str, Any], *, source: str = "cascade-cli") -> Event:
    if event_type not in TOPICS:
        raise InvalidEvent(
            f"unknown event type {event_type!r}; known: {', '.join(TOPICS)}", kind="unknown-type"
        )
    event = Event(type=event_type, payload=payload, source=source)
    return parse_event(event.model_dump_json())


def dead_letter_event(
    raw: bytes | bytearray | memoryview | str | None, error: InvalidEvent, *, consumer: str
) -> Event:
    """The dead-letter record of one rejected message (reason, class of reason, fingerprint)."""
    if raw is None:
        raw_bytes = b""
    elif isinstance(raw, bytes | bytearray | memoryview):
        raw_bytes = bytes(raw)
    else:
        raw_bytes = str(raw).encode("utf-8", "backslashreplace")
    fingerprint = hashlib.sha256(raw_bytes).hexdigest()
    text = raw_bytes.decode("utf-8", "backslashreplace")[:RAW_KEEP_CHARS]
    payload = DeadLetter(
        kind=error.kind[:MAX_NAME_CHARS],
        # Escaped so that no character of the message (a lone surrogate) breaks the record.
        reason=str(error)[:MAX_TEXT_CHARS]
        .encode("utf-8", "backslashreplace")
        .decode()[:MAX_TEXT_CHARS]
        or "invalid",
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
