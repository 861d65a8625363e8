"""Bulk materialization into Feast's SQLite online store (``domains.ctr.online_bulk``): the bytes
equal Feast's own encoders, and a store loaded in bulk answers exactly as one loaded by
``FeatureStore.materialize`` (same SQL rows, same online answers, same registry intervals).

Here the cross views keep Feast's layout (a row per key and feature); the packed layout the
local profile gives them is tested in ``test_online_packed.py``."""

from __future__ import annotations

import datetime as dt
import math
import re
import sqlite3
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cascade.config import Settings
from cascade.lake import Lake
from domains.ctr import feature_store as fs
from domains.ctr import online_bulk, online_encoding
from features.ctr import cross_views
from jobs import ctr_cross_features as cf
from jobs import ctr_cross_stats as job

DS1, DS2 = "2026-11-20", "2026-11-21"
PAIRS = {p.name: p for p in job.CrossStatsConfig().pairs}


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.delenv("CASCADE_PROFILE", raising=False)


@pytest.fixture(autouse=True)
def feast_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cross views untagged: Feast's own SQLite layout."""
    monkeypatch.setattr(cross_views, "ONLINE_LAYOUT", "feast")


# ------------------------------------------------------------------ encoders vs Feast's


def feast_values(column: pa.Array, value_type) -> list[tuple[bytes, str | None]]:
    from feast.infra.online_stores.helpers import extract_text_and_num
    from feast.type_map import python_values_to_proto_values

    protos = python_values_to_proto_values(column.to_numpy(zero_copy_only=False), value_type)
    return [(p.SerializeToString(), extract_text_and_num(p, False)[0]) for p in protos]


def bulk_values(column: pa.Array, value_type) -> list[tuple[bytes, str | None]]:
    encoded = online_encoding.encode_values(column, value_type)
    return list(zip(encoded.blobs.to_pylist(), encoded.texts.to_pylist(), strict=True))


