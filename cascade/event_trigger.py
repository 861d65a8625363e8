"""The Airflow watcher trigger: one shared Kafka consumer for every pipeline's watcher, each
passing on the events its selectors match and dead-lettering what fails validation.

Imported by the triggerer by dotted path (:data:`cascade.assets.EVENT_TRIGGER`); the trigger
class is defined on first use, so importing this module does not import Airflow.

Dead letters, at least once: the dead-lettering watcher *rejects* a message that fails
validation (``reject_shared_stream_event``); the shared consumer's ``advance`` publishes a
:class:`~cascade.events.DeadLetter` record for each rejected message (its reason recomputed from
the message) and commits the offset only after the broker acknowledged the record. A publish
is retried :data:`DEAD_LETTER_ATTEMPTS` times with doubling back-off; if it still fails,
``advance`` raises: the offset stays uncommitted, Airflow ends the shared stream (its watchers
restart), and the message is read again and re-dead-lettered. Nothing is counted as
dead-lettered before the broker has it, and a bad message is never dropped. A repeat of the
same record (after a restart) has the same id, which :func:`cascade.broker.dead_letter_summary`
counts once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, NamedTuple

from cascade.assets import EVENT_TRIGGER, TOPIC_DEAD_LETTER, TOPICS
from cascade.events import Event, InvalidEvent, dead_letter_event, parse_event

log = logging.getLogger(__name__)


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


DEAD_LETTER_CONSUMER = "cascade-watchers"
"""The ``consumer`` of the dead-letter records the watchers' shared consumer publishes."""
DEAD_LETTER_ATTEMPTS = 4
"""Tries to publish a batch of dead letters before the shared stream gives up (and redelivers)."""
DEAD_LETTER_BACKOFF_S = 1.0
"""Pause before the second try; it doubles before each further one (1, 2, 4 s)."""
DEAD_LETTER_FLUSH_S = 10.0
"""How long one try waits for the broker to acknowledge the batch."""


class DeadLetterPublishError(RuntimeError):
    """Dead letters the broker did not acknowledge after every try; their offsets stay
    uncommitted, so the messages are read and dead-lettered again."""


def dead_letter_record(raw: Any, *, consumer: str = DEAD_LETTER_CONSUMER) -> Event:
    """The dead-letter record of a rejected message, its reason recomputed from the message."""
    try:
        parse_event(raw)
    except InvalidEvent as exc:
        return dead_letter_event(raw, exc, consumer=consumer)
    # Valid now, rejected a moment ago: only a partition that came into range at midnight.
    return dead_letter_event(
        raw,
        InvalidEvent("rejected by a watcher; valid when re-read", kind="rejected"),
        consumer=consumer,
    )


