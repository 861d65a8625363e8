"""The ``ctr_cross`` pipeline's steps in order: a landed generated log -> cross statistics ->
gate -> Feast online store; the next day's batch with too many bad rows fails the gate and publishes
nothing, so serving keeps the last good partition."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cascade import step_runner
from cascade.config import load_group, load_settings
from cascade.lake import Lake
from cascade.pipeline_registry import get_pipeline
from cascade.step_context import StepContext
from jobs import ctr_cross_stats as job
from jobs import ctr_cross_stats_gate as gate
from pipelines import ctr_cross as pipeline

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DS, NEXT_DS = "2026-11-22", "2026-11-23"


def online(pair: str, keys: list[dict]) -> pd.DataFrame:
    from domains.ctr.feature_store import feature_store, online_cross_features

    return online_cross_features(feature_store(load_settings()), pair, keys)


def land_generated(home: Path, ds: str) -> None:
    """``cascade land impressions --source generated --ds DS``: the pipeline makes up no log."""
    from cascade.landing import land

    land(Lake(home / "lake"), pipeline.IMPRESSIONS, ds, source="generated")


def partition(pair: str, ds: str) -> pd.DataFrame:
    root = load_settings().lake_root / "features" / "ctr_cross" / "generated" / pair
    return pd.read_parquet(root / f"dt={ds}")


def test_a_passed_partition_reaches_the_online_store_and_a_failed_gate_publishes_nothing(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setenv("CASCADE_CROSS_IMPRESSIONS", "20000")
    monkeypatch.delenv("CASCADE_CROSS_SOURCE", raising=False)
    land_generated(tmp_path, DS)
    results = {
        name: step_runner.run_step(name, DS, "ctr_cross")
        for name in get_pipeline("ctr_cross").step_names
    }
    assert results["log"]["landed_from"] == "generated" and results["log"]["rows"] == 20_000
    assert results["stats"]["input_rows"] == 20_000 and results["stats"]["quarantined_rows"] == 0
    assert results["validate"]["success"]
    assert pipeline.BUILT_IN_PAIRS == tuple(p.name for p in job.GENERATED_PAIRS)
    assert results["feast"]["feature_views"] == [f"cross_{p}" for p in pipeline.BUILT_IN_PAIRS]
    for name in get_pipeline("ctr_cross").step_names:
        assert step_runner.summary_path(name, DS, "ctr_cross").is_file()

    # The online store answers with the partition's values, key by key.
    expected = {pair: partition(pair, DS).head(5) for pair in ("user", "user_cat", "item_pos")}
    for pair, rows in expected.items():
        keys = rows[list(job.PAIRS_BY_NAME[pair].keys)]
        got = online(pair, keys.to_dict("records"))
        for column in (f"{pair}_imp_30d", f"{pair}_ctr_7d", f"{pair}_decay_ctr"):
            assert got[column].tolist() == pytest.approx(rows[column].astype(float).tolist())
    unknown = online("user_cat", [{"user_id": 10**12, "item_category": "c0"}])
    assert math.isnan(unknown["user_cat_ctr_30d"].iloc[0])

    # Next day: a landed log where 5% of the rows have an invalid click.
    landing = tmp_path / "lake" / "landing" / "impressions"
    good = spark.read.parquet(str(landing / f"dt={DS}"))
    bad = good.limit(1_000).withColumn("click", F.lit(7))
    good.unionByName(bad).write.parquet(str(landing / f"dt={NEXT_DS}"))
    assert step_runner.run_step("log", NEXT_DS, "ctr_cross")["landed_from"] == "unrecorded"
    # A passed verdict from an earlier build of NEXT_DS must not vouch for the rebuilt one.
    report = job.CrossLake(Lake(tmp_path / "lake"), "generated").gate_report(NEXT_DS)
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({"success": True, "failed": []}))
    summary = step_runner.run_step("stats", NEXT_DS, "ctr_cross")
    assert not report.exists()
    assert summary["quarantined_rows"] == 1_000
    quarantine = pd.read_parquet(summary["quarantine_path"])
    assert len(quarantine) == 1_000 and set(quarantine["reason"]) == {"click is not 0 or 1"}
    with pytest.raises(gate.GateFailed, match="quarantine_fraction"):
        step_runner.run_step("validate", NEXT_DS, "ctr_cross")
    with pytest.raises(pipeline.GateNotPassed, match="the gate failed"):
        step_runner.run_step("feast", NEXT_DS, "ctr_cross")
    # Serving still reads the last good partition.
    rows = expected["user_cat"]
    got = online("user_cat", rows[["user_id", "item_category"]].to_dict("records"))
    assert got["user_cat_ctr_7d"].tolist() == pytest.approx(rows["user_cat_ctr_7d"].tolist())
    assert json.loads(report.read_text())["success"] is False


def test_feast_refuses_a_partition_the_gate_never_saw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    with pytest.raises(pipeline.GateNotPassed, match="run step 'validate'"):
        pipeline.feast(StepContext.build(pipeline.PIPELINE, "feast", DS))


def test_source_and_size_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setenv("CASCADE_CROSS_SOURCE", "ml100k")
    monkeypatch.setenv("CASCADE_CROSS_IMPRESSIONS", "5000")

    def knobs() -> pipeline.CrossSettings:
        return load_group(pipeline.CrossSettings)

    assert pipeline.source_name(load_settings(), knobs()) == "ml100k"
    assert knobs().impressions == 5000
    from jobs.impression_log import GeneratorConfig

    # The generator's own span unless set (named in the pipeline, which parses without Spark).
    assert knobs().generated_days == pipeline.DEFAULT_GENERATED_DAYS == GeneratorConfig().days
    monkeypatch.setenv("CASCADE_CROSS_GENERATED_DAYS", "14")
    assert knobs().generated_days == 14
    monkeypatch.setenv("CASCADE_CROSS_SOURCE", "clicks.csv")
    with pytest.raises(ValueError, match="CASCADE_CROSS_SOURCE must be of the form"):
        knobs()
    monkeypatch.setenv("CASCADE_CROSS_SOURCE", "shop_clicks")
    with pytest.raises(ValueError, match="unknown log source 'shop_clicks'; registered: generated"):
        pipeline.source_name(load_settings(), knobs())
    (tmp_path / "log_sources.toml").write_text(
        '[sources.shop_clicks]\nformat = "csv"\ncolumns = { user_id = "uid" }\n'
    )
    assert pipeline.source_name(load_settings(), knobs()) == "shop_clicks"
    monkeypatch.setenv("CASCADE_CROSS_IMPRESSIONS", "0")
    with pytest.raises(ValueError, match=">= 1"):
        knobs()
    monkeypatch.setenv("CASCADE_CROSS_IMPRESSIONS", "5000")
    monkeypatch.setenv("CASCADE_CROSS_GENERATED_DAYS", "0")
    with pytest.raises(ValueError, match=">= 1"):
        knobs()


def test_history_days_builds_the_missing_daily_partitions_a_training_set_joins(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first run with ``history_days`` builds the days before ``ds`` from ``ds``'s log (its
    later rows left out, not quarantined) or from a day's own landed log, gates each, and a
    point-in-time training set over those days reads each impression's own day."""
    import datetime as dt

    from jobs import impression_log
    from jobs.ctr_training_set import (
        SERVED_PAIRS,
        MissingPartitions,
        impression_days,
        partition_training_set,
        training_set_from_lake,
    )
    from serving.online_fields import SERVED_KEYS

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setenv("CASCADE_CROSS_IMPRESSIONS", "6000")
    monkeypatch.setenv("CASCADE_CROSS_HISTORY_DAYS", "3")
    monkeypatch.delenv("CASCADE_CROSS_SOURCE", raising=False)
    day = [(dt.date.fromisoformat(DS) - dt.timedelta(days=n)).isoformat() for n in (3, 2, 1)]
    lake = Lake(tmp_path / "lake")
    own = pipeline.landing_dir(lake, day[1])
    impression_log.write(
        spark, impression_log.GeneratorConfig(impressions=6000, end_ds=day[1], seed=5), own
    )
    assert pipeline.history_window(DS, 3) == day

    land_generated(tmp_path, DS)
    assert (
        pipeline.log(StepContext.build(pipeline.PIPELINE, "log", DS))["landed_from"] == "generated"
    )
    stats = pipeline.stats(StepContext.build(pipeline.PIPELINE, "stats", DS))
    built = stats["history_partitions"]
    assert list(built) == day and all(b["built"] for b in built.values())
    assert [built[d]["log"] for d in day] == [f"ds={DS}'s", "its own", f"ds={DS}'s"]
    where = job.CrossLake(lake, "generated")
    log = pd.read_parquet(pipeline.landing_dir(lake, DS))
    latest = json.loads(where.summary(day[2]).read_text())
    assert latest["history"] is True and latest["quarantined_rows"] == 0
    cut = pd.Timestamp(day[2], tz="UTC")
    assert latest["input_rows"] == int((log.event_timestamp < cut).sum()) < len(log)
    assert json.loads(where.summary(day[1]).read_text())["input_rows"] == 6000

    verdict = pipeline.validate(StepContext.build(pipeline.PIPELINE, "validate", DS))
    assert verdict["success"]
    assert verdict["history_partitions"] == {d: {"success": True} for d in day}
    assert "history_partitions" not in pipeline.stats(
        StepContext.build(pipeline.PIPELINE, "stats", DS)
    )  # nothing missing any more
    assert "history_partitions" not in pipeline.validate(
        StepContext.build(pipeline.PIPELINE, "validate", DS)
    )

    # The last day's impressions, each with the statistics of the days before it.
    chosen = log[impression_days(log.event_timestamp) == day[2]]
    frame, _ = training_set_from_lake(chosen, lake.root, require_gate=True)
    assert len(frame) == len(chosen) and frame["user_ctr_30d"].notna().mean() > 0.5
    previous = log[impression_days(log.event_timestamp) == day[1]].groupby("user_id").size()
    on_last = frame[impression_days(frame.event_timestamp) == day[2]]
    want = on_last.user_id.map(previous).fillna(0)
    assert (on_last.user_imp_1d.fillna(0).to_numpy() == want.to_numpy()).all()

    # The pre-ranking training set of partition DS, as the pipeline's step builds it: the clean
    # impressions of the 3 days before it, with the statistics a server can key (user, item,
    # user x category); the step finds the published partition's source and log by itself.
    from pipelines import ctr_preranking

    monkeypatch.setenv("CASCADE_PRERANKING_TRAIN_DAYS", "3")
    monkeypatch.delenv("CASCADE_PRERANKING_SOURCE", raising=False)
    written = ctr_preranking.training_set(
        StepContext.build(ctr_preranking.PIPELINE, "training_set", DS)
    )
    in_days = impression_days(log.event_timestamp).isin(day)
    assert (written["rows"], written["clicks"]) == (in_days.sum(), log.click[in_days].sum())
    assert written["pairs"] == ["user", "item", "user_cat"] and written["days"] == day
    assert written["source"] == "generated"
    assert all(set(pair.keys) <= SERVED_KEYS for pair in SERVED_PAIRS)
    folder = lake.training_set("preranking", DS)
    assert Path(written["data"]).parent == folder
    trained = pd.read_parquet(written["data"])
    assert trained.event_timestamp.is_monotonic_increasing
    last = trained[impression_days(trained.event_timestamp) == day[2]]
    assert last.user_imp_1d.fillna(0).tolist() == last.user_id.map(previous).fillna(0).tolist()
    declared = json.loads(Path(written["fields_file"]).read_text())["fields"]
    kinds = {f["name"]: f["kind"] for f in declared}
    assert kinds["user_ctr_7d"] == "user" and kinds["item_ctr_30d"] == "item"
    assert kinds["user_cat_ctr_1d"] == "cross" and not any(n.startswith("seg_") for n in kinds)
    provenance = json.loads((folder / "training.json").read_text())
    assert provenance["source"] == "generated" and provenance["fields"] == written["fields"]
    with pytest.raises(
        MissingPartitions,
        match=r"\[.2026-11-18.\] never built: build them .*HISTORY_DAYS=4\), or train on the 3 "
        r"latest days that have one \(CASCADE_PRERANKING_TRAIN_DAYS=3\)",
    ):
        partition_training_set(
            DS,
            tmp_path / "refused",
            spark=spark,
            lake_root=lake.root,
            source="generated",
            log_path=pipeline.landing_dir(lake, DS),
            train_days=4,
        )
    monkeypatch.setenv("CASCADE_PRERANKING_SOURCE", "ml100k")
    with pytest.raises(MissingPartitions, match="source 'ml100k' for ds=2026-11-22"):
        ctr_preranking.training_set(StepContext.build(ctr_preranking.PIPELINE, "training_set", DS))


