"""The watchers' real shared-stream path (Airflow's ``SharedStreamManager`` in ack mode, our
trigger's filter, our producer's ``advance`` and dead-letter publishing) over an in-memory
topic: only the confluent-kafka consumer and producer are stand-ins."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from cascade.assets import TOPIC_DATA_LANDED
from cascade.events import make_event


class MemoryConsumer:
    """Records the offsets the producer commits and seeks to (confluent's ``Consumer`` API)."""

    def __init__(self) -> None:
        self.commits: list[int] = []
        self.seeks: list[int] = []

    def commit(self, offsets: list[Any], asynchronous: bool = True) -> None:
        self.commits.extend(tp.offset for tp in offsets)

    def seek(self, partition: Any) -> None:
        self.seeks.append(partition.offset)

    def close(self) -> None:
        pass


class MemoryDeadLetters:
    """Stands in for confluent's ``Producer``: the first ``fail_flushes`` flushes report every
    message refused through its delivery callback (as a broker that is down does)."""

    def __init__(self, fail_flushes: int = 0) -> None:
        self.fail_flushes = fail_flushes
        self.flushes = 0
        """Flushes with messages queued (the producer's own close flushes an empty queue)."""
        self.sent: list[tuple[str, bytes, bytes]] = []
        self._queued: list[tuple[str, bytes, bytes, Any]] = []

    def produce(self, topic: str, *, key: bytes, value: bytes, on_delivery: Any) -> None:
        self._queued.append((topic, key, value, on_delivery))

    def flush(self, timeout: float | None = None) -> int:
        queued, self._queued = self._queued, []
        if not queued:
            return 0
        self.flushes += 1
        refuse = self.flushes <= self.fail_flushes
        for topic, key, value, on_delivery in queued:
            if refuse:
                on_delivery("KafkaError{code=_TRANSPORT,str=broker down}", None)
            else:
                self.sent.append((topic, key, value))
                on_delivery(None, None)
        return 0

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(value) for _topic, _key, value in self.sent]


@dataclass
class StreamRun:
    fired: list[dict[str, Any]]
    commits: list[int]
    seeks: list[int]
    dead_letters: list[dict[str, Any]]
    counted: dict[str, int]
    """The producer's count of dead letters the broker acknowledged, by kind."""
    rejected: dict[str, int]
    error: BaseException | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def sentinel() -> bytes:
    """A valid event no selector of the tests picks: the last message of a run, so every
    message before it is resolved (a subscriber resolves a message by pulling the next)."""
    return (
        make_event(TOPIC_DATA_LANDED, {"dataset": "end-of-test", "partition": "2026-11-22"})
        .model_dump_json()
        .encode()
    )


def run_stream(
    values: list[bytes],
    *,
    selectors: tuple[str, ...] = (),
    dead_letters: MemoryDeadLetters | None = None,
    dead_letter: bool = True,
    timeout_s: float = 20.0,
) -> StreamRun:
    """Feed ``values`` (then :func:`sentinel`) through one watcher; return once
    every value's offset is committed, the stream failed, or ``timeout_s`` passed."""
    from airflow.providers.apache.kafka.triggers.shared_stream import KafkaBrokerPayload
    from airflow.triggers.shared_stream import SharedStreamManager

    from cascade.event_trigger import CascadeEventTrigger, DeadLetteringProducer

    messages = [*values, sentinel()]
    consumer = MemoryConsumer()
    dlq = dead_letters or MemoryDeadLetters()
    producers: list[Any] = []

    class MemoryProducer(DeadLetteringProducer):  # type: ignore[misc, valid-type]
        async def open_stream(self) -> Any:
            producers.append(self)
            self._consumer = consumer
            self._dlq_producer = dlq
            for offset, value in enumerate(messages):
                payload = KafkaBrokerPayload(
                    topic=TOPIC_DATA_LANDED, partition=0, offset=offset, value=value
                )
                yield value, payload
            await asyncio.Event().wait()  # a stream runs until it is stopped

    class MemoryTrigger(CascadeEventTrigger):  # type: ignore[misc, valid-type]
        producer_class = MemoryProducer

    trigger = MemoryTrigger(
        topics=[TOPIC_DATA_LANDED], selectors=selectors, dead_letter=dead_letter, name="ctr"
    )
    key = trigger.shared_stream_key()
    fired: list[dict[str, Any]] = []
    done = len(values)  # committing offset N means messages 0..N-1 are handled

    async def main() -> BaseException | None:
        manager = SharedStreamManager(ack_timeout=timeout_s)
        stream = manager.subscribe(trigger_id=1, trigger=trigger, key=key)

        async def consume() -> None:
            async for event in trigger.filter_shared_stream(stream):
                # What the triggerer does: bind the event, then confirm it once stored.
                seq = manager.bind_pending_event(trigger_id=1, key=key)
                fired.append(event.payload)
                if seq is not None:
                    manager.confirm_persisted([seq])

        task = asyncio.create_task(consume())
        deadline = time.monotonic() + timeout_s
        while not task.done() and time.monotonic() < deadline:
            if consumer.commits and consumer.commits[-1] >= done:
                break
            await asyncio.sleep(0.01)
        error = task.exception() if task.done() else None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await manager.unsubscribe(1, key)
        return error

    error = asyncio.run(main())
    return StreamRun(
        fired=fired,
        commits=consumer.commits,
        seeks=consumer.seeks,
        dead_letters=dlq.records(),
        counted=dict(producers[0].dead_letters) if producers else {},
        rejected=dict(trigger.rejected),
        error=error,
        extra={"flushes": dlq.flushes},
    )
