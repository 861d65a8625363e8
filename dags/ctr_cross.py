"""CTR cross statistics: impression log -> Spark pairs x windows -> GX gate -> Feast online.

Runs daily at 02:00 UTC (before ``ctr_preranking`` at 03:00) and whenever a
``cascade.data.landed`` (dataset ``impressions``) or ``cascade.retrain.requested`` (model
``ctr_cross``) event arrives on Kafka, through the same shared watcher stream, claim ledger and
coalescing as the other pipelines. Each task calls one step of :mod:`jobs.ctr_cross_pipeline`
via :mod:`cascade.steps`, the functions DVC's ``cross_*`` stages run
(``cascade step NAME --pipeline ctr_cross --ds DS``):

- ``log``: the partition's impression log: kept when one landed in the lake, generated
  otherwise (``CASCADE_CROSS_IMPRESSIONS`` rows; ``CASCADE_CROSS_SOURCE=ml100k`` reads
  MovieLens-100k instead);
- ``stats``: the cross statistics on Spark (impressions, clicks, smoothed and position-debiased
  CTRs over 1/7/30-day windows ending at the partition date, recency, decayed CTR); rows that
  break a row rule go to the quarantine partition with their reason, counted in the task log;
- ``validate``: the GX gate on the input and on every pair's output; a failed batch fails the
  task, and the run stops here, before Feast;
- ``feast``: applies the pair views and the ``ctr_cross_v1`` service and materializes the
  partition into the online store.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable, dag

from cascade.assets import (
    ASSET_CTR_CROSS_FEATURES,
    ASSET_IMPRESSIONS_DATA_LANDED,
    CROSS_EVENT_SELECTORS,
)
from cascade.dag_steps import chain_steps, resolve_partition, watched_asset
from cascade.events import release_failed_run

impressions_landed = watched_asset(
    ASSET_IMPRESSIONS_DATA_LANDED,
    watcher="impressions_data_landed_watcher",
    selectors=CROSS_EVENT_SELECTORS,
)
cross_features = Asset(ASSET_CTR_CROSS_FEATURES)


@dag(
    dag_id="ctr_cross",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 2 * * *", timezone="UTC"), assets=impressions_landed
    ),
    catchup=False,
    max_active_runs=1,
    on_failure_callback=release_failed_run,
    tags=["cascade", "ctr", "features"],
    default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=30)},
    doc_md=__doc__,
)
def ctr_cross() -> None:
    chain_steps(
        "ctr_cross",
        resolve_partition(impressions_landed),
        {
            "log": {"execution_timeout": dt.timedelta(minutes=30)},
            "stats": {"execution_timeout": dt.timedelta(minutes=60)},
            "validate": {"execution_timeout": dt.timedelta(minutes=30)},
            "feast": {"outlets": [cross_features], "execution_timeout": dt.timedelta(minutes=60)},
        },
    )


ctr_cross()
