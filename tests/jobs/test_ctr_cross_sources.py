"""Log sources registered by name, and the engine's answers to degenerate batches: a landed CSV
that declares its own source, every bad row quarantined with its raw line, an all-bad or stale
batch that stops with a clear error and publishes nothing."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from cascade.config import Settings
from cascade.lake import Lake
from cascade.step_context import StepContext
from jobs import ctr_cross_stats as job
from jobs import ctr_log_sources as sources
from pipelines import ctr_cross as pipeline

DS = "2026-11-22"
T0 = dt.datetime(2026, 11, 22)
SCHEMA = ", ".join(f"{name} {sql_type}" for name, sql_type in sources.LOG_SCHEMA)

SHOP_SOURCES = """
[sources.shop_clicks]
format = "csv"
options = { header = "true" }
click = "action = 'click'"
description = "clicks exported by a shop"

[sources.shop_clicks.columns]
user_id = "uid"
item_id = "sku"
event_timestamp = "ts"
user_segment = "seg"
item_category = "cat"
"""


def test_examination_never_exceeds_one() -> None:
    # Position 3 out-clicked the top position by chance: it is still examined at most always.
    got = job.examination_by_position([(1, 100, 10), (2, 100, 5), (3, 100, 20)])
    assert got == {1: 1.0, 2: 0.5, 3: 1.0}


def test_a_prior_at_its_clamp_flags_its_column_as_constant() -> None:
    config = job.CrossStatsConfig(pairs=(job.SEG_CAT,), windows_days=(1, 7))
    clamp = config.max_prior_strength
    priors = {
        "seg_cat": {
            "ctr_1": (0.1 * clamp, 0.9 * clamp),
            "ctr_7": (2.0, 18.0),
            "dctr_1": (1.0, 9.0),
            "dctr_7": (1.0, 9.0),
            "decay_None": (0.05 * clamp, 0.95 * clamp),
        }
    }
    assert job.constant_features(priors, config) == {
        "seg_cat": ["seg_cat_ctr_1d", "seg_cat_decay_ctr"]
    }


def test_the_cli_says_which_days_ds_covers(capsys: pytest.CaptureFixture[str]) -> None:
    assert job.window_text("2026-11-22", (1, 7)) == (
        "windows end at 2026-11-22 00:00 UTC, exclusive "
        "(1d = 2026-11-21 .. 2026-11-21; 7d = 2026-11-15 .. 2026-11-21)"
    )
    with pytest.raises(SystemExit):
        job.main(["--help"])
    assert "excludes it" in " ".join(capsys.readouterr().out.split())


def test_source_files_are_checked_and_names_are_unique(tmp_path: Path) -> None:
    path = tmp_path / "log_sources.toml"
    path.write_text(SHOP_SOURCES)
    shop = sources.resolve("shop_clicks", path)
    assert (shop.format, shop.mapping.columns["item_id"]) == ("csv", "sku")
    assert set(sources.registered_sources(path)) == {"generated", "landed", "ml100k", "shop_clicks"}
    path.write_text('[sources.generated]\nformat = "csv"\n')
    with pytest.raises(ValueError, match="'generated' .* is already registered"):
        sources.registered_sources(path)
    path.write_text('[sources.shop]\nformat = "xlsx"\n')
    with pytest.raises(ValueError, match="format 'xlsx' not in"):
        sources.registered_sources(path)
    path.write_text('[sources.shop]\ncolumns = { price = "p" }\n')
    with pytest.raises(ValueError, match=r"names \['price'\], not in the schema"):
        sources.registered_sources(path)
    with pytest.raises(sources.UnknownSource, match="registered: generated, landed, ml100k"):
        sources.resolve("nowhere", None)


def shop_log(rows: int) -> pd.DataFrame:
    """A shop's CSV export: its own column names, clicks as an action, one bad id."""
    frame = pd.DataFrame(
        {
            "uid": [str(i % 40) for i in range(rows)],
            "sku": [i % 25 for i in range(rows)],
            "ts": [(T0 - dt.timedelta(hours=1 + i % 200)).isoformat(sep=" ") for i in range(rows)],
            "seg": [f"s{i % 3}" for i in range(rows)],
            "cat": [f"c{i % 4}" for i in range(rows)],
            "action": ["click" if i % 7 == 0 else "view" for i in range(rows)],
        }
    )
    frame.loc[5, "uid"] = "user-abc"  # not an integer id: quarantined with its raw value
    return frame