def test_a_sparse_log_is_refused_in_one_line_before_any_training_process_starts(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generated log of 4,000 impressions (a few hundred clicks over 35 days) goes through
    ctr_cross and the training set; the train step then refuses it in one line, recorded in
    timing.json, without launching torchrun. One training day (and so one history partition):
    the refusal needs a sparse training set, not a week of them (each partition is a Spark job
    and a gate)."""
    from cascade.step_runner import TIMING_FILE, run_step, summary_path
    from models.preranking import cascade_train
    from models.preranking.fscd_data import DegenerateData
    from pipelines import ctr_preranking

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setenv("CASCADE_MLFLOW_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("CASCADE_CROSS_IMPRESSIONS", "4000")
    monkeypatch.setenv("CASCADE_CROSS_HISTORY_DAYS", "1")
    monkeypatch.setenv("CASCADE_PRERANKING_TRAIN_DAYS", "1")
    monkeypatch.delenv("CASCADE_CROSS_SOURCE", raising=False)
    for knob in ("SOURCE", "CONFIG", "EPOCHS", "LR", "VALIDATION_FRACTION"):
        monkeypatch.delenv(f"CASCADE_PRERANKING_{knob}", raising=False)

    land_generated(tmp_path, DS)
    assert pipeline.log(StepContext.build(pipeline.PIPELINE, "log", DS))["rows"] == 4000
    lake = Lake(tmp_path / "lake")
    clicks = int(pd.read_parquet(pipeline.landing_dir(lake, DS)).click.sum())
    assert 100 < clicks < 1_000
    pipeline.stats(StepContext.build(pipeline.PIPELINE, "stats", DS))
    assert pipeline.validate(StepContext.build(pipeline.PIPELINE, "validate", DS))["success"]
    built = ctr_preranking.training_set(
        StepContext.build(ctr_preranking.PIPELINE, "training_set", DS)
    )
    assert 0 < built["clicks"] < 200

    launched: list[object] = []
    monkeypatch.setattr(cascade_train, "launch_for_result", lambda *a, **k: launched.append(a))
    with pytest.raises(DegenerateData) as refused:
        run_step("train", DS, "ctr_preranking")
    message = str(refused.value)
    assert launched == []
    assert "\n" not in message and "FSCD needs at least 100 clicks" in message
    assert "CASCADE_PRERANKING_VALIDATION_FRACTION" in message
    timing = summary_path("train", DS, "ctr_preranking").with_name(TIMING_FILE)
    assert json.loads(timing.read_text())["error"] == f"DegenerateData: {message}"
