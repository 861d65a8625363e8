"""The ctr_cross DAG against the started stack: a Kafka ``impressions`` event -> the log landed
with ``cascade land`` from a parquet export (of generated impressions) -> Spark cross statistics
-> GX gate -> Feast, and the online store answers with the partition."""

from __future__ import annotations

import pandas as pd
import pytest

from cascade.config import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PAIRS = ("user", "item", "seg_cat", "user_cat", "seg_item", "ctx_item", "item_pos")


def test_impressions_event_runs_the_whole_cross_dag(cross_run: dict, triggered: dict) -> None:
    assert cross_run["run_type"] == "asset_triggered"
    assert cross_run["dag_run_state"] == "success", cross_run
    # A parquet export landed with `cascade land`: every exported row kept, read as landed.
    log = cross_run["log"]
    assert (log["source"], log["landed_from"]) == ("landed", "parquet")
    assert log["rows"] == triggered["exported"]["impressions"]["rows"] == 120_000
    stats = cross_run["stats"]
    assert stats["input_rows"] == 120_000 and stats["quarantined_rows"] == 0
    # The day before the partition, built from its log for the pre-ranker's training.
    assert list(stats["history_partitions"]) == ["2026-11-21"]
    assert stats["history_partitions"]["2026-11-21"]["log"] == "ds=2026-11-22's"
    assert cross_run["validate"]["history_partitions"] == {
        day: {"success": True} for day in stats["history_partitions"]
    }
    assert set(stats["rows"]) == set(PAIRS) and min(stats["rows"].values()) > 0
    assert cross_run["validate"]["success"]
    assert set(cross_run["feast"]["feature_views"]) == {f"cross_{p}" for p in PAIRS}


def test_the_online_store_serves_the_published_partition(stack: Settings, cross_run: dict) -> None:
    from domains.ctr.feature_store import feature_store, online_cross_features

    features = pd.read_parquet(cross_run["stats"]["paths"]["seg_item"]).head(10)
    keys = features[["user_segment", "item_id"]].to_dict("records")
    got = online_cross_features(feature_store(stack), "seg_item", keys)
    assert got["seg_item_imp_30d"].tolist() == features["seg_item_imp_30d"].astype(float).tolist()
    assert got["seg_item_dctr_30d"].tolist() == pytest.approx(
        features["seg_item_dctr_30d"].tolist()
    )
