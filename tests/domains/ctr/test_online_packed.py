"""The packed SQLite online store (``domains.ctr.online_packed``): one row per entity for the cross
views, answering exactly as Feast's own layout, whichever path wrote it (Feast's
``materialize`` or the bulk writer), and read by the model server's reader without per-value
objects."""

from __future__ import annotations

import datetime as dt
import math
import sqlite3
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cascade.config import Settings
from cascade.lake import Lake
from domains.ctr import feature_store as fs
from domains.ctr import online_bulk, online_encoding, online_packed
from domains.ctr.online_cross import OnlineCrossReader
from features.ctr import cross_views
from jobs import ctr_cross_features as cf
from tests.domains.ctr.test_online_bulk import (
    DS1,
    DS2,
    PAIRS,
    intervals,
    key_rows,
    online_answers,
    partitions,
    same,
)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.delenv("CASCADE_PROFILE", raising=False)


def packed_tables(home: Path) -> dict[str, set[tuple]]:
    """``{view: {(key, event µs, created µs, payload)}}`` of every packed table."""
    conn = sqlite3.connect(home / "feast" / "online_store.db")
    try:
        names = [
            name
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if "__packed_" in name
        ]
        return {
            name.split("__packed_")[0].removeprefix("cascade_"): set(
                conn.execute(f'SELECT entity_key, event_ts, created_ts, payload FROM "{name}"')
            )
            for name in names
        }
    finally:
        conn.close()


def all_tables(home: Path) -> list[str]:
    conn = sqlite3.connect(home / "feast" / "online_store.db")
    try:
        return sorted(
            n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        )
    finally:
        conn.close()


TYPES = [("d", "DOUBLE"), ("f", "FLOAT"), ("i", "INT64"), ("j", "INT32"), ("b", "BOOL")]


def test_payloads_round_trip_every_type_and_refuse_another_width() -> None:
    rng = np.random.default_rng(0)
    n = 500
    values = [
        rng.standard_normal(n) * 1e12,
        rng.random(n).astype(np.float32).astype(np.float64),
        rng.integers(-(2**62), 2**62, n),
        rng.integers(-(2**31), 2**31, n),
        (rng.random(n) < 0.5).astype(np.int64),
    ]
    present = [rng.random(n) > 0.2 for _ in TYPES]
    payloads = online_packed.pack_rows(TYPES, values, present)
    width = online_packed.payload_dtype(TYPES).itemsize
    assert {len(p) for p in payloads} == {width} and width == len(TYPES) * 9
    records = online_packed.unpack_rows(TYPES, payloads)
    for i, (column, has) in enumerate(zip(values, present, strict=True)):
        assert (records["present"][:, i] == has).all()
        np.testing.assert_array_equal(records[f"v{i}"][has], column[has])
        assert (records[f"v{i}"][~has] == 0).all()
    # The server's read decodes them all at once, as float64 with NaN where not present, in
    # any column order.
    integer = np.array([kind not in ("DOUBLE", "FLOAT") for _, kind in TYPES])
    columns = np.array([4, 0, 2, 2, 3])
    matrix = online_packed.records_matrix(records, integer, columns)
    assert matrix.dtype == np.float64 and matrix.shape == (n, len(columns))
    for j, i in enumerate(columns):
        want = np.where(present[i], values[i].astype(np.float64), np.nan)
        np.testing.assert_array_equal(matrix[:, j], want)
    with pytest.raises(ValueError, match=f"expected {width}"):
        online_packed.unpack_rows(TYPES, [payloads[0] + b"\0"])


def test_keys_built_from_values_equal_feasts_serialize_entity_key() -> None:
    from feast.infra.key_encoding_utils import serialize_entity_key
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    names = ["user_id", "position", "item_category"]
    types = {"user_id": "INT64", "position": "INT32", "item_category": "STRING"}
    rows = [(7, 1, "Sci-Fi é"), (-(2**40), -5, ""), (0, 2**31 - 1, "x" * 300), (3, None, "a")]
    got = online_packed.serialize_keys(types, names, rows)
    assert got[-1] is None  # a missing value: no key
    for row, key in zip(rows[:3], got[:3], strict=True):
        proto = EntityKey(
            join_keys=names,
            entity_values=[
                Value(int64_val=row[0]),
                Value(int32_val=row[1]),
                Value(string_val=row[2]),
            ],
        )
        assert key == serialize_entity_key(proto, 3)
    one = online_packed.serialize_keys({"item_id": "INT64"}, ["item_id"], [(12,)])
    assert one == [
        serialize_entity_key(
            EntityKey(join_keys=["item_id"], entity_values=[Value(int64_val=12)]), 3
        )
    ]


