"""Asset URIs and Kafka topics: the one place producers and consumers take them from.

Kept free of imports so DAG files can read it at parse time.
"""

from __future__ import annotations

TOPIC_DATA_LANDED = "cascade.data.landed"
TOPIC_RETRAIN_REQUESTED = "cascade.retrain.requested"
TOPIC_DRIFT_DETECTED = "cascade.drift.detected"
TOPIC_MODEL_DEPLOYED = "cascade.model.deployed"
TOPIC_DEAD_LETTER = "cascade.dead-letter"
TOPICS = (
    TOPIC_DATA_LANDED,
    TOPIC_RETRAIN_REQUESTED,
    TOPIC_DRIFT_DETECTED,
    TOPIC_MODEL_DEPLOYED,
    TOPIC_DEAD_LETTER,
)

KAFKA_CONN_ID = "cascade_kafka"
"""Airflow connection of the broker (set by the stack as ``AIRFLOW_CONN_CASCADE_KAFKA``)."""

ASSET_CTR_DATA_LANDED = "kafka://cascade/cascade.data.landed/ctr"
"""New impression data for the CTR pipeline; fed by the Kafka watcher."""
ASSET_CTR_FEATURES = "file://cascade/lake/features/ctr"
ASSET_PRERANKING_CHAMPION = "mlflow://cascade/models/preranking/champion"

EVENT_APPLY_FUNCTION = "cascade.events.to_asset_event"
"""Dotted path the Kafka trigger calls on each message (must be importable in the triggerer)."""
