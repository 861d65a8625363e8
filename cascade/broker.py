"""The broker interface: publish events (acks=all, idempotent producer), create the topics, read a
topic back, count the dead letters and describe the cluster. Apache Kafka in both profiles,
through one client library, confluent-kafka (librdkafka), the one Airflow's Kafka provider and
the event watchers use too.

Every client starts from :attr:`cascade.config.Settings.kafka_client_config`: the bootstrap
servers and, for an external cluster, its TLS/SASL settings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from cascade.assets import TOPIC_DEAD_LETTER, TOPICS
from cascade.config import Settings, load_settings
from cascade.events import Event, InvalidEvent, parse_event


class BrokerError(RuntimeError):
    """The broker did not acknowledge a write or answer a request; the message says which."""


def _producer(settings: Settings) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {
            **settings.kafka_client_config,
            # Every write is acknowledged by all in-sync replicas, retried without reordering
            # or duplicating (the idempotent producer), and reported back.
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 60000,
        }
    )


def publish(
    event: Event, *, settings: Settings | None = None, timeout_s: float = 10.0
) -> dict[str, Any]:
    """Send one event to the topic named by its type; acks=all, retried. Returns where it landed."""
    return publish_many([event], settings=settings, timeout_s=timeout_s)[0]


def publish_many(
    events: Sequence[Event], *, settings: Settings | None = None, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    """Send events through one producer (acks=all, retried); returns where each landed, in order.
    Raises BrokerError unless the broker acknowledged every one within ``timeout_s``."""
    records = [(event.type, event.id, event.model_dump_json().encode()) for event in events]
    metas = publish_raw(records, settings=settings, timeout_s=timeout_s)
    return [{"id": e.id, **meta} for e, meta in zip(events, metas, strict=True)]


def publish_raw(
    records: Sequence[tuple[str, str | None, bytes]],
    *,
    settings: Settings | None = None,
    timeout_s: float = 30.0,
) -> list[dict[str, Any]]:
    """Send ``(topic, key, value)`` records as they are (tests and benchmarks publish malformed
    ones this way); returns ``{topic, partition, offset}`` for each, in order."""
    settings = settings or load_settings()
    producer = _producer(settings)
    results: list[dict[str, Any] | None] = [None] * len(records)
    errors: list[str] = []

    def delivered(index: int) -> Any:
        def report(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(f"{message.topic()}: {error}")
            else:
                results[index] = {
                    "topic": message.topic(),
                    "partition": message.partition(),
                    "offset": message.offset(),
                }

        return report

    deadline = time.monotonic() + timeout_s
    for i, (topic, key, value) in enumerate(records):
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=delivered(i))
                break
            except BufferError:
                # The local queue is full: serve delivery reports, then try again.
                producer.poll(0.1)
                if time.monotonic() > deadline:
                    raise BrokerError(
                        f"publish: queue still full after {timeout_s:.0f} s"
                    ) from None
        producer.poll(0)
    left = producer.flush(max(0.1, deadline - time.monotonic()))
    if errors or left or any(r is None for r in results):
        missing = sum(1 for r in results if r is None)
        raise BrokerError(
            f"publish to {settings.bootstrap_servers}: {missing} of {len(records)} records not "
            f"acknowledged within {timeout_s:.0f} s"
            + (f" ({'; '.join(errors[:3])})" if errors else "")
            + "; check that the broker runs (`cascade status`)"
        )
    return [r for r in results if r is not None]


_PROBE_LOG = logging.getLogger("cascade.broker.probe")
_PROBE_LOG.setLevel(logging.CRITICAL + 1)
"""librdkafka's log of health probes: a node that does not answer yet is the expected answer
while it starts, not an error to print once a second."""


def _admin(
    settings: Settings, timeout_s: float = 10.0, bootstrap: str | None = None, quiet: bool = False
) -> Any:
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = dict(settings.kafka_client_config)
    if bootstrap:
        config["bootstrap.servers"] = bootstrap
    if quiet:
        config["logger"] = _PROBE_LOG
    return AdminClient({**config, "socket.timeout.ms": int(timeout_s * 1000)})


def describe(
    settings: Settings | None = None, *, bootstrap: str | None = None, timeout_s: float = 5.0
) -> dict[str, Any]:
    """The cluster as the admin API reports it: ``cluster_id``, ``controller_id``, ``brokers``
    (node ids) and ``topics``. ``bootstrap`` asks one node in particular. Raises BrokerError
    when nothing answers within ``timeout_s``."""
    from confluent_kafka import KafkaException

    settings = settings or load_settings()
    admin = _admin(settings, timeout_s, bootstrap, quiet=True)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        where = bootstrap or settings.bootstrap_servers
        raise BrokerError(f"Kafka at {where} did not answer: {exc}") from exc
    return {
        "cluster_id": metadata.cluster_id,
        "controller_id": metadata.controller_id,
        "brokers": sorted(metadata.brokers),
        "topics": sorted(t for t in metadata.topics if not t.startswith("__")),
    }


def ensure_topics(
    settings: Settings | None = None,
    *,
    replication: int = 1,
    config: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> list[str]:
    """Create the Cascade topics that do not exist yet (``replication`` copies of each, topic
    ``config`` such as ``min.insync.replicas``); returns the ones created."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    settings = settings or load_settings()
    admin = _admin(settings, timeout_s)
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    missing = [t for t in TOPICS if t not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [
            NewTopic(t, num_partitions=1, replication_factor=replication, config=config or {})
            for t in missing
        ],
        request_timeout=timeout_s,
    )
    created = []
    for topic, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            created.append(topic)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise BrokerError(f"could not create topic {topic}: {exc}") from exc
    return sorted(created)


def topic_settings(topic: str, settings: Settings | None = None) -> dict[str, Any]:
    """``replication`` (the partitions' replica counts) and ``min.insync.replicas`` of a topic."""
    from confluent_kafka.admin import ConfigResource

    settings = settings or load_settings()
    admin = _admin(settings)
    metadata = admin.list_topics(topic=topic, timeout=10)
    partitions = metadata.topics[topic].partitions.values()
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    return {
        "replication": sorted({len(p.replicas) for p in partitions}),
        "min.insync.replicas": int(configs["min.insync.replicas"].value),
    }


def read_topic(
    topic: str, *, settings: Settings | None = None, timeout_s: float = 10.0
) -> list[tuple[int, str | None, bytes]]:
    """Every message of ``topic`` as (offset, key, value), read without committing anything."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    settings = settings or load_settings()
    consumer = Consumer(
        {
            **settings.kafka_client_config,
            "group.id": "cascade-reader",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )
    try:
        metadata = consumer.list_topics(topic=topic, timeout=timeout_s)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            return []
        out: list[tuple[int, str | None, bytes]] = []
        deadline = time.monotonic() + timeout_s
        for partition in sorted(found.partitions):
            tp = TopicPartition(topic, partition)
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
            position = low
            while position < high and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None or message.error():
                    continue
                key = message.key().decode() if message.key() is not None else None
                out.append((message.offset(), key, message.value()))
                position = message.offset() + 1
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