def test_a_view_tagged_packed_with_text_features_is_refused() -> None:
    from feast import FeatureView, Field
    from feast.types import Float64, String

    view = FeatureView(
        name="v",
        entities=[],
        schema=[Field(name="x", dtype=Float64), Field(name="label", dtype=String)],
        tags={online_packed.LAYOUT_TAG: online_packed.PACKED},
    )
    assert online_packed.wants_packed(view)
    with pytest.raises(online_packed.PackedLayoutError, match=r"label \(STRING\)"):
        online_packed.check_packable(view)


@pytest.mark.slow
def test_a_packed_store_answers_as_feasts_layout_whichever_path_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cross = cross_views
    plain, bulk, through_feast = tmp_path / "plain", tmp_path / "bulk", tmp_path / "feast"
    ids = partitions(plain)
    partitions(bulk)
    partitions(through_feast)
    for ds in (DS1, DS2):
        with monkeypatch.context() as feast_layout:
            feast_layout.setattr(cross, "ONLINE_LAYOUT", "feast")
            cf.materialize_cross(ds, settings=Settings(home=plain), engine="feast")
        run = cf.materialize_cross(ds, settings=Settings(home=bulk))
        assert run["engine"] == "bulk" and run["rows"] == sum(len(i[ds]) for i in ids.values())
        cf.materialize_cross(ds, settings=Settings(home=through_feast), engine="feast")

    # One row per key in the packed stores, none in Feast's per-feature tables; the bulk
    # writer's rows are byte for byte what Feast's materialize wrote through the store.
    bulk_rows = packed_tables(bulk)
    assert set(bulk_rows) == {f"cross_{p}" for p in PAIRS}
    assert not [t for t in all_tables(bulk) if t.startswith("cascade_cross_") and "__" not in t]
    for pair, by_day in ids.items():
        assert len(bulk_rows[f"cross_{pair}"]) == len(set(by_day[DS1]) | set(by_day[DS2]))
    assert bulk_rows == packed_tables(through_feast)
    assert packed_tables(plain) == {}
    # Every key (day 1 only, day 2, never written) reads the same through Feast's API,
    # event timestamps included, and the registry holds the same intervals.
    for pair in PAIRS:
        rows = key_rows(plain, pair)
        assert same(online_answers(bulk, pair, rows), online_answers(plain, pair, rows))
    assert intervals(bulk) == intervals(plain)

    # The server's reader: the packed fast path equals Feast's path on the plain store, the
    # views' ttl (2 days) applied against the reader's clock.
    for now in (dt.datetime(2026, 11, 21, 12, tzinfo=dt.UTC), dt.datetime(2026, 11, 22, 6)):
        now = now.replace(tzinfo=dt.UTC)
        fast = OnlineCrossReader(fs.feature_store(Settings(home=bulk)), clock=lambda now=now: now)
        with monkeypatch.context() as feast_layout:
            feast_layout.setattr(cross, "ONLINE_LAYOUT", "feast")
            generic = OnlineCrossReader(
                fs.feature_store(Settings(home=plain)), clock=lambda now=now: now
            )
        assert isinstance(fast.online_store, online_packed.PackedSqliteOnlineStore)
        for pair in PAIRS:
            rows = key_rows(plain, pair)
            join_keys = list(PAIRS[pair].keys)
            keys = [tuple(r[k] for k in join_keys) for r in rows]
            features = [f"{pair}_ctr_7d", f"{pair}_imp_30d", f"{pair}_decay_ctr"]
            got = fast.read(f"cross_{pair}", join_keys, keys, features)
            want = generic.read(f"cross_{pair}", join_keys, keys, features)
            np.testing.assert_array_equal(got, want)
            assert np.isfinite(got).any() and np.isnan(got[-1]).all()  # the unknown key
        if now.day == 22:  # day 1's rows are older than the ttl: only day 2's keys answer
            only_day1 = sorted(set(ids["user_cat"][DS1]) - set(ids["user_cat"][DS2]))
            assert only_day1
            read = fast.read(
                "cross_user_cat",
                ["user_id", "item_category"],
                [(int(i), f"ite-{i % 997}") for i in only_day1],
                ["user_cat_imp_1d"],
            )
            assert np.isnan(read).all()


