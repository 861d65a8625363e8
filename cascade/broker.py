"""The broker interface: publish events (acks=all), create the topics, read a topic back, and
count the dead letters. Kafka in both profiles (the local one runs a Kafka-protocol broker)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from cascade.assets import TOPIC_DEAD_LETTER, TOPICS
from cascade.config import Settings, load_settings
from cascade.events import Event, InvalidEvent, parse_event


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
