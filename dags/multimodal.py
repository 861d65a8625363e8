"""Multimodal pipeline: Spark image-text corpus -> GX -> DeepSpeed MoE transformer -> registry.

Runs daily at 05:00 UTC and whenever a ``cascade.data.landed`` (dataset ``images``) or
``cascade.retrain.requested`` (model ``multimodal``) event arrives on Kafka, through the same
shared watcher stream, claim ledger and coalescing as ``ctr_preranking``. Each task calls one
step of :mod:`models.multimodal.pipeline` via :mod:`cascade.steps`, the functions DVC's ``mm_*``
stages run (``cascade step NAME --pipeline multimodal --ds DS``):

- ``corpus``: the partition's landed image-text pairs (else the installed Tux Paint stamps and
  emoji plus generated pictures) decoded, quarantined, near-deduplicated and tokenized on Spark;
- ``validate``: the GX suite on the manifest (unique pairs, token counts, languages, no group
  across splits); a failure stops the run here;
- ``train``: the MoE image-text transformer on DeepSpeed, experts split over the processes;
- ``evaluate``: image->text and text->image recall@1/5 on the held-out split, beside the dense
  twin's (same active parameters);
- ``register``: new MLflow model version; champion only when its mean recall@1 is no worse
  than the champion's within ``CASCADE_MULTIMODAL_RECALL_TOLERANCE``.

Nothing is deployed: the model is not served.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable, dag

from cascade.assets import (
    ASSET_IMAGES_CORPUS,
    ASSET_IMAGES_DATA_LANDED,
    ASSET_MULTIMODAL_CHAMPION,
    MULTIMODAL_EVENT_SELECTORS,
)
from cascade.dag_steps import chain_steps, resolve_partition, watched_asset
from cascade.events import release_failed_run

images_landed = watched_asset(
    ASSET_IMAGES_DATA_LANDED,
    watcher="images_data_landed_watcher",
    selectors=MULTIMODAL_EVENT_SELECTORS,
)
images_corpus = Asset(ASSET_IMAGES_CORPUS)
multimodal_champion = Asset(ASSET_MULTIMODAL_CHAMPION)


@dag(
    dag_id="multimodal",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 5 * * *", timezone="UTC"), assets=images_landed
    ),
    catchup=False,
    max_active_runs=1,
    on_failure_callback=release_failed_run,
    tags=["cascade", "multimodal", "images"],
    default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=30)},
    doc_md=__doc__,
)
def multimodal() -> None:
    chain_steps(
        "multimodal",
        resolve_partition(images_landed),
        {
            "corpus": {"outlets": [images_corpus], "execution_timeout": dt.timedelta(minutes=30)},
            "validate": {"execution_timeout": dt.timedelta(minutes=10)},
            "train": {"execution_timeout": dt.timedelta(minutes=60)},
            "evaluate": {"execution_timeout": dt.timedelta(minutes=60)},
            "register": {
                "outlets": [multimodal_champion],
                "execution_timeout": dt.timedelta(minutes=10),
            },
        },
    )


multimodal()
