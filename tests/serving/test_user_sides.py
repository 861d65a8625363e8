"""Each user's share of the pre-ranker's inputs held between requests (``serving.user_sides``).

Partitions of the ``user`` and ``user_cat`` pairs in the engine's layout are materialized into
a private packed SQLite online store; a ColdPreRanker reading the ids, two user statistics and
two user x genre statistics is served with the fake registry and catalogue of ``serving_fakes``
and the real cross reader. Every request is scored twice, from the held side and by the full
path (read and encode per request), and the two must agree code for code.
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
from kserve import InferRequest
from kserve.protocol.infer_type import InferInput

from cascade.config import Settings
from cascade.lake import Lake
from domains.ctr import feature_store as fs
from domains.ctr.online_cross import OnlineCrossReader
from jobs import ctr_cross_features as cf
from jobs import ctr_cross_stats as job
from serving.cold_scorer import UserSide
from serving.online_fields import OnlineFieldPlan, ViewRead
from serving.preranking import PreRankingModel, ServingConfig
from serving.user_sides import UserSides, user_side_views

DS = "2026-03-10"
SERVED_AT = dt.datetime(2026, 3, 10, 15, 30, tzinfo=dt.UTC)
USERS = range(1, 12)
ABSENT = {(5, "Drama"), (9, "Action")}
"""(user, genre) keys the partition does not hold."""
USER_FIELDS = ("user_ctr_7d", "user_dctr_30d")
CROSS_FIELDS = ("user_cat_ctr_7d", "user_cat_dctr_30d")
DECLARATIONS = {
    USER_FIELDS[0]: {"kind": "user", "window_days": 7},
    USER_FIELDS[1]: {"kind": "user", "window_days": 30},
    CROSS_FIELDS[0]: {"kind": "cross", "window_days": 7},
    CROSS_FIELDS[1]: {"kind": "cross", "window_days": 30},
}
CANDIDATES = [*range(1, 31), 999_999]
"""Thirty catalogue items of the three genres and one item the table does not know."""


def value(field: str, user_id: int, genre: str | None, shift: float = 0.0) -> float:
    g = 0 if genre is None else serving_fakes.GENRES.index(genre) + 1
    return ((user_id * 7 + g * 3 + len(field)) % 13 + 1) / 20.0 + shift


def write_partitions(settings: Settings, shift: float = 0.0) -> None:
    """``dt=DS`` of the ``user`` and ``user_cat`` pairs, as the engine writes them."""
    lake = job.CrossLake(Lake(settings.lake_root), "generated")
    for pair, keys in (
        (job.USER, [(u, None) for u in USERS]),
        (
            job.USER_CAT,
            [(u, g) for u in USERS for g in serving_fakes.GENRES if (u, g) not in ABSENT],
        ),
    ):
        columns: dict[str, pa.Array] = {"user_id": pa.array([u for u, _ in keys], pa.int64())}
        if pair is job.USER_CAT:
            columns["item_category"] = pa.array([g for _, g in keys])
        columns[job.TIMESTAMP] = pa.array(
            [job.ds_midnight(DS)] * len(keys), pa.timestamp("us", tz="UTC")
        )
        for column in job.feature_columns(pair, (1, 7, 30)):
            if "_imp_" in column or "_clk_" in column:
                columns[column] = pa.array([u + 3 for u, _ in keys], pa.int64())
            else:
                columns[column] = pa.array(
                    [value(column, u, g, shift) for u, g in keys], pa.float64()
                )
        where = lake.pair(pair, DS)
        where.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns), where / "part-00000.parquet")


def network_rows() -> pd.DataFrame:
    rows = serving_fakes.engine_rows(list(USERS), serving_fakes.CATALOG)
    out: dict[str, list[float]] = {}
    for name in USER_FIELDS:
        out[name] = [value(name, u, None) for u in rows["user_id"]]
    for name in CROSS_FIELDS:
        out[name] = [
            math.nan if (u, g) in ABSENT else value(name, u, g)
            for u, g in zip(rows["user_id"], rows["genre"], strict=True)
        ]
    return pd.DataFrame(out)


@pytest.fixture()
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``(model, settings, reads, clock)``: the version loaded; ``reads`` lists the views of
    the store's queries."""
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.delenv("CASCADE_PROFILE", raising=False)
    settings = Settings(home=tmp_path)  # type: ignore[arg-type]
    write_partitions(settings)
    cf.materialize_cross(DS, settings=settings, pairs=["user", "user_cat"])
    net, encoder = serving_fakes.engine_network(7, extra=network_rows(), declared=DECLARATIONS)
    loaded = serving_fakes.FakeLoaded(model=net, version="1", run_id="run-1", encoder=encoder)
    clock = serving_fakes.PinnedClock(SERVED_AT)
    reader = OnlineCrossReader(fs.feature_store(settings), clock=clock)
    reads: list[str] = []
    read_rows = reader.online_store.read_rows

    def counted(config: Any, table: Any, *args: Any) -> Any:
        reads.append(table.name)
        return read_rows(config, table, *args)

    reader.online_store.read_rows = counted  # type: ignore[method-assign]
    backends = dataclasses.replace(
        serving_fakes.backends(tmp_path / "champion.json"),
        champion_version=lambda settings, alias: "1",
        load_champion=lambda settings, alias: loaded,
        open_cross_reader=lambda settings: reader,
    )
    model = PreRankingModel(
        settings=settings, config=ServingConfig(poll_s=60, max_candidates=100), backends=backends
    )
    assert model.load()
    model.observer = None
    yield model, settings, reads, clock


