"""The real local stack for end-to-end tests: its own state folder and free ports, started once
for this package and stopped after its last test, so a developer's running stack is never
touched and the rest of the suite does not share two cores with an idle Airflow and broker
(the two-process ASR training test: 47 s alone, 240 s beside them; each collective waits for a
descheduled rank)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cascade.config import Settings

DS = "2026-11-22"


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    from infra.stack import private_stack
    from models.preranking.cascade_train import CHECKPOINT_EVERY_ENV

    # The asr and multimodal DAGs train their seconds-long debug flavors here; the multimodal
    # corpus is ~250 pairs and its dense twin is left to tests/models/test_multimodal_pipeline.py.
    env = {
        "CASCADE_ASR_CONFIG": "debug",
        "CASCADE_MULTIMODAL_CONFIG": "debug",
        "CASCADE_MULTIMODAL_GENERATED": "200",
        "CASCADE_MULTIMODAL_SOURCE_LIMIT": "15",
        "CASCADE_MULTIMODAL_DENSE_TWIN": "0",
        # The pre-ranker trains on the day before the partition (1/14 of a generated log
        # spanning 14 days: ~8,600 impressions, ~156 clicks in its validation split, where
        # FSCD needs 100): ctr_cross builds that day's statistics first. 300,000 over the
        # default 35 days gave that day as many rows, with 2.5 times the rows for the
        # statistics job, the gate and the online store; each further day would be one more
        # pass of the statistics job and of the gate.
        "CASCADE_CROSS_IMPRESSIONS": "120000",
        "CASCADE_CROSS_GENERATED_DAYS": "14",
        "CASCADE_CROSS_HISTORY_DAYS": "1",
        "CASCADE_PRERANKING_TRAIN_DAYS": "1",
        "CASCADE_PRERANKING_EPOCHS": "10",
        # Ten epochs on ~8,500 impressions prune no field: no cost budget, so the run shows the
        # wiring (the budget's refusal has its own tests in tests/models).
        "CASCADE_PRERANKING_COST_BUDGET": "1",
        # One event per DAG here: a 5 s quiet window instead of 15 s lets each run's
        # resolve_partition free its Airflow slot sooner (two slots serve the four DAGs).
        "CASCADE_COALESCE_WINDOW_S": "5",
        # Pre-ranker phases checkpoint at steps 25 and 50 of the ~66 the partition gives each
        # (10 epochs), so the fault test's kill lands inside the phase it checkpointed, between
        # two of its loss points (every 20 steps).
        CHECKPOINT_EVERY_ENV: "25",
        # Runs start from the tests' events only: no cron tick (ctr_monitor's latest one is run
        # when the DAG appears) takes an Airflow slot or a partition mid-test.
        "CASCADE_AIRFLOW_SCHEDULES": "0",
        # The fault test kills a training task on purpose: its retry starts seconds later
        # instead of after the production back-off (30 s, doubled per try).
        "CASCADE_RETRY_DELAY_S": "2",
    }
    with private_stack(tmp_path_factory.mktemp("cascade-home"), env=env) as settings:
        yield settings


def export(dataset: str, source: str, folder: Path) -> dict[str, int]:
    """A batch of ``dataset`` from its named ``source`` (generated, synthesized), written into
    ``folder`` outside the lake in the layout the source writes, a standard format: the files a
    producer hands over. Returns the source's counts."""
    from cascade.landing import get_dataset

    folder.mkdir(parents=True)
    return dict(get_dataset(dataset).sources[source](folder, ds=DS))


def land_with_command(dataset: str, folder: Path, fmt: str) -> None:
    """``cascade land DATASET FOLDER --ds DS --format FMT``, as a user lands an export (the
    test's own event starts the run, so the command publishes none)."""
    from cascade import cli

    # --debug: a refusal raises here with its traceback instead of ending in an exit code.
    args = ["--debug", "land", dataset, str(folder), "--ds", DS, "--format", fmt, "--no-publish"]
    assert cli.main(args) == 0


@pytest.fixture(scope="package")
def triggered(stack: Settings, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every pipeline's Kafka event, published together: the DAG runs overlap, as they would in
    production, and the session waits for the slowest one rather than for each in turn.

    No pipeline makes up its data: each kind's batch is written by its named source as an
    export in a standard format (impressions as parquet, speech as wav/ + transcripts.jsonl,
    images as images/ + captions.jsonl) and landed with ``cascade land``, whose importers read,
    check and rewrite it as they would a user's; the events then start the runs.
    ``exported``: each dataset's counts from its source."""
    from infra.demo import trigger
    from jobs import ctr_cross_stats
    from jobs.spark_sessions import active_or_new

    exports = tmp_path_factory.mktemp("exports")
    exported: dict[str, dict[str, int]] = {}

    def session() -> Any:
        return ctr_cross_stats.build_session(stack, app="cascade.e2e.impressions")

    # The generator and the importer share one Spark session (one start, warm code).
    with active_or_new(session):
        exported["impressions"] = export("impressions", "generated", exports / "impressions")
        land_with_command("impressions", exports / "impressions", "parquet")
    # One impressions event: ctr_cross publishes the partition, and that starts ctr_preranking.
    # Published first, the longest chain starts while the other batches land.
    preranking = trigger(DS, settings=stack)
    exported["speech"] = export("speech", "synthetic", exports / "speech")
    land_with_command("speech", exports / "speech", "jsonl")
    exported["images"] = export("images", "generated", exports / "images")
    land_with_command("images", exports / "images", "image_folder")
    return {
        "ctr_preranking": preranking,
        "asr": trigger(DS, settings=stack, dag_id="asr", dataset="speech"),
        "multimodal": trigger(DS, settings=stack, dag_id="multimodal", dataset="images"),
        "ctr_cross": preranking.of("ctr_cross"),
        "exported": exported,
    }


def finished_run(
    stack: Settings, triggered: dict[str, Any], dag_id: str, tasks: tuple[str, ...]
) -> dict[str, Any]:
    """The asset-triggered run of ``dag_id`` that its Kafka event started, once it finished, with
    the return values of ``tasks``."""
    from infra.demo import wait_for_triggered

    return wait_for_triggered(triggered[dag_id], settings=stack, timeout_s=1800, result_tasks=tasks)


@pytest.fixture(scope="package")
def pipeline_run(stack: Settings, triggered: dict[str, Any]) -> dict:
    """One asset-triggered ``ctr_preranking`` run: a Kafka ``impressions`` event started
    ``ctr_cross``, whose published partition started it."""
    return finished_run(
        stack, triggered, "ctr_preranking", ("train", "compile", "register", "deploy")
    )


@pytest.fixture(scope="package")
def asr_run(stack: Settings, triggered: dict[str, Any]) -> dict:
    """One asset-triggered ``asr`` run started by a Kafka event (dataset ``speech``)."""
    return finished_run(
        stack, triggered, "asr", ("corpus", "train", "compile", "register", "deploy")
    )


@pytest.fixture(scope="package")
def multimodal_run(stack: Settings, triggered: dict[str, Any]) -> dict:
    """One asset-triggered ``multimodal`` run started by a Kafka event (dataset ``images``)."""
    return finished_run(
        stack, triggered, "multimodal", ("corpus", "validate", "train", "evaluate", "register")
    )


@pytest.fixture(scope="package")
def cross_run(stack: Settings, triggered: dict[str, Any]) -> dict:
    """One asset-triggered ``ctr_cross`` run started by a Kafka event (dataset ``impressions``)."""
    return finished_run(stack, triggered, "ctr_cross", ("log", "stats", "validate", "feast"))