@pytest.mark.slow
def test_a_rerun_replaces_and_an_older_partition_never_overwrites_a_newer_one(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    ids = partitions(home)
    settings = Settings(home=home)
    cf.materialize_cross(DS2, settings=settings)
    after_day2 = packed_tables(home)
    cf.materialize_cross(DS2, settings=settings)
    assert packed_tables(home) == after_day2
    cf.materialize_cross(DS1, settings=settings)
    after_day1 = packed_tables(home)
    for view, rows in after_day2.items():
        assert rows <= after_day1[view]
        added = after_day1[view] - rows
        pair = view.removeprefix("cross_")
        assert len(added) == len(set(ids[pair][DS1]) - set(ids[pair][DS2]))
        assert not {r[0] for r in added} & {r[0] for r in rows}


@pytest.mark.slow
def test_a_batch_that_packs_differently_from_feast_is_refused_and_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    settings = Settings(home=home)
    partitions(home)
    cf.materialize_cross(DS1, settings=settings)
    before = packed_tables(home)
    real = online_bulk.packed_columns

    def off_by_one(batch: pa.RecordBatch, types: list) -> tuple:
        values, present = real(batch, types)
        values[0] = values[0] + 1
        return values, present

    monkeypatch.setattr(online_bulk, "packed_columns", off_by_one)
    with pytest.raises(online_encoding.BulkEncodingMismatch, match="Feast's values"):
        cf.materialize_cross(DS2, settings=settings)
    assert packed_tables(home) == before


@pytest.mark.slow
def test_a_view_whose_features_change_gets_a_new_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    settings = Settings(home=home)
    partitions(home)
    cf.materialize_cross(DS1, settings=settings, pairs=["seg_cat"])
    old = [t for t in all_tables(home) if t.startswith("cascade_cross_seg_cat__packed_")]
    assert len(old) == 1
    cross = cross_views
    fewer = cross.cross_fields

    def without_decay(pair: str) -> list:
        return [f for f in fewer(pair) if not f.name.endswith("_decay_ctr")]

    monkeypatch.setattr(cross, "cross_fields", without_decay)
    store = fs.feature_store(settings)
    store.apply(cross_views.repo_objects(settings=settings))
    new = [t for t in all_tables(home) if t.startswith("cascade_cross_seg_cat__packed_")]
    assert len(new) == 1 and new != old  # the old layout's rows are gone with its table
    answers = online_answers(home, "seg_cat", key_rows(home, "seg_cat"))
    assert all(
        v is None or (isinstance(v, float) and math.isnan(v)) for v in answers["seg_cat_ctr_7d"]
    )

    # Written through Feast's own path (`feast apply` from the command line creates only
    # Feast's tables): the first write creates the packed table.
    conn = sqlite3.connect(home / "feast" / "online_store.db")
    conn.execute(f'DROP TABLE "{new[0]}"')
    conn.commit()
    conn.close()
    assert np.isnan(read_seg_cat(store, home)).all()  # no table: nothing stored, no error
    day1 = pq.read_table(
        Lake(settings.lake_root).root / "features/ctr_cross/generated/seg_cat" / f"dt={DS1}"
    ).to_pandas()
    store.write_to_online_store("cross_seg_cat", day1.drop(columns=["seg_cat_decay_ctr"]))
    assert [t for t in all_tables(home) if "seg_cat__packed_" in t] == new
    np.testing.assert_array_equal(
        read_seg_cat(store, home), day1[["seg_cat_ctr_7d"]].to_numpy(dtype=float)
    )

    # Back to Feast's layout: the packed table goes, Feast's table is there.
    monkeypatch.setattr(cross, "ONLINE_LAYOUT", "feast")
    store.apply(cross_views.repo_objects(settings=settings))
    tables = all_tables(home)
    assert "cascade_cross_seg_cat" in tables
    assert not [t for t in tables if "__packed_" in t]
    # ... and packed again: Feast's stale per-feature table goes.
    monkeypatch.setattr(cross, "ONLINE_LAYOUT", "packed")
    store.apply(cross_views.repo_objects(settings=settings))
    assert "cascade_cross_seg_cat" not in all_tables(home)


def read_seg_cat(store: object, home: Path) -> np.ndarray:
    """``seg_cat_ctr_7d`` of day 1's keys through the server's reader (its clock on day 1)."""
    day1 = pq.read_table(
        Lake(Settings(home=home).lake_root).root
        / "features/ctr_cross/generated/seg_cat"
        / f"dt={DS1}"
    )
    keys = list(zip(*(day1.column(k).to_pylist() for k in PAIRS["seg_cat"].keys), strict=True))
    reader = OnlineCrossReader(store, clock=lambda: dt.datetime(2026, 11, 20, 12, tzinfo=dt.UTC))
    return reader.read("cross_seg_cat", list(PAIRS["seg_cat"].keys), keys, ["seg_cat_ctr_7d"])


def test_the_layout_benchmark_loads_both_layouts_and_reports_the_ratio(tmp_path: Path) -> None:
    from benchmarks import online_sqlite

    out = tmp_path / "online_sqlite.json"
    result = online_sqlite.main(
        ["--rows", "3000", "--repeats", "2", "--files", "2", "--out", str(out)]
    )
    assert out.is_file()
    assert set(result["rows_per_s"]) == {"packed", "feast"}
    assert result["spread"]["packed_rows_per_s"]["n"] == 2
    assert result["packed_over_feast"] == pytest.approx(
        result["rows_per_s"]["packed"] / result["rows_per_s"]["feast"]
    )
    # Fifteen features: the packed store holds the same rows in a fraction of the file.
    assert result["store_mb"]["packed"] < result["store_mb"]["feast"] / 3