def publish_dead_letters(
    get_producer: Callable[[], Any],
    records: Sequence[Event],
    *,
    topic: str = TOPIC_DEAD_LETTER,
    attempts: int = DEAD_LETTER_ATTEMPTS,
    backoff_s: float = DEAD_LETTER_BACKOFF_S,
    flush_s: float = DEAD_LETTER_FLUSH_S,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Produce ``records`` through the confluent-kafka producer ``get_producer()`` returns and
    wait for the broker's acknowledgement; retried with doubling back-off, and raises
    :class:`DeadLetterPublishError` once every try failed. A retry re-sends the whole batch
    (records have stable ids; readers count a repeat once)."""
    last: BaseException | None = None
    for attempt in range(1, attempts + 1):
        # flush() counts only what is still queued; a message the broker refused leaves the
        # queue too, and only its delivery report says so.
        failed: list[str] = []

        def delivered(error: Any, _message: Any, failed: list[str] = failed) -> None:
            if error is not None:
                failed.append(str(error))

        try:
            producer = get_producer()
            for record in records:
                producer.produce(
                    topic,
                    key=record.id.encode(),
                    value=record.model_dump_json().encode(),
                    on_delivery=delivered,
                )
            remaining = producer.flush(flush_s)
            if remaining:
                raise RuntimeError(f"{remaining} dead letter(s) not acknowledged in {flush_s:g} s")
            if failed:
                raise RuntimeError(f"broker refused {len(failed)} dead letter(s): {failed[0]}")
            return
        except Exception as exc:  # the broker client raises KafkaException, BufferError, ...
            last = exc
            if attempt < attempts:
                pause = backoff_s * 2 ** (attempt - 1)
                log.warning(
                    "dead-letter publish try %d/%d failed (%s); retrying in %.1f s",
                    attempt,
                    attempts,
                    exc,
                    pause,
                )
                sleep(pause)
    ids = [r.id for r in records]
    log.error(
        "DEAD LETTERS NOT PUBLISHED after %d tries: %s (%s); their offsets stay uncommitted and "
        "the messages will be read again",
        attempts,
        ids,
        last,
    )
    raise DeadLetterPublishError(
        f"{len(records)} dead letter(s) not published after {attempts} tries: {last}"
    ) from last


_trigger_class: type | None = None


def _build_trigger_class() -> type:
    """Define the trigger on first use: it subclasses an Airflow provider class, and importing
    Airflow in every ``cascade`` command (publish, score) would cost seconds for nothing."""
    from airflow.providers.apache.kafka.hooks.consume import KafkaConsumerHook
    from airflow.providers.apache.kafka.hooks.produce import KafkaProducerHook
    from airflow.providers.apache.kafka.triggers.shared_stream import (
        KafkaBrokerPayload,
        KafkaSharedStreamProducer,
        KafkaSharedStreamTrigger,
    )
    from airflow.triggers.base import TriggerEvent
    from airflow.triggers.shared_stream import reject_shared_stream_event
    from asgiref.sync import sync_to_async

    class DeadLetteringProducer(KafkaSharedStreamProducer):
        """The provider's shared consumer, whose dead letters are
        :class:`~cascade.events.DeadLetter` records with their reason, published with retries
        before the offset is committed (the module docstring says how). Its poll loop, commits
        and seeks are the provider's: an idle consumer waits in the broker's Fetch for
        ``fetch.wait.max.ms``, so it needs no pausing of its own. Its poll loop differs in one
        thing: a broker that went away (``_TRANSPORT``, ``_ALL_BROKERS_DOWN``) is logged and
        waited out, since librdkafka reconnects by itself and resumes from the last committed
        offset; only a fatal error ends the stream."""

        def __init__(
            self,
            *,
            topics: Sequence[str],
            kafka_config_id: str = "kafka_default",
            poll_timeout: float = 1.0,
            dlq_topic: str | None = TOPIC_DEAD_LETTER,
            consumer_name: str = DEAD_LETTER_CONSUMER,
        ) -> None:
            super().__init__(
                topics=topics,
                kafka_config_id=kafka_config_id,
                poll_timeout=poll_timeout,
                dlq_topic=dlq_topic,
            )
            self.consumer_name = consumer_name
            self.dead_letters: dict[str, int] = {}
            """Dead letters the broker acknowledged, by kind."""

        async def open_stream(self) -> Any:
            hook = KafkaConsumerHook(topics=self.topics, kafka_config_id=self.kafka_config_id)
            await self._ensure_manual_commit(hook)
            consumer = await sync_to_async(hook.get_consumer)()
            self._consumer = consumer
            poll = sync_to_async(consumer.poll)
            keep = self.dlq_topic is not None
            while True:
                message = await poll(self.poll_timeout)
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.fatal():
                        raise RuntimeError(f"Kafka consumer error: {error}")
                    log.warning("Kafka consumer: %s; librdkafka reconnects by itself", error)
                    continue
                yield (
                    message.value(),
                    KafkaBrokerPayload(
                        topic=message.topic(),
                        partition=message.partition(),
                        offset=message.offset(),
                        value=message.value() if keep else None,
                        key=message.key() if keep else None,
                    ),
                )

        def _get_dlq_producer(self) -> Any:
            if self._dlq_producer is None:
                self._dlq_producer = KafkaProducerHook(
                    kafka_config_id=self.kafka_config_id
                ).get_producer()
            return self._dlq_producer

        def _send_to_dlq(self, topic: str, payloads: list[Any]) -> None:
            # Called by advance() for the batch's rejected messages, before it commits their
            # offsets; raising keeps them uncommitted (the module docstring says what follows).
            records = [dead_letter_record(p.value, consumer=self.consumer_name) for p in payloads]
            publish_dead_letters(
                self._get_dlq_producer,
                records,
                topic=topic,
                attempts=DEAD_LETTER_ATTEMPTS,
                backoff_s=DEAD_LETTER_BACKOFF_S,
                flush_s=DEAD_LETTER_FLUSH_S,
            )
            for record in records:
                kind = str(record.payload["kind"])
                self.dead_letters[kind] = self.dead_letters.get(kind, 0) + 1
                log.warning(
                    "dead-lettered %s (%s): %s; dead letters so far by kind: %s",
                    record.id,
                    kind,
                    record.payload["reason"],
                    self.dead_letters,
                )

    class CascadeEventTrigger(KafkaSharedStreamTrigger):
        """``KafkaSharedStreamTrigger`` that validates Cascade events, fires for the selected
        ones and rejects invalid ones, which the shared consumer dead-letters with their reason.

        All watchers name the same topics, so they share one consumer; each sees every
        message. Only the watcher with ``dead_letter=True`` rejects bad messages (one record
        per bad message); the others skip them.
        """

        producer_class = DeadLetteringProducer

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
            # dlq_topic stays None here: the shared consumer publishes DeadLetter records
            # (reason, kind, fingerprint) to the dead-letter topic, not the raw bytes.
            super().__init__(
                topics=topics, kafka_config_id=kafka_config_id, poll_timeout=poll_timeout
            )
            for selector in selectors:
                parse_selector(selector)
            self.selectors = list(selectors)
            self.dead_letter = dead_letter
            self.name = name
            self.rejected: dict[str, int] = {}
            """Messages this watcher rejected, by kind (dead-lettered by the shared consumer;
            its ``dead_letters`` counts those the broker acknowledged)."""

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
            return cls.producer_class(
                topics=kwargs["topics"],
                kafka_config_id=kwargs["kafka_config_id"],
                poll_timeout=kwargs["poll_timeout"],
            )

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
                kind = route.error.kind
                self.rejected[kind] = self.rejected.get(kind, 0) + 1
                log.warning(
                    "%s rejected a message (%s): %s; it is dead-lettered before its offset is "
                    "committed",
                    self.name,
                    kind,
                    route.error,
                )
                reject_shared_stream_event()

    CascadeEventTrigger.__module__ = DeadLetteringProducer.__module__ = __name__
    return CascadeEventTrigger


def __getattr__(name: str) -> Any:
    # Module-level __getattr__ (PEP 562) so ``cascade.event_trigger.CascadeEventTrigger``
    # resolves for the triggerer's import_string while users of this module never import Airflow.
    global _trigger_class
    if name in ("CascadeEventTrigger", "DeadLetteringProducer"):
        if _trigger_class is None:
            _trigger_class = _build_trigger_class()
        return _trigger_class if name == "CascadeEventTrigger" else _trigger_class.producer_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