def both_paths(model: PreRankingModel, user_id: int, item_ids: list[int]) -> tuple[Any, Any]:
    """The request scored from the held side, then by the full path (no side held)."""
    served = model._serving()
    ids = np.asarray(item_ids, dtype=np.int64)
    held = model.score_request(served, user_id, ids, None)
    return held, model.score_request(served, user_id, ids, None, held=False)


def test_a_held_side_scores_every_request_as_the_full_path_and_reads_once_per_user(
    served: Any,
) -> None:
    model, _, reads, _ = served
    version = model._serving()
    sides = version.user_sides
    assert sides is not None and sides.views == ("cross_user", "cross_user_cat")
    for user_id in (1, 5, 9, 10**6):  # two with a genre the store lacks, one unknown
        reads.clear()
        held, full = both_paths(model, user_id, CANDIDATES)
        np.testing.assert_array_equal(held.scores, full.scores)
        np.testing.assert_equal(held.user, full.user)  # NaN equal to NaN
        assert set(held.user) == set(USER_FIELDS)
        # The held side was built by one read of each view (the full path then reads the
        # keys its rows cache lacks: none).
        assert sorted(reads) == ["cross_user", "cross_user_cat"]
    builds = sides.builds
    for user_id in (1, 5, 9):  # again, other candidates: the sides are held, nothing read
        reads.clear()
        held, full = both_paths(model, user_id, CANDIDATES[::-1][:7])
        np.testing.assert_array_equal(held.scores, full.scores)
        assert reads == []
    assert sides.builds == builds and sides.hits >= 3
    # The values matter: another user scores differently.
    other, _ = both_paths(model, 2, CANDIDATES)
    first, _ = both_paths(model, 1, CANDIDATES)
    assert not np.allclose(other.scores, first.scores, atol=1e-4)


def test_a_load_of_the_store_and_the_ttl_retire_a_held_side(served: Any) -> None:
    model, settings, reads, clock = served
    sides = model._serving().user_sides
    before, _ = both_paths(model, 3, CANDIDATES)
    # The same partition loaded again with other values: the store's data version moves.
    write_partitions(settings, shift=0.3)
    cf.materialize_cross(DS, settings=settings, pairs=["user", "user_cat"])
    builds = sides.builds
    after, full = both_paths(model, 3, CANDIDATES)
    assert sides.builds == builds + 1
    np.testing.assert_array_equal(after.scores, full.scores)
    assert after.user != before.user
    assert not np.allclose(after.scores, before.scores, atol=1e-5)
    # Past the views' two-day ttl every value is missing: the held side is retired, and the
    # rebuilt one scores as the full path does.
    clock.now = SERVED_AT + dt.timedelta(days=3)
    stale, full = both_paths(model, 3, CANDIDATES)
    assert sides.builds == builds + 2
    np.testing.assert_array_equal(stale.scores, full.scores)
    assert all(math.isnan(v) for v in stale.user.values())
    assert not np.allclose(stale.scores, after.scores, atol=1e-5)


