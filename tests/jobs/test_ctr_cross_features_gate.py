"""The GX gate: passes on good partitions (hand-built and the real job's), else fails loudly."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from cascade.config import Settings
from cascade.lake import Lake
from jobs import ctr_cross_features, ctr_cross_features_gate
from jobs.ctr_cross_features_gate import GateFailed, validate

DS = "2026-11-22"
T = pd.Timestamp("2026-11-15", tz="UTC")


def good_partitions() -> dict[str, pd.DataFrame]:
    return {
        "user": pd.DataFrame(
            {
                "user_id": [1, 2],
                "event_timestamp": [T, T],
                "user_impressions": [3, 1],
                "user_clicks": [2, 0],
                "user_ctr": [0.6, 0.3],
                "user_age": [30, None],
            }
        ),
        "item": pd.DataFrame(
            {
                "item_id": [7],
                "event_timestamp": [T],
                "item_impressions": [4],
                "item_clicks": [4],
                "item_ctr": [0.9],
                "item_release_year": [1995],
                "item_genre": ["Drama"],
            }
        ),
        "user_genre": pd.DataFrame(
            {
                "user_id": [1],
                "genre": ["Drama"],
                "event_timestamp": [T],
                "ug_impressions": [3],
                "ug_clicks": [2],
                "ug_ctr": [0.6],
            }
        ),
        "impressions": pd.DataFrame(
            {
                "user_id": [1, 2],
                "item_id": [7, 7],
                "genre": ["Drama", "Drama"],
                "event_timestamp": [T, T],
                "click": [1, 0],
            }
        ),
    }


def write_lake(home: Path, frames: dict[str, pd.DataFrame]) -> Settings:
    settings = Settings(home=home)
    lake = Lake(settings.lake_root)
    for name, frame in frames.items():
        folder = lake.impressions(DS) if name == "impressions" else lake.ctr_features(name, DS)
        folder.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(folder / "part-0.parquet", coerce_timestamps="us", index=False)
    return settings


def test_gate_passes_on_good_partitions(tmp_path: Path) -> None:
    settings = write_lake(tmp_path, good_partitions())

    result = validate(DS, settings=settings)

    report = Lake(settings.lake_root).reports("gx_ctr_features", DS) / "report.json"
    assert result == {
        "success": True,
        "report": str(report),
        "evaluated": 27,
        "failed": [],
        "data_docs": None,
    }
    body = json.loads(report.read_text())
    assert body["success"] is True
    assert {d["dataset"] for d in body["datasets"]} == {"user", "item", "user_genre", "impressions"}


def test_gate_names_every_broken_rule_and_the_report(tmp_path: Path) -> None:
    frames = good_partitions()
    frames["user"].loc[0, "user_clicks"] = 5  # more clicks than impressions
    frames["item"].loc[0, "item_ctr"] = 1.5
    frames["item"].loc[0, "event_timestamp"] = pd.Timestamp("2026-11-22 00:00:01", tz="UTC")
    frames["user_genre"].loc[0, "ug_impressions"] = 0
    frames["impressions"].loc[1, "click"] = 2
    settings = write_lake(tmp_path, frames)

    docs = Lake(settings.lake_root).data_docs("ctr_preranking", "validate", DS)
    stale = docs / "validations" / "earlier.html"
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier run's page")
    with pytest.raises(GateFailed) as failure:
        validate(DS, settings=settings, docs=docs)

    report = Lake(settings.lake_root).reports("gx_ctr_features", DS) / "report.json"
    assert str(report) in str(failure.value)
    # The failed batch's GX Data Docs: an index and one validation page per suite, this run's.
    assert json.loads(report.read_text())["data_docs"] == str(docs / "index.html")
    pages = sorted(p.name for p in (docs / "validations").rglob("*.html"))
    assert len(pages) == 4 and "earlier.html" not in pages
    assert "ctr_features_item" in (docs / "index.html").read_text()
    assert sorted(failure.value.failed) == sorted(
        [
            "user.expect_column_pair_values_a_to_be_greater_than_b(user_impressions, user_clicks)",
            "item.expect_column_values_to_be_between(item_ctr)",
            "item.expect_column_values_to_be_between(event_timestamp)",
            "user_genre.expect_column_values_to_be_between(ug_impressions)",
            # ug_clicks (2) > ug_impressions (0) as well
            "user_genre.expect_column_pair_values_a_to_be_greater_than_b"
            "(ug_impressions, ug_clicks)",
            "impressions.expect_column_values_to_be_in_set(click)",
        ]
    )
    for name in failure.value.failed:
        assert name in str(failure.value)
    assert json.loads(report.read_text())["success"] is False


def test_gate_on_a_missing_partition_says_to_run_the_job(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="run `python -m jobs.ctr_cross_features"):
        validate(DS, settings=Settings(home=tmp_path))


def test_cli_exits_non_zero_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    frames = good_partitions()
    frames["impressions"].loc[0, "user_id"] = None
    write_lake(tmp_path, frames)
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))

    assert ctr_cross_features_gate.main(["--ds", DS]) == 1
    assert "impressions.expect_column_values_to_not_be_null(user_id)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def ml100k_home(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, dict]]:
    """The real job's output on ML-100k for ds=2026-11-22, built once for this module."""
    home = tmp_path_factory.mktemp("cascade_home")
    result = ctr_cross_features.run(DS, settings=Settings(home=home), spark=spark)
    yield home, result


@pytest.mark.spark
@pytest.mark.slow
def test_gate_passes_on_real_job_output(ml100k_home: tuple[Path, dict]) -> None:
    home, job = ml100k_home
    assert job["impressions"] == 100_000
    assert job["quarantined"] == 0
    assert all(n > 0 for n in job["rows"].values())

    result = validate(DS, settings=Settings(home=home))

    assert result["success"] is True
    assert result["evaluated"] == 27


@pytest.mark.spark
@pytest.mark.slow
def test_gate_fails_on_a_doctored_partition(ml100k_home: tuple[Path, dict], tmp_path: Path) -> None:
    source, _ = ml100k_home
    shutil.copytree(source / "lake", tmp_path / "lake")
    settings = Settings(home=tmp_path)
    item_dir = Lake(settings.lake_root).ctr_features("item", DS)
    items = pd.read_parquet(item_dir)
    items.loc[items.index[:3], "item_clicks"] = items.loc[items.index[:3], "item_impressions"] + 1
    shutil.rmtree(item_dir)
    item_dir.mkdir()
    items.to_parquet(item_dir / "part-0.parquet", coerce_timestamps="us", index=False)

    with pytest.raises(GateFailed, match="report.json") as failure:
        validate(DS, settings=settings)

    assert failure.value.failed == [
        "item.expect_column_pair_values_a_to_be_greater_than_b(item_impressions, item_clicks)"
    ]
    report = json.loads(failure.value.report.read_text())
    pair = next(
        check
        for dataset in report["datasets"]
        for check in dataset["expectations"]
        if check["expectation"] == failure.value.failed[0]
    )
    assert pair["result"]["unexpected_count"] == 3
