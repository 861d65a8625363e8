"""Asset URIs and Kafka topics: the one place producers and consumers take them from.

Kept free of imports so DAG files can read it at parse time.
"""

from __future__ import annotations

TOPIC_DATA_LANDED = "cascade.data.landed"
TOPIC_RETRAIN_REQUESTED = "cascade.retrain.requested"
TOPIC_DRIFT_DETECTED = "cascade.drift.detected"
TOPIC_MODEL_DEPLOYED = "cascade.model.deployed"
TOPIC_DEAD_LETTER = "cascade.dead-letter"
TOPIC_RUN_FAILED = "cascade.run.failed"
TOPICS = (
    TOPIC_DATA_LANDED,
    TOPIC_RETRAIN_REQUESTED,
    TOPIC_DRIFT_DETECTED,
    TOPIC_MODEL_DEPLOYED,
    TOPIC_DEAD_LETTER,
    TOPIC_RUN_FAILED,
)

WATCHED_TOPICS = (TOPIC_DATA_LANDED, TOPIC_RETRAIN_REQUESTED)
"""Topics the Airflow watchers read. Every watcher names this same tuple so that they all share
one Kafka consumer in the triggerer (``KafkaSharedStreamTrigger`` keys the consumer on topics +
connection) and each filters out what it does not want; watchers on different topic sets would
be separate consumers in one group, fighting over partitions."""

KAFKA_CONN_ID = "cascade_kafka"
"""Airflow connection of the broker (set by the stack as ``AIRFLOW_CONN_CASCADE_KAFKA``); it must
set ``enable.auto.commit=false`` so offsets are committed only after events are stored."""

ASSET_CTR_DATA_LANDED = "kafka://cascade/cascade.data.landed/ctr"
"""New impression data (or a retrain request) for the CTR pipeline; fed by the Kafka watcher."""
ASSET_PRERANKING_CHAMPION = "mlflow://cascade/models/preranking/champion"
ASSET_SPEECH_DATA_LANDED = "kafka://cascade/cascade.data.landed/speech"
"""New speech data (or an ASR retrain request) for the ``asr`` pipeline."""
ASSET_SPEECH_CORPUS = "file://cascade/lake/corpora/speech"
ASSET_ASR_CHAMPION = "mlflow://cascade/models/asr/champion"
ASSET_IMAGES_DATA_LANDED = "kafka://cascade/cascade.data.landed/images"
"""New image-text pairs (or a multimodal retrain request) for the ``multimodal`` pipeline."""
ASSET_IMAGES_CORPUS = "file://cascade/lake/corpora/images"
ASSET_MULTIMODAL_CHAMPION = "mlflow://cascade/models/multimodal/champion"
ASSET_IMPRESSIONS_DATA_LANDED = "kafka://cascade/cascade.data.landed/impressions"
"""A new impression log (or a request to recompute cross statistics) for ``ctr_cross``."""
ASSET_CTR_CROSS_FEATURES = "file://cascade/lake/features/ctr_cross"
ASSET_EVENT_PROBE = "kafka://cascade/cascade.data.landed/probe"
"""Events of the ``probe`` dataset: the trivial DAG that fault tests and the event benchmark use
to account for every event id without running the full pipeline."""

EVENT_TRIGGER = "cascade.event_trigger.CascadeEventTrigger"
"""The watcher trigger (importable in the triggerer: it lives in the installed package)."""

CTR_EVENT_SELECTORS = ("cascade.retrain.requested:model=preranking",)
"""Events that start ``ctr_preranking`` (``TYPE`` or ``TYPE:payload_field=value``); new data
starts it through ``ctr_cross``, which publishes the partition it trains on."""
ASR_EVENT_SELECTORS = (
    "cascade.data.landed:dataset=speech",
    "cascade.retrain.requested:model=asr",
)
"""Events that start ``asr``."""
MULTIMODAL_EVENT_SELECTORS = (
    "cascade.data.landed:dataset=images",
    "cascade.retrain.requested:model=multimodal",
)
"""Events that start ``multimodal``."""
CROSS_EVENT_SELECTORS = (
    "cascade.data.landed:dataset=impressions",
    "cascade.retrain.requested:model=ctr_cross",
)
"""Events that start ``ctr_cross``."""
PROBE_EVENT_SELECTORS = ("cascade.data.landed:dataset=probe",)
"""Events that start ``event_probe``."""