def test_a_request_carrying_its_own_values_takes_the_full_path(served: Any) -> None:
    model, _, reads, _ = served
    sides = model._serving().user_sides
    given = [0.05] * len(CANDIDATES)
    inputs = [
        InferInput(name="user_id", shape=[1], datatype="INT64", data=[4]),
        InferInput(name="item_ids", shape=[len(CANDIDATES)], datatype="INT64", data=CANDIDATES),
        InferInput(name=CROSS_FIELDS[0], shape=[len(given)], datatype="FP64", data=given),
    ]
    request = InferRequest(model_name="preranking", infer_inputs=inputs)
    got = np.asarray(asyncio.run(model.predict(request)).outputs[0].data)
    assert sides.builds == 0 and len(sides) == 0
    assert "cross_user_cat" in reads
    plain, _ = both_paths(model, 4, CANDIDATES)
    assert not np.allclose(got, plain.scores, atol=1e-6)


def side(user: int) -> UserSide:
    return UserSide(
        user=np.full((1, 3), user),
        cross_columns=np.array([2]),
        cross_codes=np.array([[user], [0]]),
        width=3,
        values={"f": float(user)},
    )


def test_held_sides_answer_only_under_their_stamp_and_before_they_expire() -> None:
    sides = UserSides(("cross_user",), max_users=2)
    sides.put(1, ("v1",), 1_000, side(1))
    sides.put(2, ("v1",), None, side(2))
    assert sides.get(1, ("v1",), 999) is not None
    assert sides.get(1, ("v1",), 1_000) is None  # expired at its moment
    assert sides.get(1, ("v2",), 0) is None  # the store moved
    assert sides.get(2, ("v1",), 10**18) is not None  # no age bound
    np.testing.assert_array_equal(side(2).genre_cross(), [[0, 0, 2], [0, 0, 0]])
    sides.put(3, ("v1",), None, side(3))  # past max_users: the others are dropped
    assert len(sides) == 1 and sides.get(2, ("v1",), 0) is None
    with pytest.raises(ValueError, match="max_users"):
        UserSides(("cross_user",), max_users=0)


def read(view: str, keys: tuple[str, ...], kinds: tuple[str, ...]) -> ViewRead:
    return ViewRead(view=view, join_keys=keys, fields=tuple(f"f{i}" for i in kinds), kinds=kinds)


def test_only_versions_read_by_user_and_genre_alone_hold_sides() -> None:
    user = read("cross_user", ("user_id",), ("user",))
    user_cat = read("cross_user_cat", ("user_id", "item_category"), ("cross",))
    plan = OnlineFieldPlan((user, user_cat))
    assert user_side_views(plan, keyed_cross=True, required={}) == (
        "cross_user",
        "cross_user_cat",
    )
    assert user_side_views(plan, keyed_cross=False, required={}) == ()
    assert user_side_views(plan, keyed_cross=True, required={"seg_ctr": "cross"}) == ()
    assert user_side_views(OnlineFieldPlan(()), keyed_cross=True, required={}) == ()
    by_item = read("cross_user_item", ("user_id", "item_id"), ("cross",))
    assert user_side_views(OnlineFieldPlan((user, by_item)), keyed_cross=True, required={}) == ()
    item_kind = read("cross_user_cat", ("user_id", "item_category"), ("item",))
    assert user_side_views(OnlineFieldPlan((item_kind,)), keyed_cross=True, required={}) == ()
