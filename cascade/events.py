"""Versioned event schemas, the producer, and the function Airflow's Kafka trigger applies.

Publish from the shell::

    cascade events publish cascade.data.landed --dataset ml100k --partition 2026-11-22
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cascade.assets import TOPIC_DATA_LANDED, TOPICS
from cascade.config import Settings, load_settings

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1


class Event(BaseModel):
    """Envelope shared by every event: small, versioned JSON on the control plane."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(default_factory=lambda: uuid.uuid4().hex, min_length=1)
    type: str
    schema_version: Literal[1] = SCHEMA_VERSION
    time: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))
    source: str = "cascade-cli"
    payload: dict[str, Any] = Field(default_factory=dict)


class DataLanded(BaseModel):
    """Payload of ``cascade.data.landed``: a partition of a dataset is in the lake."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(min_length=1)
    partition: dt.date
    path: str | None = None


PAYLOADS: dict[str, type[BaseModel]] = {TOPIC_DATA_LANDED: DataLanded}


class InvalidEvent(ValueError):
    """A message that is not a valid Cascade event; the reason says what is wrong."""


def parse_event(raw: bytes | str) -> Event:
    """Decode and validate one message value; raises :class:`InvalidEvent` with the reason."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidEvent(f"not JSON: {exc}") from exc
    try:
        event = Event.model_validate(data)
    except ValidationError as exc:
        raise InvalidEvent(f"bad envelope: {exc.errors(include_url=False)}") from exc
    if event.type not in TOPICS:
        raise InvalidEvent(f"unknown event type {event.type!r}; known: {', '.join(TOPICS)}")
    payload_model = PAYLOADS.get(event.type)
    if payload_model is not None:
        try:
            payload_model.model_validate(event.payload)
        except ValidationError as exc:
            raise InvalidEvent(
                f"bad {event.type} payload: {exc.errors(include_url=False)}"
            ) from exc
    return event


def make_event(event_type: str, payload: dict[str, Any], *, source: str = "cascade-cli") -> Event:
    if event_type not in TOPICS:
        raise InvalidEvent(f"unknown event type {event_type!r}; known: {', '.join(TOPICS)}")
    event = Event(type=event_type, payload=payload, source=source)
    return parse_event(event.model_dump_json())


def publish(
    event: Event, *, settings: Settings | None = None, timeout_s: float = 10.0
) -> dict[str, Any]:
    """Send one event to the topic named by its type; acks=all, retried. Returns where it landed."""
    from kafka import KafkaProducer

    settings = settings or load_settings()
    producer = KafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        acks="all",
        retries=5,
        linger_ms=0,
        key_serializer=str.encode,
        value_serializer=str.encode,
    )
    try:
        meta = producer.send(event.type, key=event.id, value=event.model_dump_json()).get(
            timeout=timeout_s
        )
        producer.flush(timeout=timeout_s)
    finally:
        producer.close(timeout=timeout_s)
    return {"id": event.id, "topic": meta.topic, "partition": meta.partition, "offset": meta.offset}


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
    """Airflow's Kafka trigger calls this on each message; the return value becomes the
    asset event's extra. Invalid messages are logged and skipped (None), never raised:
    an exception here would kill the trigger."""
    raw = message.value() if callable(getattr(message, "value", None)) else message
    try:
        event = parse_event(raw)
    except InvalidEvent as exc:
        log.warning("skipping invalid event: %s", exc)
        return None
    return json.loads(event.model_dump_json())
