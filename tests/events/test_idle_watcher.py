"""The watchers' shared consumer against Apache Kafka: idle, it waits in the broker's Fetch for
``fetch.wait.max.ms`` instead of spinning (which is why it needs no pausing of its own), and the
next event still arrives within a second."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cascade.assets import TOPIC_DATA_LANDED
from cascade.config import Settings

CONN_ID = "cascade_idle_probe"
IDLE_S = 4.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    from infra.stack import private_stack

    with private_stack(tmp_path_factory.mktemp("idle-home"), services=("broker",)) as settings:
        yield settings


def _fetch_count(stats: list[dict[str, Any]]) -> int:
    """Fetch requests sent so far, from librdkafka's latest statistics."""
    if not stats:
        return 0
    return sum(b.get("req", {}).get("Fetch", 0) for b in stats[-1]["brokers"].values())


def _idle_fetches(
    producer_class: type, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> dict:
    """Run ``producer_class``'s stream idle for IDLE_S, then publish one event; return the Fetch
    requests sent while idle and the values read."""
    from airflow.providers.apache.kafka.hooks.consume import KafkaConsumerHook

    from cascade.broker import publish
    from cascade.events import make_event

    group = f"idle-{producer_class.__name__}-{time.monotonic_ns()}"
    conn = {
        "conn_type": "kafka",
        "extra": {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": group,
            "auto.offset.reset": "latest",
            "enable.auto.commit": "false",
        },
    }
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
    stats: list[dict[str, Any]] = []
    plain = KafkaConsumerHook._get_client

    def with_stats(self: Any, config: dict[str, Any]) -> Any:
        extra = {"statistics.interval.ms": 250, "stats_cb": lambda s: stats.append(json.loads(s))}
        return plain(self, {**config, **extra})

    # Undone after each run, so the next run's wrapper wraps the hook's own method.
    monkeypatch.setattr(KafkaConsumerHook, "_get_client", with_stats)
    producer = producer_class(topics=[TOPIC_DATA_LANDED], kafka_config_id=CONN_ID, poll_timeout=1.0)

    async def run() -> dict:
        values: list[bytes] = []

        async def read() -> None:
            async for value, _payload in producer.open_stream():
                values.append(value)

        reader = asyncio.create_task(read())
        # Wait for the group assignment (the first fetches), then measure an idle window.
        deadline = time.monotonic() + 30
        while _fetch_count(stats) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        start = _fetch_count(stats)
        await asyncio.sleep(IDLE_S)
        idle = _fetch_count(stats) - start
        event = make_event(
            "cascade.data.landed", {"dataset": "idle-probe", "partition": "2026-11-22"}
        )
        await asyncio.to_thread(publish, event, settings=settings)
        sent = time.monotonic()
        deadline = time.monotonic() + 15
        while not values and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        latency = time.monotonic() - sent
        reader.cancel()
        await producer.aclose()
        return {"idle_fetches": idle, "values": values, "event_id": event.id, "latency_s": latency}

    return asyncio.run(run())


def test_an_idle_watcher_waits_in_the_broker_and_still_reads_the_next_event(
    broker: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cascade.event_trigger import DeadLetteringProducer

    with monkeypatch.context() as patch:
        ours = _idle_fetches(DeadLetteringProducer, broker, patch)
    print(
        f"Fetch requests in {IDLE_S:.0f} idle seconds: {ours['idle_fetches']}; the next event "
        f"read after {ours['latency_s']:.2f} s"
    )
    assert [json.loads(v)["id"] for v in ours["values"]] == [ours["event_id"]]
    # librdkafka's fetch.wait.max.ms is 500 ms: the broker holds each empty Fetch that long, so
    # an idle consumer sends about two a second (a broker that answered at once would see
    # thousands), and a new event is answered from the waiting Fetch.
    assert 0 < ours["idle_fetches"] <= 4 * IDLE_S, ours["idle_fetches"]
    assert ours["latency_s"] < 2.0, ours["latency_s"]
