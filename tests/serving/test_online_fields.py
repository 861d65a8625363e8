"""A served version's cross-statistic fields read from the online store per request, no skew.

A tiny ``user_cat`` partition in the engine's layout is materialized into a private SQLite
online store (``materialize_cross``); a ColdPreRanker that reads the ids, two of its statistics
and one of ``seg_item`` (keyed by a segment no request carries) is served with the fake registry
and catalogue of ``serving_fakes`` and the real Feast cross reader.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import serving_fakes
import torch
from kserve import InferRequest
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferInput

from cascade.config import Settings
from cascade.lake import Lake
from domains.ctr import feature_store as fs
from domains.ctr.online_cross import CrossFeatureSource, OnlineCrossReader, cross_feature_sources
from jobs import ctr_cross_features as cf
from jobs import ctr_cross_stats as job
from serving.online_fields import OnlineFieldPlan
from serving.preranking import PreRankingModel, ServingConfig

DS = "2026-03-10"
SERVED_AT = dt.datetime(2026, 3, 10, 15, 30, tzinfo=dt.UTC)
"""A request on the partition's day: the partition of windows ending at DS answers it."""
STALE_AT = SERVED_AT + dt.timedelta(days=3)
"""Past the views' ttl (two days) without a newer partition: nothing answers."""
CTR, DCTR = "user_cat_ctr_7d", "user_cat_dctr_30d"
SEGMENT_FIELD = "seg_item_ctr_7d"
"""Keyed by user_segment, which no request carries: the request must send it."""
DECLARATIONS = {
    CTR: {"kind": "cross", "window_days": 7},
    DCTR: {"kind": "cross", "window_days": 30},
    SEGMENT_FIELD: {"kind": "cross", "window_days": 7},
}
USERS = range(1, 12)
ABSENT = {(5, "Drama"), (9, "Action")}
"""(user, genre) keys the partition does not hold."""
UNKNOWN_USER = 10**6


def statistic(field: str, user_id: int, genre: str) -> float:
    """The partition's value of ``field`` for a (user, genre) key."""
    g = serving_fakes.GENRES.index(genre)
    shift = 0 if field == CTR else 5
    return ((user_id * 7 + g * 3 + shift) % 13 + 1) / 20.0


def segment_value(user_id: int, item_id: int) -> float:
    return ((user_id * 3 + item_id) % 7) / 10.0


def write_user_cat_partition(settings: Settings) -> None:
    """The ``dt=DS`` partition of ``user_cat`` as the engine writes it (keys, event_timestamp,
    every feature column)."""
    keys = [(u, g) for u in USERS for g in serving_fakes.GENRES if (u, g) not in ABSENT]
    pair = job.USER_CAT
    columns: dict[str, pa.Array] = {
        "user_id": pa.array([u for u, _ in keys], pa.int64()),
        "item_category": pa.array([g for _, g in keys]),
        job.TIMESTAMP: pa.array([job.ds_midnight(DS)] * len(keys), pa.timestamp("us", tz="UTC")),
    }
    for column in job.feature_columns(pair, (1, 7, 30)):
        if column in (CTR, DCTR):
            columns[column] = pa.array([statistic(column, u, g) for u, g in keys], pa.float64())
        elif "_imp_" in column or "_clk_" in column:
            columns[column] = pa.array([u + len(g) for u, g in keys], pa.int64())
        else:
            columns[column] = pa.array([u / 10 for u, _ in keys], pa.float64())
    where = job.CrossLake(Lake(settings.lake_root), "generated").pair(pair, DS)
    where.mkdir(parents=True)
    pq.write_table(pa.table(columns), where / "part-00000.parquet")


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    home = tmp_path_factory.mktemp("online-fields")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CASCADE_HOME", str(home))
        patch.delenv("CASCADE_PROFILE", raising=False)
        settings = Settings(home=home)
        write_user_cat_partition(settings)
        cf.materialize_cross(DS, settings=settings, pairs=["user_cat"])
        yield settings


