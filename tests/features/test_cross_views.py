"""The cross-statistics views in Feast: composite keys, versioned service, and point-in-time
offline retrieval over several ``dt=`` partitions of the job's output (no future leakage)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cascade.config import Settings
from cascade.lake import Lake
from features.ctr import cross_views
from jobs import ctr_cross_features as cf
from jobs import ctr_cross_stats as job


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.delenv("CASCADE_PROFILE", raising=False)


def write_partition(lake: Lake, pair: job.CrossPair, ds: str, keys: dict, value: float) -> None:
    """One ``dt=<ds>`` partition in the job's layout and schema; every feature = ``value``
    (counts: ``int(value * 100)``), so a retrieved row names the partition it came from."""
    where = job.CrossLake(lake, "generated").pair(pair, ds)
    where.mkdir(parents=True)
    n = len(next(iter(keys.values())))
    columns: dict[str, pa.Array] = {}
    for name, values in keys.items():
        columns[name] = pa.array(values, pa.int32() if name == "position" else None)
    columns[job.TIMESTAMP] = pa.array([job.ds_midnight(ds)] * n, pa.timestamp("us", tz="UTC"))
    for column in job.feature_columns(pair, (1, 7, 30)):
        is_count = "_imp_" in column or "_clk_" in column
        columns[column] = pa.array(
            [int(value * 100)] * n if is_count else [value] * n,
            pa.int64() if is_count else pa.float64(),
        )
    pq.write_table(pa.table(columns), where / "part-00000.parquet")


def test_cross_views_have_composite_keys_and_a_versioned_service(tmp_path: Path) -> None:
    from feast import FeatureService, FeatureView

    objects = cross_views.repo_objects(settings=Settings(home=tmp_path))
    views = {o.name: o for o in objects if isinstance(o, FeatureView)}
    assert sorted(views["cross_user_cat"].entities) == ["item_category", "user"]
    assert sorted(views["cross_item_pos"].entities) == ["item", "position"]
    assert {f.name for f in views["cross_user_cat"].features} == set(
        job.feature_columns(job.USER_CAT, (1, 7, 30))
    )
    (service,) = [o for o in objects if isinstance(o, FeatureService)]
    assert service.name == cross_views.CROSS_FEATURE_SERVICE == "ctr_cross_v2"
    assert {p.name for p in service.feature_view_projections} == set(views)


@pytest.mark.slow
def test_point_in_time_retrieval_never_reads_a_later_partition(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    lake = Lake(settings.lake_root)
    keys = {"user_id": [1, 2], "item_category": ["c1", "c1"]}
    for ds, value in (("2026-11-20", 0.2), ("2026-11-21", 0.3), ("2026-11-22", 0.4)):
        write_partition(lake, job.USER_CAT, ds, keys, value)
    write_partition(
        lake, job.USER_CAT, "2026-11-23", {"user_id": [1], "item_category": ["c2"]}, 0.9
    )
    t = pd.Timestamp
    rows = pd.DataFrame(
        {
            "user_id": [1, 1, 1, 2, 1, 1],
            "item_category": ["c1", "c1", "c1", "c1", "c1", "c2"],
            "event_timestamp": [
                t("2026-11-19 23:59", tz="UTC"),  # before every partition: nothing
                t("2026-11-20 00:00", tz="UTC"),  # at ds midnight: that partition is valid
                t("2026-11-21 13:00", tz="UTC"),  # the 11-21 partition, not 11-22's
                t("2026-11-22 23:59", tz="UTC"),
                t("2026-11-26 00:00", tz="UTC"),  # 11-22 row is older than the 2-day ttl
                t("2026-11-22 12:00", tz="UTC"),  # key only in a later partition
            ],
        }
    )

    found = cf.cross_features_at(rows, "user_cat", settings=settings)

    merged = rows.merge(
        found, on=["user_id", "item_category", "event_timestamp"], how="left", validate="1:1"
    )
    got = merged["user_cat_ctr_30d"].to_numpy()
    np.testing.assert_array_equal(np.isnan(got), [True, False, False, False, True, True])
    np.testing.assert_allclose(got[1:4], [0.2, 0.3, 0.4])
    assert merged["user_cat_imp_7d"].iloc[2] == 30
