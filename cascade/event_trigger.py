"""The Airflow watcher trigger: one shared Kafka consumer for every pipeline's watcher, each
passing on the events its selectors match and dead-lettering what fails validation.

Imported by the triggerer by dotted path (:data:`cascade.assets.EVENT_TRIGGER`); the trigger
class is defined on first use, so importing this module does not import Airflow.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Sequence
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


_trigger_class: type | None = None

# An idle consumer's fetch loop: poll for the trigger's poll_timeout (1 s in the DAGs), and
# when nothing came, pause the assigned partitions for IDLE_PAUSE_S. The bundled broker
# answers an empty Fetch at once instead of holding it for fetch.wait.max.ms, so an unpaused
# idle consumer re-fetches without pause. librdkafka looks at a resumed partition only when
# its broker thread wakes (about once a second), so the poll lasts a full second: shorter ones
# can miss the wake-up and leave an event unread for several cycles (0.1 s polls: up to 10 s).
# An event waits at most about poll_timeout + IDLE_PAUSE_S; a burst is read without pauses,
# since the loop pauses only after an empty poll. Measured with a bare consumer on this 2-core
# machine: 64% of a core for the consumer and 45% for the broker unpaused; with a 2 s pause,
# 22% and 17%, and the whole idle stack's triggerer and broker 11% and 8% instead of 59% and 44%.
IDLE_PAUSE_S = 3.0


def _build_trigger_class() -> type:
    """Define the trigger on first use: it subclasses an Airflow provider class, and importing
    Airflow in every ``cascade`` command (publish, score) would cost seconds for nothing."""
    from airflow.providers.apache.kafka.hooks.consume import KafkaConsumerHook
    from airflow.providers.apache.kafka.triggers.shared_stream import (
        KafkaBrokerPayload,
        KafkaSharedStreamProducer,
        KafkaSharedStreamTrigger,
    )
    from airflow.triggers.base import TriggerEvent
    from airflow.triggers.shared_stream import reject_shared_stream_event
    from asgiref.sync import sync_to_async

    class IdlePausingProducer(KafkaSharedStreamProducer):
        """The provider's shared consumer, whose poll loop pauses its partitions for
        :data:`IDLE_PAUSE_S` after an empty poll (the comment above it says why). Commits,
        seeks and dead letters are the provider's."""

        async def open_stream(self) -> Any:
            hook = KafkaConsumerHook(topics=self.topics, kafka_config_id=self.kafka_config_id)
            await self._ensure_manual_commit(hook)
            consumer = await sync_to_async(hook.get_consumer)()
            self._consumer = consumer
            poll = sync_to_async(consumer.poll)
            while True:
                message = await poll(self.poll_timeout)
                if message is None:
                    # Paused partitions are not fetched; the event loop (and the commits
                    # and seeks of advance()) go on meanwhile. Nothing assigned yet: poll
                    # again at once, since the group's assignment arrives through poll.
                    paused = await sync_to_async(_pause_assigned)(consumer)
                    if not paused:
                        continue
                    try:
                        await asyncio.sleep(IDLE_PAUSE_S)
                    finally:
                        await sync_to_async(consumer.resume)(paused)
                    continue
                if message.error():
                    raise RuntimeError(f"Kafka consumer error: {message.error()}")
                yield (
                    message.value(),
                    KafkaBrokerPayload(
                        topic=message.topic(),
                        partition=message.partition(),
                        offset=message.offset(),
                    ),
                )

    class CascadeEventTrigger(KafkaSharedStreamTrigger):
        """``KafkaSharedStreamTrigger`` that validates Cascade events, fires for the selected
        ones and dead-letters invalid ones with their reason.

        All watchers name the same topics, so they share one consumer; each sees every
        message. Only the watcher with ``dead_letter=True`` publishes dead letters (one
        record per bad message); the others skip invalid messages.
        """

        producer_class = IdlePausingProducer

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
            return cls.producer_class(
                topics=kwargs["topics"],
                kafka_config_id=kwargs["kafka_config_id"],
                poll_timeout=kwargs["poll_timeout"],
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

    CascadeEventTrigger.__module__ = IdlePausingProducer.__module__ = __name__
    return CascadeEventTrigger


def _pause_assigned(consumer: Any) -> list[Any]:
    """Pause ``consumer``'s assigned partitions (no fetches until resumed) and return them.
    Offsets, commits and group membership are untouched; a seek made while paused takes
    effect on resume."""
    assigned = consumer.assignment()
    if assigned:
        consumer.pause(assigned)
    return assigned


def __getattr__(name: str) -> Any:
    # Module-level __getattr__ (PEP 562) so ``cascade.event_trigger.CascadeEventTrigger``
    # resolves for the triggerer's import_string while users of this module never import Airflow.
    global _trigger_class
    if name in ("CascadeEventTrigger", "IdlePausingProducer"):
        if _trigger_class is None:
            _trigger_class = _build_trigger_class()
        return _trigger_class if name == "CascadeEventTrigger" else _trigger_class.producer_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
