"""The DuckDB peer of the cross statistics job does the same work: equal outputs on one log."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import SparkSession

from benchmarks import ctr_cross_duckdb as peer
from cascade.config import Settings
from jobs import ctr_cross_stats as job
from jobs import ctr_log_sources as sources
from jobs import impression_log as gen
from jobs.spark_sessions import UTC_MICROS, active_or_new, build_session

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DS = "2026-11-22"
T0 = dt.datetime(2026, 11, 22)  # naive UTC, as the session zone reads it
DAY = dt.timedelta(days=1)
SCHEMA = ", ".join(f"{name} {sql_type}" for name, sql_type in sources.LOG_SCHEMA)
BAD_ROWS = [
    # (user_id, item_id, user_segment, item_category, context, position, event_timestamp, click)
    (None, 1, "s1", "c1", "q1", 1, T0 - DAY, 1),
    (7, None, "s1", "c1", "q1", 1, T0 - DAY, 0),
    (7, 1, "s1", "c1", "q1", 1, None, 0),
    (7, 1, "s1", "c1", "q1", 1, T0, 1),  # at the cut-off: misfiled
    (7, 1, "s1", "c1", "q1", 1, T0 + 2 * DAY, 0),
    (7, 1, "s1", "c1", "q1", 2, T0 - DAY, 3),
    (7, 1, "s1", "c1", "q1", 0, T0 - DAY, 0),
    (7, 1, None, "c1", "q1", 1, T0 - DAY, 0),
    (7, 1, "s1", "c1", None, 1, T0 - DAY, 1),
    (7, 1, "s1", "c1", "q1", None, T0 - DAY, 1),  # item_pos keys on the position
]
EXTRA_CLEAN = [
    (7, 1, "s1", "c1", "q1", 14, T0 - DAY / 3, 1),  # past max_position: shares position 10
    (8, 2, "s2", "c2", "q2", 3, T0 - dt.timedelta(microseconds=1), 0),
]


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """A local[1] session (a running one is borrowed and left running)."""
    with active_or_new(
        lambda: build_session(
            "cascade-tests-ctr-duckdb",
            master="local[1]",
            conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", **UTC_MICROS},
            local_ip="127.0.0.1",
            log_level="ERROR",
        )
    ) as session:
        yield session


def read(path: str | Path, keys: tuple[str, ...]) -> pd.DataFrame:
    return pd.read_parquet(path).sort_values(list(keys)).reset_index(drop=True)


def test_spark_job_and_duckdb_peer_write_the_same_statistics(
    spark: SparkSession, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    small = gen.GeneratorConfig(impressions=20_000, users=2_000, items=500, end_ds=DS, seed=3)
    gen.write(spark, small, log)
    spark.createDataFrame(BAD_ROWS + EXTRA_CLEAN, SCHEMA).write.mode("append").parquet(str(log))
    config = job.CrossStatsConfig()

    spark_summary = job.run(
        DS, log_path=log, settings=Settings(home=tmp_path / "home"), spark=spark, config=config
    )
    duck = peer.run(log, tmp_path / "duckdb", ds=DS, config=config, threads=2)

    assert duck["rows"] == spark_summary["rows"]
    assert all(n > 0 for n in duck["rows"].values())
    for key in ("input_rows", "clean_rows_in_window", "clean_rows_before_window"):
        assert duck[key] == spark_summary[key], key
    assert duck["input_rows"] == 20_000 + len(BAD_ROWS) + len(EXTRA_CLEAN)
    assert duck["examination"] == pytest.approx(spark_summary["examination"], rel=1e-12)
    for pair, tags in spark_summary["priors"].items():
        for tag, prior in tags.items():
            assert duck["priors"][pair][tag] == pytest.approx(prior, rel=1e-9), (pair, tag)
    assert duck["constant_features"] == spark_summary["constant_features"]

    for pair in config.pairs:
        ours = read(duck["paths"][pair.name], pair.keys)
        theirs = read(spark_summary["paths"][pair.name], pair.keys)
        assert (
            list(ours.columns)
            == list(theirs.columns)
            == [
                *pair.keys,
                job.TIMESTAMP,
                *job.feature_columns(pair, config.windows),
            ]
        )
        assert len(ours) == spark_summary["rows"][pair.name]
        for column in theirs.columns:
            mine, spark_values = ours[column], theirs[column]
            if pd.api.types.is_float_dtype(spark_values):
                assert pd.api.types.is_float_dtype(mine), column
                np.testing.assert_allclose(
                    mine.to_numpy(), spark_values.to_numpy(), rtol=1e-9, err_msg=column
                )
            else:
                assert mine.dtype == spark_values.dtype, column
                assert mine.equals(spark_values), column
        assert theirs[f"{pair.name}_days_since_click"].isna().any()  # keys without a click

    # The same item catalogue: category at the newest impression, impressions, last seen.
    ours = read(duck["catalogue"]["path"], ("item_id",))
    theirs = read(spark_summary["catalogue"]["path"], ("item_id",))
    assert duck["catalogue"]["items"] == spark_summary["catalogue"]["items"] == len(theirs) > 0
    assert list(ours.columns) == list(theirs.columns)
    for column in ("item_id", "item_category", "impressions"):
        assert (
            ours[column]
            .astype("int64" if column != "item_category" else object)
            .equals(theirs[column].astype("int64" if column != "item_category" else object))
        ), column
    assert (
        pd.to_datetime(ours.last_seen, utc=True).astype("int64").to_numpy()
        == pd.to_datetime(theirs.last_seen, utc=True).astype("int64").to_numpy()
    ).all()

    # The same bad rows, for the same reasons (the future rows with the job's reason).
    quarantine = pd.read_parquet(duck["quarantine_path"])
    spark_quarantine = pd.read_parquet(spark_summary["quarantine_path"])
    assert quarantine.reason.value_counts().to_dict() == (
        spark_quarantine.reason.value_counts().to_dict()
    )
    assert duck["quarantined_by_reason"] == spark_summary["quarantined_by_reason"]
    assert duck["quarantined_by_reason"][sources.FUTURE_REASON] == 2
    assert sum(duck["quarantined_by_reason"].values()) == len(BAD_ROWS)
    clicks = sorted(json.loads(line)["click"] for line in quarantine.line)
    assert clicks == sorted(row[-1] for row in BAD_ROWS)  # the raw values, click 3 included
    assert set(quarantine.source) == {"generated"}
    assert json.loads((tmp_path / "duckdb" / "summary.json").read_text())["rows"] == duck["rows"]


def test_peer_stops_on_a_batch_without_clean_rows_after_quarantining(
    spark: SparkSession, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    spark.createDataFrame(BAD_ROWS, SCHEMA).write.parquet(str(log))

    with pytest.raises(job.EmptyBatch, match="no clean row in the 30-day window"):
        peer.run(log, tmp_path / "out", ds=DS, threads=1)

    bad = pd.read_parquet(peer.quarantine_path(tmp_path / "out", DS))
    assert len(bad) == len(BAD_ROWS)


def test_peer_names_a_missing_log_and_missing_columns(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="cascade ctr impressions"):
        peer.run(tmp_path / "nope", tmp_path / "out", ds=DS)
    log = tmp_path / "log"
    log.mkdir()
    pd.DataFrame({"user_id": [1], "click": [1]}).to_parquet(log / "part-0.parquet")
    with pytest.raises(ValueError, match="no column for"):
        peer.run(log, tmp_path / "out", ds=DS)


def test_the_peer_caps_the_debiased_ctr_like_the_job() -> None:
    import duckdb

    from benchmarks.ctr_cross_duckdb import debiased

    ((capped, plain),) = duckdb.sql(
        f"SELECT {debiased('3', '0.5', (0.1, 0.1))}, {debiased('1', '4.0', (1.0, 1.0))}"
    ).fetchall()
    assert capped == 1.0
    assert plain == pytest.approx(2 / 6)
