"""No skew at the window's edge: a key that drops out of the newest partition is missing online,
as it is in the training set, although the online store still holds its older row.

Two ``user_cat`` partitions in the engine's layout, the second without some keys of the first
and with keys of its own, are loaded into a private SQLite online store one after the other
(``materialize_cross``); the server's reader (:class:`domains.ctr.online_cross.OnlineCrossReader`),
the training set's join (:func:`jobs.ctr_training_set.training_set`) and the offline point in
time join (:func:`jobs.ctr_cross_features.cross_features_at`) must answer the same for every key.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cascade.config import Settings
from cascade.lake import Lake
from domains.ctr import feature_store as fs
from domains.ctr.online_cross import OnlineCrossReader
from domains.ctr.online_packed import from_micros, micros
from jobs import ctr_cross_features as cf
from jobs import ctr_cross_stats as job
from jobs.ctr_training_set import training_set

DS1, DS2 = "2026-03-09", "2026-03-10"
AT = dt.datetime(2026, 3, 10, 15, 30, tzinfo=dt.UTC)
"""A request (an impression) on DS2's day."""
GENRES = ("Action", "Comedy", "Drama")
KEYS = {
    DS1: [(u, g) for u in range(1, 7) for g in GENRES],
    DS2: [(u, g) for u in range(3, 9) for g in GENRES if (u, g) != (4, "Drama")],
}
"""Users 1-2 and (4, Drama) leave the window with DS2; users 7-8 enter it."""
FEATURES = ("user_cat_ctr_7d", "user_cat_imp_30d", "user_cat_decay_ctr")
UNKNOWN = (99, "Action")


def value(column: str, ds: str, user: int, genre: str) -> float:
    day = int(ds[-2:])
    return float(user * 100 + GENRES.index(genre) * 10 + day + len(column) / 100)


def partition(ds: str) -> pd.DataFrame:
    keys = KEYS[ds]
    columns: dict[str, pa.Array] = {
        "user_id": pa.array([u for u, _ in keys], pa.int64()),
        "item_category": pa.array([g for _, g in keys]),
        job.TIMESTAMP: pa.array([job.ds_midnight(ds)] * len(keys), pa.timestamp("us", tz="UTC")),
    }
    for column in job.feature_columns(job.USER_CAT, (1, 7, 30)):
        integer = "_imp_" in column or "_clk_" in column
        values = [value(column, ds, u, g) for u, g in keys]
        columns[column] = (
            pa.array([int(v) for v in values], pa.int64())
            if integer
            else pa.array(values, pa.float64())
        )
    return pa.table(columns).to_pandas()


def write(settings: Settings, ds: str) -> None:
    where = job.CrossLake(Lake(settings.lake_root), "generated").pair(job.USER_CAT, ds)
    where.mkdir(parents=True)
    pq.write_table(pa.Table.from_pandas(partition(ds), preserve_index=False), where / "p.parquet")