@pytest.mark.spark
def test_a_landed_log_declares_its_source_and_keeps_its_name_everywhere(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    sources_file = tmp_path / "sources.toml"
    sources_file.write_text(SHOP_SOURCES)
    monkeypatch.setenv("CASCADE_CROSS_SOURCES_FILE", str(sources_file))
    settings = Settings(home=tmp_path / "home")
    landing = pipeline.landing_dir(Lake(settings.lake_root), DS)
    landing.mkdir(parents=True)
    shop_log(400).to_csv(landing / "part-0.csv", index=False)
    (landing / "_SOURCE").write_text("shop_clicks\n")
    (landing / "_SUCCESS").touch()

    logged = pipeline.log(StepContext.build(pipeline.PIPELINE, "log", DS, platform=settings))
    summary = pipeline.stats(StepContext.build(pipeline.PIPELINE, "stats", DS, platform=settings))
    verdict = pipeline.validate(
        StepContext.build(pipeline.PIPELINE, "validate", DS, platform=settings)
    )

    assert (logged["source"], logged["landed_from"]) == ("shop_clicks", "unrecorded")
    assert summary["source"] == "shop_clicks"
    # No position and no context in the export: its users, its items and the crosses it can key.
    assert summary["pairs"] == ["user", "item", "seg_cat", "user_cat", "seg_item"]
    root = settings.lake_root / "features" / "ctr_cross" / "shop_clicks"
    assert all(Path(path).is_relative_to(root) for path in summary["paths"].values())
    assert summary["quarantined_by_reason"] == {"user_id is null or not an integer": 1}
    bad = pd.read_parquet(summary["quarantine_path"])
    assert "shop_clicks_log" in summary["quarantine_path"]
    assert json.loads(bad.line.iloc[0])["uid"] == "user-abc"
    assert verdict["success"] and "gx_ctr_cross_shop_clicks" in verdict["report"]
    written = pd.read_parquet(summary["paths"]["user_cat"])
    assert written.user_cat_clk_30d.sum() == 400 // 7 + 1 - (5 % 7 == 0)

    # Published with only the pairs it has: the online store answers them.
    published = pipeline.feast(StepContext.build(pipeline.PIPELINE, "feast", DS, platform=settings))
    assert published["feature_views"] == [
        f"cross_{p}" for p in ("user", "item", "seg_cat", "user_cat", "seg_item")
    ]
    from domains.ctr.feature_store import feature_store, online_cross_features
    from jobs.ctr_cross_features import cross_features_at

    key = written.iloc[0]
    online = online_cross_features(
        feature_store(settings),
        "user_cat",
        [{"user_id": int(key.user_id), "item_category": key.item_category}],
    )
    assert online.user_cat_clk_30d.iloc[0] == key.user_cat_clk_30d
    # No skew: the point-in-time value a training row of that day gets is the online one.
    rows = pd.DataFrame(
        {
            "user_id": written.user_id.astype("int64"),
            "item_category": written.item_category,
            "event_timestamp": pd.Timestamp(DS, tz="UTC") + pd.Timedelta(hours=12),
        }
    )
    offline = cross_features_at(rows, "user_cat", settings=settings, source="shop_clicks")
    online = online_cross_features(
        feature_store(settings),
        "user_cat",
        rows[["user_id", "item_category"]].to_dict("records"),
    )
    columns = [c for c in written.columns if c.startswith("user_cat_")]
    by_key = ["user_id", "item_category"]
    pd.testing.assert_frame_equal(
        offline.sort_values(by_key)[by_key + columns].reset_index(drop=True),
        online.sort_values(by_key)[by_key + columns].reset_index(drop=True),
        check_dtype=False,
    )


@pytest.mark.spark
def test_an_all_bad_batch_stops_with_a_clear_error_and_publishes_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    rows = [
        (None, 1, "s", "c", None, 1, T0 - dt.timedelta(days=1), 1),
        (None, 2, "s", "c", None, 1, T0 - dt.timedelta(days=2), 0),
        (3, 2, "s", "c", None, 1, T0 + dt.timedelta(hours=3), 0),
    ]
    folder = tmp_path / "log"
    spark.createDataFrame(rows, SCHEMA).write.parquet(str(folder))
    settings = Settings(home=tmp_path / "home")
    config = job.CrossStatsConfig(pairs=(job.SEG_CAT, job.USER_CAT), windows_days=(1, 7))

    with pytest.raises(job.EmptyBatch, match=r"no clean row in the 7-day window .* 3 input rows"):
        job.run(DS, log_path=folder, settings=settings, spark=spark, config=config)

    where = job.CrossLake(Lake(settings.lake_root), "generated")
    assert not where.pair(job.SEG_CAT, DS).exists() and not where.summary(DS).exists()
    bad = pd.read_parquet(where.quarantine(DS))
    assert sorted(bad.reason) == [
        sources.FUTURE_REASON,
        "user_id is null or not an integer",
        "user_id is null or not an integer",
    ]


@pytest.mark.spark
def test_a_ds_long_after_the_log_says_the_rows_are_older_than_the_window(
    spark: SparkSession, tmp_path: Path
) -> None:
    rows = [(1, 1, "s", "c", None, 1, T0 - dt.timedelta(days=40), 1)]
    folder = tmp_path / "log"
    spark.createDataFrame(rows, SCHEMA).write.parquet(str(folder))
    config = job.CrossStatsConfig(pairs=(job.SEG_CAT,), windows_days=(30,))
    settings = Settings(home=tmp_path / "home")
    with pytest.raises(job.EmptyBatch, match="1 older than the window"):
        job.run(DS, log_path=folder, settings=settings, spark=spark, config=config)