def network_rows() -> pd.DataFrame:
    """The fields' values over the rows the encoder of ``serving_fakes.engine_network`` is
    fitted on (every user x the catalogue)."""
    rows = serving_fakes.engine_rows(list(USERS), serving_fakes.CATALOG)
    out = {}
    for name in (CTR, DCTR):
        out[name] = [
            math.nan if (u, g) in ABSENT else statistic(name, u, g)
            for u, g in zip(rows["user_id"], rows["genre"], strict=True)
        ]
    out[SEGMENT_FIELD] = [
        segment_value(u, i) for u, i in zip(rows["user_id"], rows["item_id"], strict=True)
    ]
    return pd.DataFrame(out)


@pytest.fixture(scope="module")
def served(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``(model, reader, reads, clock)``: the server with the version loaded; ``reads`` lists
    the keys of every online-store call of the reader."""
    net, encoder = serving_fakes.engine_network(7, extra=network_rows(), declared=DECLARATIONS)
    loaded = serving_fakes.FakeLoaded(model=net, version="1", run_id="run-1", encoder=encoder)
    clock = serving_fakes.PinnedClock(SERVED_AT)
    reader = OnlineCrossReader(fs.feature_store(settings), clock=clock)
    reads: list[list[Any]] = []
    online_read = reader.online_store.online_read

    def counted(**kwargs: Any) -> Any:
        reads.append(list(kwargs["entity_keys"]))
        return online_read(**kwargs)

    reader.online_store.online_read = counted  # type: ignore[method-assign]
    # The local profile stores the pair views packed: the reader's one call is read_rows (the
    # keys it does not hold since the store last changed).
    read_rows = getattr(reader.online_store, "read_rows", None)
    if read_rows is not None:

        def counted_rows(config: Any, table: Any, join_keys: Any, keys: Any, *args: Any) -> Any:
            reads.append(list(keys))
            return read_rows(config, table, join_keys, keys, *args)

        reader.online_store.read_rows = counted_rows  # type: ignore[method-assign]
    champion = tmp_path_factory.mktemp("champion") / "champion.json"
    backends = dataclasses.replace(
        serving_fakes.backends(champion),
        champion_version=lambda settings, alias: "1",
        load_champion=lambda settings, alias: loaded,
        open_cross_reader=lambda settings: reader,
    )
    model = PreRankingModel(
        settings=settings,
        config=ServingConfig(poll_s=60, max_candidates=100),
        backends=backends,
    )
    assert model.load()
    yield model, reader, reads, clock


def predict(model: PreRankingModel, user_id: int, item_ids: list[int], **fields: Any) -> Any:
    inputs = [
        InferInput(name="user_id", shape=[1], datatype="INT64", data=[user_id]),
        InferInput(name="item_ids", shape=[len(item_ids)], datatype="INT64", data=item_ids),
    ]
    for name, values in fields.items():
        data = [None if v is None or math.isnan(v) else float(v) for v in values]
        inputs.append(InferInput(name=name, shape=[len(data)], datatype="FP64", data=data))
    request = InferRequest(model_name="preranking", infer_inputs=inputs)
    return np.asarray(asyncio.run(model.predict(request)).outputs[0].data)


CANDIDATES = [*range(1, 31), 999_999]
"""Thirty catalogue items of the three genres and one item the table does not know."""


def partition_values(user_id: int, item_ids: list[int]) -> dict[str, list[float]]:
    """What the partition holds for each candidate's (user, genre) key (NaN: no key)."""
    out: dict[str, list[float]] = {CTR: [], DCTR: []}
    for item_id in item_ids:
        genre = serving_fakes.genre_of(item_id) if item_id in serving_fakes.CATALOG else None
        for name in out:
            known = genre is not None and user_id in USERS and (user_id, genre) not in ABSENT
            out[name].append(statistic(name, user_id, genre) if known else math.nan)
    return out


def test_the_server_reads_the_served_fields_from_the_online_store_once_per_pair(
    served: Any,
) -> None:
    model, _, reads, clock = served
    clock.now = SERVED_AT
    version = model._served
    assert version.request_fields == dict.fromkeys(DECLARATIONS, "cross")
    assert version.online.fields == {CTR, DCTR}
    assert [r.view for r in version.online.reads] == ["cross_user_cat"]
    # A field no view can be keyed for still comes with every request: 400 naming only it.
    with pytest.raises(InvalidInput, match=rf"missing inputs \['{SEGMENT_FIELD}'\]"):
        predict(model, 5, CANDIDATES)
    segment = [segment_value(5, i) for i in CANDIDATES]
    reads.clear()
    got = predict(model, 5, CANDIDATES, **{SEGMENT_FIELD: segment})
    # One online read for the pair's two fields, its keys deduplicated: one per genre.
    assert len(reads) == 1
    assert len(reads[0]) == len(serving_fakes.GENRES)
    # The same scores as a request carrying the partition's values itself (and then the
    # server reads nothing: the request's values win).
    explicit = partition_values(5, CANDIDATES)
    assert math.isnan(explicit[CTR][-1]) and any(math.isnan(v) for v in explicit[CTR][:-1])
    reads.clear()
    want = predict(model, 5, CANDIDATES, **{SEGMENT_FIELD: segment}, **explicit)
    assert reads == []
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # The values matter: unknown everywhere scores differently.
    blind = {name: [math.nan] * len(CANDIDATES) for name in (CTR, DCTR)}
    unknown = predict(model, 5, CANDIDATES, **{SEGMENT_FIELD: segment}, **blind)
    assert not np.allclose(got, unknown, atol=1e-4)
    # A request value overrides the store's for its field only.
    reads.clear()
    partly = predict(model, 5, CANDIDATES, **{SEGMENT_FIELD: segment, CTR: blind[CTR]})
    assert len(reads) == 1
    mixed = predict(
        model, 5, CANDIDATES, **{SEGMENT_FIELD: segment, CTR: blind[CTR], DCTR: explicit[DCTR]}
    )
    np.testing.assert_allclose(partly, mixed, rtol=0, atol=1e-6)


def test_keys_the_store_does_not_hold_score_as_missing(served: Any) -> None:
    model, _, reads, clock = served
    clock.now = SERVED_AT
    segment = [segment_value(UNKNOWN_USER, i) for i in CANDIDATES]
    blind = {name: [math.nan] * len(CANDIDATES) for name in (CTR, DCTR)}
    reads.clear()
    got = predict(model, UNKNOWN_USER, CANDIDATES, **{SEGMENT_FIELD: segment})
    assert len(reads) == 1
    want = predict(model, UNKNOWN_USER, CANDIDATES, **{SEGMENT_FIELD: segment}, **blind)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # Only items the table does not know (no genre, so no key): no read of an empty batch.
    reads.clear()
    alone = predict(model, 5, [999_999], **{SEGMENT_FIELD: [0.1]})
    assert np.isfinite(alone).all()


def test_the_served_values_equal_the_offline_point_in_time_values(
    served: Any, settings: Settings
) -> None:
    """No skew: for (user, item, time) rows the values the scorer received from the online
    store equal ``cross_features_at`` (offline point in time) for the same rows, inside and
    past the views' ttl."""
    model, _, _, clock = served
    version = model._served
    received: list[dict[str, np.ndarray]] = []
    logits = version.scorer.logits

    def recording(*args: Any, extra: Any = None, keyed: Any = None, **rest: Any) -> Any:
        # The per-candidate fields read online come per distinct key, never expanded to one
        # value per candidate on the way.
        assert set(keyed) == {CTR, DCTR} and not {CTR, DCTR} & set(extra)
        values = {name: keyed[name].expanded() for name in (CTR, DCTR)}
        received.append(values)
        got = logits(*args, extra=extra, keyed=keyed, **rest)
        # Encoded per key and gathered, they give the logits encoding each candidate's value.
        every = {**extra, **values}
        torch.testing.assert_close(got, logits(*args, extra=every), rtol=0, atol=0)
        return got

    version.scorer.logits = recording
    items = list(range(1, 16))
    rows, served_values = [], {CTR: [], DCTR: []}
    try:
        for when in (SERVED_AT, STALE_AT):
            clock.now = when
            for user_id in (1, 5, 9, UNKNOWN_USER):
                received.clear()
                segment = [segment_value(user_id, i) for i in items]
                predict(model, user_id, items, **{SEGMENT_FIELD: segment})
                (values,) = received
                for name in (CTR, DCTR):
                    served_values[name] += values[name].tolist()
                rows += [
                    {
                        "user_id": user_id,
                        "item_category": serving_fakes.genre_of(i),
                        "event_timestamp": when,
                    }
                    for i in items
                ]
    finally:
        version.scorer.logits = logits
        clock.now = SERVED_AT
    offline = cf.cross_features_at(pd.DataFrame(rows), "user_cat", settings=settings)
    offline = pd.DataFrame(rows).merge(
        offline.drop_duplicates(["user_id", "item_category", "event_timestamp"]),
        on=["user_id", "item_category", "event_timestamp"],
        how="left",
    )
    for name in (CTR, DCTR):
        online = np.asarray(served_values[name], dtype=np.float64)
        np.testing.assert_array_equal(online, offline[name].to_numpy(np.float64))
    half = len(rows) // 2
    assert np.isfinite(online[:half]).sum() > half // 2  # most keys answer on the day
    assert np.isnan(online[half:]).all()  # and none once stale


class RecordingReader:
    """A reader over fixed tables: records each read's view and keys."""

    def __init__(self, tables: dict[str, dict[tuple, dict[str, float]]]) -> None:
        self.tables = tables
        self.reads: list[tuple[str, list[tuple]]] = []

    def sources(self, fields: Any) -> dict[str, CrossFeatureSource]:
        return {}

    def read(self, view: str, join_keys: Any, keys: Any, features: Any) -> np.ndarray:
        self.reads.append((view, list(keys)))
        table = self.tables[view]
        return np.array(
            [[table.get(tuple(k), {}).get(f, math.nan) for f in features] for k in keys],
            dtype=np.float64,
        ).reshape(len(keys), len(features))


def test_the_plan_reads_each_view_once_with_distinct_keys() -> None:
    """Two views (user x genre, and one keyed by the item alone), a user field and a field of
    a pair no request can key: one read per view, keys deduplicated, unknown keys NaN."""

    def source(field: str, view: str, keys: tuple[str, ...]) -> CrossFeatureSource:
        return CrossFeatureSource(field=field, view=view, feature=field, join_keys=keys)

    sources = {
        "ug_a": source("ug_a", "cross_user_cat", ("user_id", "item_category")),
        "ug_b": source("ug_b", "cross_user_cat", ("user_id", "item_category")),
        "it_a": source("it_a", "cross_item", ("item_id",)),
        "us_a": source("us_a", "cross_user", ("user_id",)),
        "ic_a": source("ic_a", "cross_item_cat", ("item_id", "item_category")),
        "seg": source("seg", "cross_seg_cat", ("user_segment", "item_category")),
        # A user field keyed per candidate cannot be one value per request.
        "bad_user": source("bad_user", "cross_item", ("item_id",)),
    }
    fields = dict.fromkeys(["ug_a", "ug_b", "it_a", "ic_a", "seg"], "cross") | {
        "us_a": "user",
        "bad_user": "user",
    }
    plan = OnlineFieldPlan.build(fields, sources)
    assert plan.fields == {"ug_a", "ug_b", "it_a", "ic_a", "us_a"}
    genres = ("Action", "Comedy", "Drama")
    reader = RecordingReader(
        {
            "cross_user_cat": {
                (4, "Action"): {"ug_a": 1.0, "ug_b": 2.0},
                (4, "Drama"): {"ug_a": 3.0},
            },
            "cross_item": {(10,): {"it_a": 0.5}, (12,): {"it_a": 0.25}},
            "cross_user": {(4,): {"us_a": 9.0}},
            "cross_item_cat": {(10, "Comedy"): {"ic_a": 7.0}},
        }
    )
    item_ids = np.array([10, 11, 12, 10, 13, 14] * 100, dtype=np.int64)
    codes = np.array([0, 2, 0, 1, -1, 0] * 100, dtype=np.int64)
    keyed: dict[str, Any] = {}
    by_key = plan.values(
        reader, user_id=4, item_ids=item_ids, genre_codes=codes, genres=genres, keyed=keyed
    )
    # Asked for them per distinct key, the per-candidate fields come only that way (the user
    # field is one value already), with the values of one per candidate.
    assert set(keyed) == {"ug_a", "ug_b", "it_a", "ic_a"} and set(by_key) == {"us_a"}
    reader.reads.clear()
    values = plan.values(reader, user_id=4, item_ids=item_ids, genre_codes=codes, genres=genres)
    np.testing.assert_array_equal(by_key["us_a"], values["us_a"])
    for name, column in keyed.items():
        assert len(column.values) == len(set(column.inverse.tolist())) <= 5
        expanded = np.full(len(item_ids), math.nan)
        expanded[column.valid] = column.values[column.inverse]
        np.testing.assert_array_equal(expanded, values[name])
        np.testing.assert_array_equal(column.expanded(), values[name])
    assert sorted(view for view, _ in reader.reads) == [
        "cross_item",
        "cross_item_cat",
        "cross_user",
        "cross_user_cat",
    ]
    keys = dict(reader.reads)
    assert sorted(keys["cross_user_cat"]) == [(4, "Action"), (4, "Comedy"), (4, "Drama")]
    assert sorted(keys["cross_item"]) == [(10,), (11,), (12,), (13,), (14,)]
    # Two candidate columns: the distinct (item, genre) pairs of the candidates with a genre.
    assert sorted(keys["cross_item_cat"]) == [
        (10, "Action"),
        (10, "Comedy"),
        (11, "Drama"),
        (12, "Action"),
        (14, "Action"),
    ]
    nan = math.nan
    np.testing.assert_array_equal(values["ug_a"][:6], [1.0, 3.0, 1.0, nan, nan, 1.0])
    np.testing.assert_array_equal(values["ug_b"][:6], [2.0, nan, 2.0, nan, nan, 2.0])
    np.testing.assert_array_equal(values["it_a"][:6], [0.5, nan, 0.25, 0.5, nan, nan])
    np.testing.assert_array_equal(values["us_a"], [9.0])
    np.testing.assert_array_equal(values["ic_a"][:6], [nan, nan, nan, 7.0, nan, nan])
    # Given fields are not read; a view whose fields are all given is not read at all.
    reader.reads.clear()
    given = {"it_a": np.zeros(len(item_ids)), "ug_a": np.zeros(len(item_ids))}
    values = plan.values(
        reader, user_id=4, item_ids=item_ids, genre_codes=codes, genres=genres, given=given
    )
    assert sorted(view for view, _ in reader.reads) == [
        "cross_item_cat",
        "cross_user",
        "cross_user_cat",
    ]
    assert set(values) == {"ug_b", "us_a", "ic_a"}


def test_every_engine_column_maps_to_its_pair_view_and_keys(settings: Settings) -> None:
    """The naming convention, checked on the applied store: each column of each pair
    (``jobs.ctr_cross_stats.feature_columns``) is served by ``cross_<pair>`` under its own name,
    keyed by the pair's key columns; other names are served by no view."""
    store = fs.feature_store(settings)
    columns = {
        column: pair
        for pair in job.GENERATED_PAIRS
        for column in job.feature_columns(pair, (1, 7, 30))
    }
    found = cross_feature_sources(store, [*columns, "user_ctr", "ctr_user_x_item_genre_7d"])
    assert set(found) == set(columns)
    for column, pair in columns.items():
        source = found[column]
        assert (source.view, source.feature, source.pair) == (
            f"cross_{pair.name}",
            column,
            pair.name,
        )
        assert set(source.join_keys) == set(pair.keys)


def test_a_store_without_cross_views_leaves_the_fields_to_the_request(tmp_path: Path) -> None:
    """No reader (or no view holding a field): the field comes with the request, 400 without."""
    net, encoder = serving_fakes.engine_network(7, extra=network_rows(), declared=DECLARATIONS)
    loaded = serving_fakes.FakeLoaded(model=net, version="2", run_id="run-2", encoder=encoder)
    backends = dataclasses.replace(
        serving_fakes.backends(tmp_path / "champion.json"),
        champion_version=lambda settings, alias: "2",
        load_champion=lambda settings, alias: loaded,
        open_cross_reader=lambda settings: None,
    )
    model = PreRankingModel(
        settings=Settings(home=tmp_path / "home"),
        config=ServingConfig(poll_s=60, max_candidates=100),
        backends=backends,
    )
    assert model.load()
    assert model._served.online.reads == ()
    with pytest.raises(InvalidInput, match=r"missing inputs \['user_cat_ctr_7d', "):
        predict(model, 5, [1, 2], **{SEGMENT_FIELD: [0.1, 0.2]})