@pytest.fixture()
def settings(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.delenv("CASCADE_PROFILE", raising=False)
    settings = Settings(home=tmp_path)  # type: ignore[arg-type]
    write(settings, DS1)
    write(settings, DS2)
    yield settings


def every_key() -> list[tuple[int, str]]:
    return sorted(set(KEYS[DS1]) | set(KEYS[DS2])) + [UNKNOWN]


def impressions(keys: list[tuple[int, str]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": [u for u, _ in keys],
            "item_id": range(len(keys)),
            "item_category": [g for _, g in keys],
            "event_timestamp": [AT] * len(keys),
            "click": 0,
        }
    )


def trained_on(keys: list[tuple[int, str]], published: tuple[str, ...], lag: int) -> np.ndarray:
    frame, _ = training_set(
        impressions(keys),
        {"user_cat": {ds: partition(ds) for ds in published}},
        max_lag_days=lag,
    )
    return frame[list(FEATURES)].to_numpy(np.float64)


def served(reader: OnlineCrossReader, keys: list[tuple[int, str]]) -> np.ndarray:
    return reader.read("cross_user_cat", ["user_id", "item_category"], keys, FEATURES)


def test_a_key_that_left_the_window_is_missing_online_as_in_training(settings: Settings) -> None:
    keys = every_key()
    left = [k for k in keys if k in KEYS[DS1] and k not in KEYS[DS2]]
    assert left
    cf.materialize_cross(DS1, settings=settings, pairs=["user_cat"])
    reader = OnlineCrossReader(fs.feature_store(settings), clock=lambda: AT, refresh_s=3600)
    # Before DS2 is loaded the request reads DS1 (within the views' two-day ttl): what a
    # training row reads when its day's partition lags one day.
    before = served(reader, keys)
    np.testing.assert_array_equal(before, trained_on(keys, (DS1,), lag=1))
    assert np.isfinite(before[keys.index(left[0])]).all()

    cf.materialize_cross(DS2, settings=settings, pairs=["user_cat"])
    # The store still holds the left keys' DS1 rows; a reader trusting the newest partition
    # it read before the load answers with them until it re-reads the registry.
    assert np.isfinite(served(reader, left)).all()
    reader.refresh_s = 0
    after = served(reader, keys)
    want = trained_on(keys, (DS1, DS2), lag=0)
    np.testing.assert_array_equal(after, want)
    for key in left + [UNKNOWN]:
        assert np.isnan(after[keys.index(key)]).all(), key
    entered = [k for k in KEYS[DS2] if k not in KEYS[DS1]]
    assert np.isfinite(after[[keys.index(k) for k in entered]]).all()
    # The offline point-in-time join answers the same, row for row.
    rows = pd.DataFrame(
        {
            "user_id": [u for u, _ in keys],
            "item_category": [g for _, g in keys],
            "event_timestamp": [AT] * len(keys),
        }  # fmt: skip
    )
    offline = rows.merge(
        cf.cross_features_at(rows, "user_cat", settings=settings),
        on=["user_id", "item_category", "event_timestamp"],
        how="left",
    )
    np.testing.assert_array_equal(offline[list(FEATURES)].to_numpy(np.float64), want)

    # Loading the older partition again (a backfill) does not bring the left keys back.
    cf.materialize_cross(DS1, settings=settings, pairs=["user_cat"])
    np.testing.assert_array_equal(served(reader, keys), want)


def test_rows_the_reader_holds_give_way_to_any_load_and_to_the_ttl(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    cf.materialize_cross(DS2, settings=settings, pairs=["user_cat"])
    now = [AT]
    reader = OnlineCrossReader(fs.feature_store(settings), clock=lambda: now[0], refresh_s=3600)
    store = reader.online_store
    fetch, fetched = store._fetch, []
    monkeypatch.setattr(store, "_fetch", lambda *a: fetched.append(len(a[2])) or fetch(*a))
    keys = every_key()
    first = served(reader, keys)
    assert np.isfinite(first[keys.index(KEYS[DS2][0])]).all()
    # Read again (the unknown key too): answered from the rows held, no query.
    some = [*keys[:4], UNKNOWN]
    np.testing.assert_array_equal(served(reader, some), first[[keys.index(k) for k in some]])
    assert fetched == [len(keys)]

    # The same partition loaded again with other values (a rerun: the registry's newest
    # partition does not move): the next read answers with the new rows.
    frame = partition(DS2)
    changed = [c for c in FEATURES if frame[c].dtype.kind == "f"]
    frame[changed] += 0.5
    where = job.CrossLake(Lake(settings.lake_root), "generated").pair(job.USER_CAT, DS2)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), where / "p.parquet")
    cf.materialize_cross(DS2, settings=settings, pairs=["user_cat"])
    after = served(reader, keys)
    assert len(fetched) == 2
    uncached = OnlineCrossReader(
        fs.feature_store(settings), clock=lambda: now[0], refresh_s=3600, cache_keys=0
    )
    np.testing.assert_array_equal(after, served(uncached, keys))
    rows = [keys.index(k) for k in KEYS[DS2]]
    np.testing.assert_array_equal(
        after[rows][:, [FEATURES.index(c) for c in changed]],
        first[rows][:, [FEATURES.index(c) for c in changed]] + 0.5,
    )
    # Past the views' two-day ttl the held rows answer missing, as a fresh read does.
    now[0] = AT + dt.timedelta(days=3)
    assert np.isnan(served(reader, keys)).all()
    assert len(fetched) == 2
    with pytest.raises(ValueError, match="cache_keys must be >= 0"):
        OnlineCrossReader(fs.feature_store(settings), cache_keys=-1)


