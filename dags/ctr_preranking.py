"""CTR pre-ranking pipeline: Spark features -> GX gate -> Feast -> DeepSpeed -> registry -> serving.

Runs daily at 03:00 UTC and whenever a ``cascade.data.landed`` event arrives on Kafka (Airflow's
AssetWatcher). Wiring only: each task calls one step from :mod:`cascade.steps`, the same
functions DVC's stages run (``cascade step NAME --ds DS``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import Asset, AssetOrTimeSchedule, AssetWatcher, CronTriggerTimetable, dag, task

from cascade.assets import (
    ASSET_CTR_DATA_LANDED,
    ASSET_CTR_FEATURES,
    ASSET_PRERANKING_CHAMPION,
    EVENT_APPLY_FUNCTION,
    KAFKA_CONN_ID,
    TOPIC_DATA_LANDED,
)

data_landed = Asset(
    ASSET_CTR_DATA_LANDED,
    watchers=[
        AssetWatcher(
            name="ctr_data_landed_watcher",
            trigger=MessageQueueTrigger(
                scheme="kafka",
                topics=[TOPIC_DATA_LANDED],
                apply_function=EVENT_APPLY_FUNCTION,
                kafka_config_id=KAFKA_CONN_ID,
                poll_timeout=1,
                poll_interval=2,
            ),
        )
    ],
)
ctr_features = Asset(ASSET_CTR_FEATURES)
preranking_champion = Asset(ASSET_PRERANKING_CHAMPION)


@dag(
    dag_id="ctr_preranking",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 3 * * *", timezone="UTC"), assets=data_landed
    ),
    # No start_date: the first scheduled run waits for the next 03:00 instead of running the
    # latest past interval the moment the DAG appears.
    catchup=False,
    max_active_runs=1,
    tags=["cascade", "ctr", "preranking"],
    default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=30)},
    doc_md=__doc__,
)
def ctr_preranking() -> None:
    @task
    def resolve_partition(**context: Any) -> str:
        from cascade.steps import resolve_partition as resolve

        events = context.get("triggering_asset_events") or {}
        extras = [event.extra for batch in events.values() for event in batch]
        dag_run = context["dag_run"]
        return resolve(extras, dag_run.logical_date, getattr(dag_run, "run_after", None))

    @task(outlets=[ctr_features])
    def features(ds: str) -> dict[str, Any]:
        from cascade.steps import run_step

        return run_step("features", ds)

    @task
    def validate(ds: str) -> dict[str, Any]:
        from cascade.steps import run_step

        return run_step("validate", ds)

    @task
    def feast_materialize(ds: str) -> dict[str, Any]:
        from cascade.steps import run_step

        return run_step("feast_materialize", ds)

    @task
    def training_set(ds: str) -> dict[str, Any]:
        from cascade.steps import run_step

        return run_step("training_set", ds)

    @task(execution_timeout=dt.timedelta(minutes=30))
    def train(ds: str) -> dict[str, Any]:
        from cascade.steps import run_step

        return run_step("train", ds)

    @task(outlets=[preranking_champion])
    def register(ds: str) -> dict[str, Any]:
        from cascade.steps import run_step

        return run_step("register", ds)

    @task
    def deploy(ds: str) -> dict[str, Any]:
        from cascade.steps import run_step

        return run_step("deploy", ds)

    ds = resolve_partition()
    chain = [
        features(ds),
        validate(ds),
        feast_materialize(ds),
        training_set(ds),
        train(ds),
        register(ds),
        deploy(ds),
    ]
    for upstream, downstream in zip(chain, chain[1:], strict=False):
        upstream >> downstream


ctr_preranking()
