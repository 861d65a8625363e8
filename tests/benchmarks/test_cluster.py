"""The cluster benchmark's readings of the engines' own records (the full run is
``cascade bench cluster``: it starts the whole cluster stack twice and takes most of an hour)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import cluster
from benchmarks.online_materialize import write_pair_partition
from cascade.config import load_settings
from cascade.data_services import spark_event_dir
from cascade.lake import Lake
from infra.spark_standalone import worker_dir


def test_spark_workers_are_read_from_the_application_folders(tmp_path: Path) -> None:
    settings = load_settings({"CASCADE_HOME": str(tmp_path), "CASCADE_PROFILE": "cluster"})
    events = spark_event_dir(settings)
    events.mkdir(parents=True)
    for app in ("20261126165547-0000", "20261126170038-0001"):
        (events / f"eventlog_v2_app-{app}").mkdir()
    (events / "not-an-app").mkdir()
    apps = cluster.spark_apps(settings)
    assert apps == {"20261126165547-0000", "20261126170038-0001"}
    assert cluster.workers_of_apps(settings, apps) == []
    (worker_dir(settings, 2) / "app-20261126170038-0001").mkdir(parents=True)
    assert cluster.workers_of_apps(settings, apps) == [2]
    (worker_dir(settings, 1) / "app-20261126165547-0000").mkdir(parents=True)
    assert cluster.workers_of_apps(settings, apps) == [1, 2]
    # An application of another run does not count.
    assert cluster.workers_of_apps(settings, {"20261126170158-0002"}) == []


def test_a_training_node_is_killed_only_after_the_retry_checkpointed(tmp_path: Path) -> None:
    from cascade.lake import Lake

    settings = load_settings({"CASCADE_HOME": str(tmp_path), "CASCADE_PROFILE": "cluster"})
    log = Lake(settings.lake_root).reports("train", cluster.FAULTS_DS) / "train.log"
    assert not cluster._checkpointed_since_resume(settings, cluster.FAULTS_DS)
    log.parent.mkdir(parents=True)
    lines = [
        "[node 0] [cascade] select: checkpoint at step 50 in /x",
        "[node 0] [cascade] select: checkpoint at step 100 in /x",
    ]
    log.write_text("\n".join(lines) + "\n")
    # The first try checkpointed, and nothing resumed yet.
    assert not cluster._checkpointed_since_resume(settings, cluster.FAULTS_DS)
    assert cluster.resumes(settings, cluster.FAULTS_DS) == []
    assert cluster.last_checkpoint(settings, cluster.FAULTS_DS) == "select@100"
    lines.append("[node 0] [cascade] select: resumed at step 100 from /x")
    log.write_text("\n".join(lines) + "\n")
    assert not cluster._checkpointed_since_resume(settings, cluster.FAULTS_DS)
    lines.append("[node 0] [cascade] select: checkpoint at step 150 in /x")
    log.write_text("\n".join(lines) + "\n")
    assert cluster._checkpointed_since_resume(settings, cluster.FAULTS_DS)
    lines.append("[node 0] [cascade] select: resumed at step 150 from /x")
    log.write_text("\n".join(lines) + "\n")
    assert not cluster._checkpointed_since_resume(settings, cluster.FAULTS_DS)
    assert cluster.resumes(settings, cluster.FAULTS_DS) == ["select@100", "select@150"]
    assert cluster.last_checkpoint(settings, cluster.FAULTS_DS) == "select@150"


def test_the_materialization_partition_is_not_one_the_pipeline_runs_build(tmp_path: Path) -> None:
    """The cluster benchmark loads its synthetic ``user_cat`` partition after a pipeline run
    that wrote the real one of ``DS``: the two must not share a path (it failed with "File
    exists" when they did), and an existing partition is never overwritten."""
    assert cluster.MATERIALIZE_DS not in (cluster.DS, cluster.FAULTS_DS)
    lake = Lake(tmp_path)
    written = write_pair_partition(lake, 40, 2, ds=cluster.MATERIALIZE_DS)
    assert f"dt={cluster.MATERIALIZE_DS}" in str(written) and len(list(written.iterdir())) == 2
    write_pair_partition(lake, 40, 2, ds=cluster.DS)  # the pipeline's day: another path
    with pytest.raises(FileExistsError):
        write_pair_partition(lake, 40, 2, ds=cluster.DS)


def test_lost_and_duplicated_rows_are_counted_from_the_landed_log_to_the_training_set(
    tmp_path: Path,
) -> None:
    import json

    import pandas as pd

    from cascade.lake import TRAINING_PROVENANCE
    from cascade.landing import landing_dir

    stamps = pd.to_datetime(
        ["2026-11-21 08:00:00", "2026-11-21 09:00:00", "2026-11-22 10:00:00", "2026-11-20 23:59:59"]
    )
    landed = pd.DataFrame(
        {"user_id": [1, 2, 3, 4], "item_id": [7, 7, 8, 9], "event_timestamp": stamps}
    ).assign(click=[1, 0, 0, 1], position=[1, 2, 3, 1])
    settings = load_settings({"CASCADE_HOME": str(tmp_path)})
    lake = Lake(settings.lake_root)
    landing = landing_dir(lake, "impressions", "2026-11-23")
    landing.mkdir(parents=True)
    landed.to_parquet(landing / "part-0.parquet")
    built = lake.training_set("preranking", "2026-11-23")
    built.mkdir(parents=True)
    (built / TRAINING_PROVENANCE).write_text(json.dumps({"days": ["2026-11-21", "2026-11-22"]}))
    # The training days' three rows, each once (the 20th is not a training day): all accounted.
    trained = landed.iloc[:3].drop(columns="position").assign(genre="x")
    trained["event_timestamp"] = trained["event_timestamp"].dt.tz_localize("UTC")
    trained.to_parquet(built / "data.parquet")
    rows = cluster.faults_run_rows(settings, "2026-11-23")
    assert rows == {"landed_rows": 3, "training_rows": 3, "lost": 0, "duplicates": 0}
    # A row written twice and one never written: one duplicate, one lost.
    pd.concat([trained.iloc[[0, 0, 2]]]).to_parquet(built / "data.parquet")
    rows = cluster.faults_run_rows(settings, "2026-11-23")
    assert rows == {"landed_rows": 3, "training_rows": 3, "lost": 1, "duplicates": 1}
    # A click flipped on the way is one row lost and one that was never landed.
    flipped = trained.assign(click=[1, 1, 0])
    assert cluster.rows_accounted(landed.iloc[:3], flipped)["lost"] == 1
