"""ASR pipeline: Spark speech corpus -> GX -> DeepSpeed ConvDFSMN (RSQ int8) -> compile -> serving.

Runs daily at 04:00 UTC and whenever a ``cascade.data.landed`` (dataset ``speech``) or
``cascade.retrain.requested`` (model ``asr``) event arrives on Kafka, through the same shared
watcher stream, claim ledger and coalescing as ``ctr_preranking``. Each task calls one step of
:mod:`models.asr.pipeline` via :mod:`cascade.steps`, the functions DVC's ``asr_*`` stages run
(``cascade step NAME --pipeline asr --ds DS``):

- ``corpus``: the partition's landed WAVs + transcripts (a synthetic batch when none landed)
  validated, resampled, featurized and split by voice on Spark; bad files quarantined;
- ``validate``: the GX suite on the manifest (durations, rates, lengths, voice-disjoint splits);
- ``train``: fp32 training, then range-scaled int8 QAT with distillation, on DeepSpeed;
- ``compile``: the int8 ``.pt2`` artifact with parity and accuracy gates;
- ``register``: new MLflow model version; champion only when its CER on the held-out voices is
  no worse than the champion's and the compile gate passed;
- ``deploy``: waits until the server transcribes with the champion.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable, dag

from cascade.assets import (
    ASR_EVENT_SELECTORS,
    ASSET_ASR_CHAMPION,
    ASSET_SPEECH_CORPUS,
    ASSET_SPEECH_DATA_LANDED,
)
from cascade.dag_steps import chain_steps, resolve_partition, watched_asset
from cascade.events import release_failed_run

speech_landed = watched_asset(
    ASSET_SPEECH_DATA_LANDED, watcher="speech_data_landed_watcher", selectors=ASR_EVENT_SELECTORS
)
speech_corpus = Asset(ASSET_SPEECH_CORPUS)
asr_champion = Asset(ASSET_ASR_CHAMPION)


@dag(
    dag_id="asr",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 4 * * *", timezone="UTC"), assets=speech_landed
    ),
    catchup=False,
    max_active_runs=1,
    on_failure_callback=release_failed_run,
    tags=["cascade", "asr", "speech"],
    default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=30)},
    doc_md=__doc__,
)
def asr() -> None:
    chain_steps(
        "asr",
        resolve_partition(speech_landed),
        {
            "corpus": {"outlets": [speech_corpus], "execution_timeout": dt.timedelta(minutes=30)},
            "train": {"execution_timeout": dt.timedelta(minutes=60)},
            "compile": {"execution_timeout": dt.timedelta(minutes=20)},
            "register": {"outlets": [asr_champion]},
        },
    )


asr()
