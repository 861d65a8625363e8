"""The shared consumer's dead-letter publish against the real broker: the record lands on the
dead-letter topic with its reason; with no broker to take it, the publish is retried and then
raises (the caller leaves the offset uncommitted) instead of counting it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from cascade import event_trigger
from cascade.assets import TOPIC_DATA_LANDED, TOPIC_DEAD_LETTER
from cascade.config import Settings
from cascade.ports import free_ports

CONN_ID = "cascade_dead_letter_probe"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    from infra.stack import private_stack

    with private_stack(tmp_path_factory.mktemp("dlq-home"), services=("broker",)) as settings:
        yield settings


def _connect(monkeypatch: pytest.MonkeyPatch, bootstrap: str) -> None:
    conn = {
        "conn_type": "kafka",
        "extra": {
            "bootstrap.servers": bootstrap,
            "group.id": "dlq-probe",
            "enable.auto.commit": "false",
            "socket.timeout.ms": 1000,
            "message.timeout.ms": 1500,
        },
    }
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))


def _rejected(value: bytes, offset: int) -> object:
    from airflow.providers.apache.kafka.triggers.shared_stream import KafkaBrokerPayload

    return KafkaBrokerPayload(topic=TOPIC_DATA_LANDED, partition=0, offset=offset, value=value)


def test_a_rejected_message_lands_on_the_dead_letter_topic_with_its_reason(
    broker: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cascade.broker import read_topic
    from cascade.event_trigger import DeadLetteringProducer

    _connect(monkeypatch, broker.bootstrap_servers)
    producer = DeadLetteringProducer(topics=[TOPIC_DATA_LANDED], kafka_config_id=CONN_ID)
    bad = json.dumps(
        {"type": TOPIC_DATA_LANDED, "payload": {"dataset": "impressions", "partition": 2999980800}}
    ).encode()
    producer._send_to_dlq(TOPIC_DEAD_LETTER, [_rejected(bad, 0)])
    records = [json.loads(v) for _o, _k, v in read_topic(TOPIC_DEAD_LETTER, settings=broker)]
    assert [r["payload"]["kind"] for r in records] == ["bad-payload"]
    assert "partition" in records[0]["payload"]["reason"] and records[0]["payload"]["raw"]
    assert producer.dead_letters == {"bad-payload": 1}


def test_with_no_broker_the_publish_is_retried_then_raises_and_counts_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cascade.event_trigger import DeadLetteringProducer

    (closed_port,) = free_ports(1)
    _connect(monkeypatch, f"127.0.0.1:{closed_port}")
    monkeypatch.setattr(event_trigger, "DEAD_LETTER_ATTEMPTS", 2)
    monkeypatch.setattr(event_trigger, "DEAD_LETTER_BACKOFF_S", 0.01)
    monkeypatch.setattr(event_trigger, "DEAD_LETTER_FLUSH_S", 3.0)
    producer = DeadLetteringProducer(topics=[TOPIC_DATA_LANDED], kafka_config_id=CONN_ID)
    with pytest.raises(event_trigger.DeadLetterPublishError, match="after 2 tries"):
        producer._send_to_dlq(TOPIC_DEAD_LETTER, [_rejected(b"{not json", 0)])
    assert producer.dead_letters == {}
