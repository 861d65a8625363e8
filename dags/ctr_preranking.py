"""CTR pre-ranking pipeline: Spark features -> GX gate -> Feast -> DeepSpeed -> registry -> serving.

Runs daily at 03:00 UTC and whenever a ``cascade.data.landed`` (dataset ml100k) or
``cascade.retrain.requested`` (model preranking) event arrives on Kafka (Airflow's AssetWatcher
with the shared-stream trigger: offsets committed after the asset event is stored). The first
task claims the run's event ids, so a redelivered event never does the work twice, and a burst
coalesces into one run (see :mod:`cascade.events`). Wiring only: each task calls one step from
:mod:`cascade.steps`, the same functions DVC's stages run (``cascade step NAME --ds DS``).
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable, dag

from cascade.assets import (
    ASSET_CTR_DATA_LANDED,
    ASSET_CTR_FEATURES,
    ASSET_PRERANKING_CHAMPION,
    CTR_EVENT_SELECTORS,
)
from cascade.dag_steps import chain_steps, resolve_partition, watched_asset
from cascade.events import release_failed_run

data_landed = watched_asset(
    ASSET_CTR_DATA_LANDED,
    watcher="ctr_data_landed_watcher",
    selectors=CTR_EVENT_SELECTORS,
    # This watcher owns dead-lettering: one record per bad message.
    dead_letter=True,
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
    on_failure_callback=release_failed_run,
    tags=["cascade", "ctr", "preranking"],
    default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=30)},
    doc_md=__doc__,
)
def ctr_preranking() -> None:
    chain_steps(
        "ctr_preranking",
        resolve_partition(data_landed),
        {
            "features": {"outlets": [ctr_features]},
            "train": {"execution_timeout": dt.timedelta(minutes=30)},
            # Parity, accuracy and latency gates of the compiled artifact; a failure is recorded
            # and the registry then keeps the champion, with the reasons.
            "compile": {"execution_timeout": dt.timedelta(minutes=20)},
            "register": {"outlets": [preranking_champion]},
        },
    )


ctr_preranking()
