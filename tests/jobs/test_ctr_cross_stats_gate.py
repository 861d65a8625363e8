"""The GX gate of the cross statistics: suites pass on a good batch, the batch fails on too
many quarantined rows and names the report."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cascade.config import Settings
from jobs import ctr_cross_stats as job
from jobs import ctr_cross_stats_gate as gate
from jobs import ctr_log_sources as sources

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DS = "2026-11-22"
T0 = dt.datetime(2026, 11, 22)
SCHEMA = ", ".join(f"{name} {sql_type}" for name, sql_type in sources.LOG_SCHEMA)


def test_gate_checks_suites_and_fails_on_quarantine_share(
    spark: SparkSession, tmp_path: Path
) -> None:
    hour = dt.timedelta(hours=1)
    rows = [
        (u, u % 3, f"s{u % 2}", f"c{u % 3}", None, 1 + u % 4, T0 - u * hour, u % 2)
        for u in range(1, 60)
    ]
    rows.append((99, 1, "s0", "c0", None, 1, T0 - hour, 7))  # click 7: quarantined
    folder = tmp_path / "log"
    spark.createDataFrame(rows, SCHEMA).write.parquet(str(folder))
    settings = Settings(home=tmp_path / "home")
    config = job.CrossStatsConfig(
        pairs=(job.SEG_CAT,), windows_days=(1, 7), max_quarantine_fraction=0.001
    )
    job.run(DS, log_path=folder, settings=settings, spark=spark, config=config)

    with pytest.raises(gate.GateFailed, match="quarantine_fraction") as failure:
        gate.validate(DS, log_path=folder, settings=settings, spark=spark, config=config)

    report = json.loads(failure.value.report.read_text())
    assert report["failed"] == failure.value.failed and len(report["failed"]) == 1
    # Every GX expectation ran and passed on the good rows and the features.
    assert [d["dataset"] for d in report["datasets"]] == ["input", "seg_cat", "catalogue"]
    assert all(d["success"] for d in report["datasets"])
    assert sum(len(d["checks"]) for d in report["datasets"]) >= 15


def test_gate_fails_a_catalogue_with_a_duplicated_or_stale_item(
    spark: SparkSession, tmp_path: Path
) -> None:
    import pandas as pd

    hour = dt.timedelta(hours=1)
    rows = [
        (u, u % 5, f"s{u % 2}", f"c{u % 3}", None, 1, T0 - u * hour, u % 2) for u in range(1, 40)
    ]
    folder = tmp_path / "log"
    spark.createDataFrame(rows, SCHEMA).write.parquet(str(folder))
    settings = Settings(home=tmp_path / "home")
    config = job.CrossStatsConfig(pairs=(job.ITEM,), windows_days=(1, 7))
    summary = job.run(DS, log_path=folder, settings=settings, spark=spark, config=config)
    assert summary["catalogue"]["items"] == 5
    assert gate.validate(DS, log_path=folder, settings=settings, spark=spark, config=config)[
        "success"
    ]

    path = Path(summary["catalogue"]["path"])
    items = pd.read_parquet(path)
    bad = pd.concat([items, items.head(1)]).assign(last_seen=items.last_seen.iloc[0])
    bad.loc[bad.index[-1], "last_seen"] = pd.Timestamp("2026-12-01", tz="UTC")
    for old in path.glob("*.parquet"):
        old.unlink()
    bad.to_parquet(path / "part-0.parquet", index=False)
    with pytest.raises(gate.GateFailed) as failure:
        gate.validate(DS, log_path=folder, settings=settings, spark=spark, config=config)
    failed = failure.value.failed
    assert {
        "catalogue.item_id_unique(6 rows, 5 ids)",
        "catalogue.row_count",
        "catalogue.last_seen_in_lookback",
    } <= set(failed)