def test_one_requests_reads_ask_the_store_version_once_and_the_next_sees_a_load(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    cf.materialize_cross(DS2, settings=settings, pairs=["user_cat"])
    reader = OnlineCrossReader(fs.feature_store(settings), clock=lambda: AT, refresh_s=3600)
    store = reader.online_store
    version, asked = store.data_version, []
    monkeypatch.setattr(store, "data_version", lambda c: asked.append(1) or version(c))
    keys = every_key()
    with reader.one_version():
        first = served(reader, keys)
        served(reader, keys[:3])
        with reader.one_version():  # nested: the outer one's version
            stamp = reader.stamp(["cross_user_cat"])
            served(reader, keys[:2])
        assert len(asked) == 1
        # Another thread (a shadow version scored by the observer) asks for its own.
        other = threading.Thread(target=served, args=(reader, keys[:1]))
        other.start()
        other.join()
        assert len(asked) == 2
    assert stamp == (version(reader.config), reader.newest_partition("cross_user_cat"))
    served(reader, keys[:2])
    assert len(asked) == 3  # outside one: asked on every read

    frame = partition(DS2)
    changed = [c for c in FEATURES if frame[c].dtype.kind == "f"]
    frame[changed] += 0.5
    where = job.CrossLake(Lake(settings.lake_root), "generated").pair(job.USER_CAT, DS2)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), where / "p.parquet")
    with reader.one_version():
        np.testing.assert_array_equal(served(reader, keys), first)
        cf.materialize_cross(DS2, settings=settings, pairs=["user_cat"])
        # Committed inside the request: the request keeps the version it started with.
        np.testing.assert_array_equal(served(reader, keys), first)
    with reader.one_version():  # the next request reads the load, under another stamp
        after = served(reader, keys)
        assert reader.stamp(["cross_user_cat"]) != stamp
    rows = [keys.index(k) for k in KEYS[DS2]]
    columns = [FEATURES.index(c) for c in changed]
    np.testing.assert_array_equal(after[rows][:, columns], first[rows][:, columns] + 0.5)


def test_an_answer_says_when_the_ttl_first_turns_one_of_its_values_missing(
    settings: Settings,
) -> None:
    cf.materialize_cross(DS2, settings=settings, pairs=["user_cat"])
    now = [AT]
    reader = OnlineCrossReader(fs.feature_store(settings), clock=lambda: now[0], refresh_s=3600)
    keys = every_key()
    expires: list[int] = []
    first = reader.read("cross_user_cat", ["user_id", "item_category"], keys, FEATURES, expires)
    (moment,) = expires
    ttl = reader._view("cross_user_cat")[0].ttl
    # Every row of the partition has the day's midnight as its event time.
    assert moment == micros(dt.datetime.fromisoformat(DS2).replace(tzinfo=dt.UTC) + ttl)
    at = micros(AT)
    assert moment > at
    # At that moment the rows still answer; a microsecond later, none does.
    now[0] = from_micros(moment)
    np.testing.assert_array_equal(served(reader, keys), first)
    now[0] = from_micros(moment + 1)
    assert np.isnan(served(reader, keys)).all()
    # Nothing answered: nothing to expire.
    expires.clear()
    reader.read("cross_user_cat", ["user_id", "item_category"], [UNKNOWN], FEATURES, expires)
    assert expires == []
