"""One ``ctr_preranking`` run on the cluster stack, end to end: a Kafka event starts it on
Airflow's Celery workers (metadata in PostgreSQL), its Spark steps run on the standalone master's
two workers, Feast's online store is Redis, the event's claim is a PostgreSQL row, and the
deployed server answers a request carrying the stack's bearer token; then one of the three Kafka
nodes is SIGKILLed in the middle of a burst of events, and nothing is lost or run twice. The same
code as ``cascade bench cluster --quick`` (:func:`benchmarks.cluster.cluster_phase`); the
training faults and the local peer are the full benchmark's."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.cluster import cluster_phase

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.timeout(2400)
def test_a_kafka_event_runs_ctr_preranking_on_the_cluster_engines(tmp_path: Path) -> None:
    result = cluster_phase(tmp_path / "home", quick=True, echo=print)
    assert result["run_state"] == "success"
    # Executors of the run's Spark applications on both standalone workers.
    assert result["spark_applications"] >= 1
    assert result["spark_workers_used"] == 2
    # Airflow's own task records name both default Celery workers, and the promotion worker
    # for the register step (the only task it takes).
    assert result["airflow_workers"] == ["cascade-promoter", "cascade-worker-1", "cascade-worker-2"]
    assert result["online_store"] == "redis" and result["online_store_keys"] > 0
    assert result["ledger"] == "postgresql"
    assert result["served"] == {"model_version": "1", "scores": 3}
    assert 0.5 < result["auc"] <= 1.0
    # Three Apache Kafka nodes; one SIGKILLed mid-burst of events the Celery-run watchers
    # consume: every event worked exactly once.
    assert result["kafka_brokers"] == 3
    (broker,) = result["faults"]
    assert broker["fault"] == "broker_killed" and broker["survived"], broker
    assert broker["lost"] == 0 and broker["duplicates"] == 0
