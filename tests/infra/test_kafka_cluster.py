"""The cluster profile's Kafka, really started on loopback: three Apache Kafka nodes in one KRaft
controller quorum, the platform's topics replicated three times with ``min.insync.replicas`` 2
(as the Strimzi manifests declare them), and a node SIGKILLed in the middle of a burst loses no
acknowledged event and duplicates none."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cascade.assets import TOPIC_DATA_LANDED, TOPICS
from cascade.broker import describe, publish_many, read_topic, topic_settings
from cascade.config import REPO_ROOT, Settings
from cascade.events import make_event
from infra import kafka_broker, services, stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    home = tmp_path_factory.mktemp("kafka-cluster")
    with stack.private_stack(
        home, services=kafka_broker.NODES, env={"CASCADE_PROFILE": "cluster"}
    ) as settings:
        yield settings


def test_three_nodes_form_one_quorum_and_the_topics_are_replicated(
    kafka_cluster: Settings,
) -> None:
    assert len(kafka_cluster.bootstrap_servers.split(",")) == 3
    found = describe(kafka_cluster)
    assert found["brokers"] == [1, 2, 3]
    assert found["controller_id"] in (1, 2, 3)
    # Each node answers for the same cluster.
    for node in kafka_broker.nodes(kafka_cluster):
        alone = describe(kafka_cluster, bootstrap=f"{kafka_cluster.host}:{node.port}")
        assert alone["cluster_id"] == found["cluster_id"]
    for topic in TOPICS:
        assert topic_settings(topic, kafka_cluster) == {
            "replication": [3],
            "min.insync.replicas": 2,
        }


def test_the_strimzi_topics_carry_the_same_replication() -> None:
    replication, min_isr = kafka_broker.REPLICATION["cluster"]
    docs = [
        d
        for d in yaml.safe_load_all((REPO_ROOT / "infra" / "k8s" / "kafka-topics.yaml").read_text())
        if d
    ]
    assert {d["metadata"]["name"] for d in docs} >= set(TOPICS)
    for doc in docs:
        assert doc["spec"]["replicas"] == replication
        assert int(doc["spec"]["config"]["min.insync.replicas"]) == min_isr


def test_a_node_killed_mid_burst_loses_nothing_and_duplicates_nothing(
    kafka_cluster: Settings,
) -> None:
    events = [
        make_event(
            TOPIC_DATA_LANDED, {"dataset": "probe", "partition": "2026-11-22", "path": f"k/{i}"}
        )
        for i in range(600)
    ]
    # The partition leader is the node that takes the writes: kill that one.
    leader = _leader(kafka_cluster, TOPIC_DATA_LANDED)
    victim = kafka_broker.NODES[leader - 1]
    publish_many(events[:300], settings=kafka_cluster, timeout_s=60)
    errors: list[BaseException] = []

    def rest() -> None:
        try:
            publish_many(events[300:], settings=kafka_cluster, timeout_s=120)
        except BaseException as exc:
            errors.append(exc)

    publisher = threading.Thread(target=rest)
    publisher.start()
    stack.kill_service(kafka_cluster, victim)
    killed_at = time.monotonic()
    publisher.join(timeout=150)
    assert not errors and not publisher.is_alive(), errors
    # Two of three replicas in sync are enough: the burst went on while the node was down.
    survivors = describe(kafka_cluster)
    assert leader not in survivors["brokers"], survivors
    stack.start_service(kafka_cluster, victim, echo=lambda _line: None)
    assert describe(kafka_cluster)["brokers"] == [1, 2, 3]
    print(f"node {leader} killed; burst acknowledged {time.monotonic() - killed_at:.1f} s later")
    logged = Counter(
        json.loads(v)["id"]
        for _o, _k, v in read_topic(TOPIC_DATA_LANDED, settings=kafka_cluster, timeout_s=30)
    )
    wanted = [e.id for e in events]
    assert [i for i in wanted if i not in logged] == [], "acknowledged events lost"
    assert [i for i in wanted if logged[i] > 1] == [], "events written twice"


def _leader(settings: Settings, topic: str) -> int:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.kafka_client_config)
    metadata = admin.list_topics(topic=topic, timeout=10)
    return int(metadata.topics[topic].partitions[0].leader)


def test_the_cluster_profile_runs_three_nodes_and_an_external_kafka_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cascade.config import load_settings

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setenv("CASCADE_PROFILE", "cluster")
    names = services.stack_services(load_settings())
    assert [n for n in names if n in kafka_broker.NODES] == list(kafka_broker.NODES)
    monkeypatch.delenv("CASCADE_PROFILE")
    monkeypatch.setenv("CASCADE_KAFKA_BOOTSTRAP", "kafka.example:9093")
    monkeypatch.setenv("CASCADE_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("CASCADE_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("CASCADE_KAFKA_SASL_USERNAME", "cascade")
    monkeypatch.setenv("CASCADE_KAFKA_SASL_PASSWORD", "s3cret")
    settings = load_settings()
    assert not any(n in kafka_broker.NODES for n in services.stack_services(settings))
    assert settings.kafka_client_config == {
        "bootstrap.servers": "kafka.example:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "cascade",
        "sasl.password": "s3cret",
    }
    # The watchers' Airflow connection carries the same settings.
    assert (
        '"sasl.mechanism": "SCRAM-SHA-512"'
        in services.airflow_env(settings)["AIRFLOW_CONN_CASCADE_KAFKA"]
    )