def test_value_bytes_and_texts_equal_feasts_for_every_supported_type() -> None:
    from feast.value_type import ValueType

    rng = np.random.default_rng(3)
    n = 2_000
    gone = rng.random(n) < 0.15
    doubles = np.concatenate(
        [
            rng.random(n // 4),
            rng.standard_normal(n // 4) * 1e20,
            10.0 ** rng.integers(-9, 18, n // 4),
        ]
    )
    doubles = np.concatenate([doubles, [0.0, -0.0, math.nan, math.inf, 1e16, 1e-5, 1e-4, 2.0]])
    doubles = np.resize(doubles, n)
    ints = rng.integers(-(2**62), 2**62, n)
    ints[:8] = [0, 1, -1, 127, 128, -128, 2**63 - 1, -(2**63)]
    columns = [
        (pa.array(doubles, mask=gone), ValueType.DOUBLE),
        (pa.array(doubles), ValueType.DOUBLE),  # NaN but no nulls: Feast writes NaN as missing
        (pa.array(doubles.astype(np.float32), mask=gone), ValueType.FLOAT),
        (pa.array(ints), ValueType.INT64),  # no nulls: exact 64-bit values
        (pa.array(rng.integers(0, 2**40, n), mask=gone), ValueType.INT64),
        (pa.array(rng.integers(-(2**31), 2**31, n).astype(np.int32), mask=gone), ValueType.INT32),
        (pa.array(rng.random(n) < 0.5), ValueType.BOOL),
        (pa.array([f"é{i}" * (i % 50) for i in range(n)], mask=gone), ValueType.STRING),
    ]
    for column, value_type in columns:
        assert bulk_values(column, value_type) == feast_values(column, value_type), value_type


def test_entity_keys_equal_feasts_serialize_entity_key() -> None:
    from feast.infra.key_encoding_utils import serialize_entity_key
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value
    from feast.value_type import ValueType

    batch = pa.record_batch(
        {
            "user_id": pa.array([7, -3, 2**40, None], pa.int64()),
            "position": pa.array([1, 2, -5, 4], pa.int32()),
            "item_category": pa.array(["Sci-Fi é", "", "x" * 300, "a"]),
        }
    )
    join_keys = {
        "user_id": ValueType.INT64,
        "position": ValueType.INT32,
        "item_category": ValueType.STRING,
    }
    keys, valid = online_encoding.encode_keys(batch, join_keys)
    assert valid.tolist() == [True, True, True, False]
    rows = batch.to_pylist()
    for row, key in list(zip(rows, keys.to_pylist(), strict=True))[:3]:
        proto = EntityKey(
            join_keys=["user_id", "position", "item_category"],
            entity_values=[
                Value(int64_val=row["user_id"]),
                Value(int32_val=row["position"]),
                Value(string_val=row["item_category"]),
            ],
        )
        assert key == serialize_entity_key(proto, 3)


# ------------------------------------------------------------------ the store, both ways


def write_partition(lake: Lake, pair: job.CrossPair, ds: str, ids: np.ndarray, seed: int) -> None:
    """A ``dt=<ds>`` partition in the job's schema with keys built from ``ids``; ~15% of the
    values missing (null counts, NaN or null rates: a key seen in some windows only)."""
    rng = np.random.default_rng(seed)
    where = job.CrossLake(lake, "generated").pair(pair, ds)
    where.mkdir(parents=True)
    n = len(ids)
    columns: dict[str, pa.Array] = {}
    for name in pair.keys:
        if name == "position":
            columns[name] = pa.array(ids % 40 + 1, pa.int32())
        elif name in ("user_id", "item_id"):
            columns[name] = pa.array(ids // 40 if "position" in pair.keys else ids, pa.int64())
        else:
            columns[name] = pa.array([f"{name[:3]}-{i % 997}" for i in ids])
    columns[job.TIMESTAMP] = pa.array([job.ds_midnight(ds)] * n, pa.timestamp("us", tz="UTC"))
    for column in job.feature_columns(pair, (1, 7, 30)):
        gone = rng.random(n) < 0.15
        if "_imp_" in column or "_clk_" in column:
            columns[column] = pa.array(rng.integers(0, 5_000, n), pa.int64(), mask=gone)
        else:
            values = rng.random(n) * rng.choice([1e-6, 1.0, 30.0], n)
            values[rng.random(n) < 0.05] = np.nan
            columns[column] = pa.array(values, pa.float64(), mask=gone)
    pq.write_table(pa.table(columns), where / "part-00000.parquet")


def partitions(home: Path) -> dict[str, dict[str, np.ndarray]]:
    """Two days of every pair: day 2 drops some keys of day 1 and adds new ones."""
    lake = Lake(Settings(home=home).lake_root)
    ids = {}
    for i, (name, pair) in enumerate(PAIRS.items()):
        first = np.arange(0, 400 if name == "user_cat" else 60)
        second = first[len(first) // 3 :] + len(first) // 2
        write_partition(lake, pair, DS1, first, seed=i)
        write_partition(lake, pair, DS2, second, seed=100 + i)
        ids[name] = {DS1: first, DS2: second}
    return ids


def table_rows(home: Path) -> dict[str, set[tuple]]:
    conn = sqlite3.connect(home / "feast" / "online_store.db")
    try:
        return {
            name: set(
                conn.execute(
                    f"SELECT entity_key, feature_name, value, value_text, vector_value, event_ts, "
                    f'created_ts, typeof(value), typeof(event_ts) FROM "{name}"'
                )
            )
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master "
                "WHERE type = 'table' AND name LIKE 'cascade_cross_%'"
            )
        }
    finally:
        conn.close()


def key_rows(home: Path, pair: str) -> list[dict]:
    """Every key of both days (and one key never written) as entity rows of the pair."""
    keys: dict[tuple, dict] = {}
    for ds in (DS1, DS2):
        root = Lake(Settings(home=home).lake_root).root / "features" / "ctr_cross" / "generated"
        table = pq.read_table(root / pair / f"dt={ds}", columns=list(PAIRS[pair].keys))
        for row in table.to_pylist():
            keys[tuple(row.values())] = row
    unknown = dict(next(iter(keys.values())))
    first = PAIRS[pair].keys[0]
    unknown[first] = 10**12 if isinstance(unknown[first], int) else "never-seen"
    return [*keys.values(), unknown]


def online_answers(home: Path, pair: str, rows: list[dict]) -> dict:
    # Feast keeps one process-wide cache of resolved feature references
    # (feast.utils._feature_resolution_cache), keyed by the project and the references, not by
    # the registry. The homes compared here share both, so a read of one home could resolve the
    # views of another (another layout tag): each read starts from an empty cache.
    import feast.utils

    feast.utils._feature_resolution_cache.clear()
    store = fs.feature_store(Settings(home=home))
    view = store.get_feature_view(f"cross_{pair}")
    response = store.get_online_features(
        features=[f"{view.name}:{f.name}" for f in view.features], entity_rows=rows
    )
    return response.to_dict(include_event_timestamps=True)


def intervals(home: Path) -> dict[str, list]:
    store = fs.feature_store(Settings(home=home))
    return {
        v.name: [(a.isoformat(), b.isoformat()) for a, b in v.materialization_intervals]
        for v in store.list_feature_views()
    }


def same(a: dict, b: dict) -> bool:
    """Equal answers, NaN equal to NaN."""
    if a.keys() != b.keys():
        return False
    for name in a:
        for x, y in zip(a[name], b[name], strict=True):
            if not (x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))):
                return False
    return True


@pytest.mark.slow
def test_bulk_load_leaves_the_store_exactly_as_feast_materialize(tmp_path: Path) -> None:
    feast_home, bulk_home = tmp_path / "feast-path", tmp_path / "bulk-path"
    ids = partitions(feast_home)
    partitions(bulk_home)
    for ds in (DS1, DS2):
        feast_run = cf.materialize_cross(ds, settings=Settings(home=feast_home), engine="feast")
        bulk_run = cf.materialize_cross(ds, settings=Settings(home=bulk_home))
        assert feast_run["engine"] == "feast" and bulk_run["engine"] == "bulk"
        assert bulk_run["rows"] == sum(len(i[ds]) for i in ids.values())

    # Byte for byte the same SQL rows (values, texts, timestamps) in every view's table.
    feast_rows, bulk_rows = table_rows(feast_home), table_rows(bulk_home)
    assert set(bulk_rows) == {f"cascade_cross_{p}" for p in PAIRS}
    assert bulk_rows == feast_rows
    # ... so every key (old, new, both days, never written) reads the same through Feast,
    # event timestamps included.
    for pair in PAIRS:
        rows = key_rows(feast_home, pair)
        assert same(online_answers(bulk_home, pair, rows), online_answers(feast_home, pair, rows))
    # Day-1-only keys keep their day-1 timestamp, day-2 keys carry day 2, unknown keys none.
    answers = online_answers(bulk_home, "user_cat", key_rows(bulk_home, "user_cat"))
    seconds = {dt.datetime(2026, 11, d, tzinfo=dt.UTC).timestamp() for d in (20, 21)}
    assert set(answers["user_cat_ctr_30d__ts"]) == {0, *seconds}
    # The registry records the same materialized intervals as Feast's own path.
    assert intervals(bulk_home) == intervals(feast_home)
    assert intervals(bulk_home)["cross_user_cat"] == [
        (f"{DS1}T00:00:00+00:00", f"{DS1}T00:00:00+00:00"),
        (f"{DS2}T00:00:00+00:00", f"{DS2}T00:00:00+00:00"),
    ]
    # The module's readers see the bulk-written rows.
    store = fs.feature_store(Settings(home=bulk_home))
    lake = Lake(Settings(home=bulk_home).lake_root)
    day2 = pq.read_table(
        lake.root / "features" / "ctr_cross" / "generated" / "item_pos" / f"dt={DS2}"
    ).to_pandas()
    got = fs.online_cross_features(
        store, "item_pos", day2[["item_id", "position"]].to_dict("records")
    )
    np.testing.assert_allclose(
        got["item_pos_ctr_7d"].to_numpy(), day2["item_pos_ctr_7d"].to_numpy(), equal_nan=True
    )
    assert got["item_pos_imp_30d"].tolist() == pytest.approx(
        day2["item_pos_imp_30d"].astype(float).tolist(), nan_ok=True
    )


@pytest.mark.slow
def test_a_rerun_replaces_and_an_older_partition_never_overwrites_a_newer_one(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    partitions(home)
    settings = Settings(home=home)
    cf.materialize_cross(DS2, settings=settings)
    after_day2 = table_rows(home)
    cf.materialize_cross(DS2, settings=settings)  # same partition again: replaced, no duplicate
    assert table_rows(home) == after_day2
    cf.materialize_cross(DS1, settings=settings)  # older partition after the newer one
    after_day1 = table_rows(home)
    for name, rows in after_day2.items():
        assert rows <= after_day1[name]  # every day-2 row is still there, untouched
        day2_keys = {r[0] for r in rows}
        added = after_day1[name] - rows
        assert added and not {r[0] for r in added} & day2_keys  # only keys day 2 lacks
    assert len(intervals(home)["cross_seg_cat"]) == 3


def applied(home: Path, pair: str) -> tuple:
    """Both days' partitions under ``home``, the cross views applied: (store, view, day-1
    folder of ``pair``)."""
    settings = Settings(home=home)
    partitions(home)
    store = fs.feature_store(settings)
    store.apply(cross_views.repo_objects(settings=settings))
    folder = Lake(settings.lake_root).root / "features/ctr_cross/generated" / pair / f"dt={DS1}"
    return store, store.get_feature_view(f"cross_{pair}"), folder


@pytest.mark.slow
def test_a_batch_that_differs_from_feast_is_refused_and_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    store, view, folder = applied(home, "seg_item")
    moment = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)

    result = online_bulk.write_path(store, view, folder, moment, moment, progress_every_s=0)
    assert result.rows == 60 and result.batches == 1
    assert re.search(
        r"\[materialize cross_seg_item\] 60 rows .* done \(.* rows/s\)", capsys.readouterr().err
    )
    written = table_rows(home)["cascade_cross_seg_item"]
    assert len(written) == 60 * len(view.features)

    real = online_bulk.encode_values

    def off_by_one_text(column: pa.Array, value_type):
        encoded = real(column, value_type)
        if value_type.name == "INT64":
            encoded.texts = pa.array(
                [None if t is None else t + "0" for t in encoded.texts.to_pylist()]
            )
        return encoded

    monkeypatch.setattr(online_bulk, "encode_values", off_by_one_text)
    later = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
    folder2 = folder.parent / f"dt={DS2}"
    with pytest.raises(online_encoding.BulkEncodingMismatch, match="seg_item_imp_1d"):
        online_bulk.write_path(store, view, folder2, later, later)
    assert table_rows(home)["cascade_cross_seg_item"] == written


@pytest.mark.slow
def test_rows_outside_the_window_or_without_a_key_are_not_written(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store, view, folder = applied(home, "seg_cat")
    table = pq.read_table(folder)
    keys = table.column("user_segment").to_pylist()
    keys[0] = None
    pq.write_table(
        table.set_column(
            table.schema.get_field_index("user_segment"), "user_segment", pa.array(keys)
        ),
        folder / "part-00000.parquet",
    )
    moment = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    result = online_bulk.write_path(store, view, folder, moment, moment)
    assert (result.rows, result.skipped_missing_key) == (59, 1)
    nothing = online_bulk.write_path(
        store, view, folder, moment + dt.timedelta(days=1), moment + dt.timedelta(days=2)
    )
    assert nothing.rows == 0
    assert len(table_rows(home)["cascade_cross_seg_cat"]) == 59 * len(view.features)
