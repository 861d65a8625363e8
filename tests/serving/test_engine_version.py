"""A version trained on the cross-statistics engine's training set, served without the legacy
store: its item table is the source's newest published item catalogue, its item fields are read
from the online store once per version, its user and user x category fields per request.

The network is a ColdPreRanker over the id fields and engine statistics of the three served
pairs (``jobs.ctr_training_set.SERVED_PAIRS``), named and kinded as the training-set builder
declares them; the online store is a recording fake over fixed tables keyed as the engine's
``cross_<pair>`` views are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import serving_fakes
import torch
from kserve import InferRequest
from kserve.protocol.infer_type import InferInput

from cascade.config import Settings
from cascade.lake import Lake
from cascade.online_cross import CrossFeatureSource
from jobs import ctr_cross_stats as engine
from jobs.ctr_training_set import SERVED_PAIRS, declarations
from models.preranking.fields import ID_FIELDS, FieldEncoder, FieldSet
from models.preranking.model import ColdPreRanker
from serving.feedback import FeedbackLog, load_joined_feedback
from serving.item_table import lake_item_catalogue
from serving.monitor import MonitorConfig, evaluate_day
from serving.preranking import PreRankingModel, ServingConfig, default_backends
from serving.shadow import ObserverConfig, ServingObserver

SOURCE = "generated"
RUN = "run-engine"
USER_FIELDS = ("user_ctr_7d", "user_imp_7d")
ITEM_FIELDS = ("item_dctr_7d", "item_imp_7d")
CROSS_FIELDS = ("user_cat_ctr_7d",)
ENGINE_FIELDS = (*USER_FIELDS, *ITEM_FIELDS, *CROSS_FIELDS)
USERS = range(1, 12)
ABSENT_USER = 3
"""A user the store holds no statistics of."""
ABSENT_USER_CAT = (4, "Drama")
OUTSIDE = 250
"""An item the store holds statistics of, but the catalogue does not list."""
UNKNOWN = 999_999
ITEM_BATCH = 64


def user_value(name: str, user_id: int) -> float:
    if user_id == ABSENT_USER or user_id not in USERS:
        return math.nan
    return ((user_id * 7) % 11 + 1) / 20 if name == "user_ctr_7d" else 10.0 * user_id


def item_value(name: str, item_id: int) -> float:
    """The store's value (NaN for every seventh item: no statistics)."""
    if item_id % 7 == 0 or not (item_id in serving_fakes.CATALOG or item_id == OUTSIDE):
        return math.nan
    return ((item_id * 3) % 13 + 1) / 30 if name == "item_dctr_7d" else 5.0 * item_id + 1


def user_cat_value(user_id: int, genre: str | None) -> float:
    if genre is None or user_id not in USERS or (user_id, genre) == ABSENT_USER_CAT:
        return math.nan
    return ((user_id * 5 + serving_fakes.GENRES.index(genre) * 3) % 9 + 1) / 15


def engine_rows(
    user_ids: Sequence[int], item_ids: Sequence[int], catalogue: Sequence[int]
) -> pd.DataFrame:
    """Training-set rows as the offline join assembles them: each candidate's category from
    the catalogue (None outside it), its item statistics only when the catalogue lists it."""
    rows = []
    for user_id in user_ids:
        for item_id in item_ids:
            listed = item_id in catalogue
            genre = serving_fakes.genre_of(item_id) if listed else None
            row: dict[str, Any] = {"user_id": user_id, "item_id": item_id, "genre": genre}
            row.update({f: user_value(f, user_id) for f in USER_FIELDS})
            row.update({f: item_value(f, item_id) if listed else math.nan for f in ITEM_FIELDS})
            row["user_cat_ctr_7d"] = user_cat_value(user_id, genre)
            rows.append(row)
    return pd.DataFrame(rows)


def engine_network(seed: int = 5) -> tuple[ColdPreRanker, FieldEncoder]:
    """A ColdPreRanker over the ids and the engine statistics only (no legacy field), kinded
    by the training-set builder's declarations."""
    declared = declarations(SERVED_PAIRS, (7,))
    chosen = {
        name: {"kind": declared[name]["kind"], "window_days": declared[name]["window_days"]}
        for name in ENGINE_FIELDS
    }
    assert [chosen[n]["kind"] for n in ENGINE_FIELDS] == ["user"] * 2 + ["item"] * 2 + ["cross"]
    rows = engine_rows(list(USERS), serving_fakes.CATALOG, serving_fakes.CATALOG)
    field_set = FieldSet.from_declarations(chosen, rows, base=ID_FIELDS)
    encoder = FieldEncoder(field_set, bins=6).fit(rows)
    net = serving_fakes.spread_preranker(seed, tuple(field_set.names), encoder)
    net.eval()
    return net, encoder


class EngineStore:
    """The online store's ``cross_user``, ``cross_item`` and ``cross_user_cat`` views: records
    each read's view and keys."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, list[tuple[Any, ...]]]] = []

    def sources(self, fields: Sequence[str]) -> dict[str, CrossFeatureSource]:
        out = {}
        for pair in (engine.USER, engine.ITEM, engine.USER_CAT):
            for column in engine.feature_columns(pair, (7,)):
                out[column] = CrossFeatureSource(
                    field=column, view=f"cross_{pair.name}", feature=column, join_keys=pair.keys
                )
        return {name: out[name] for name in fields if name in out}

    def read(
        self, view: str, join_keys: Sequence[str], keys: Sequence[Sequence[Any]], features: Any
    ) -> np.ndarray:
        self.reads.append((view, [tuple(k) for k in keys]))
        value: dict[str, Callable[[tuple[Any, ...], str], float]] = {
            "cross_user": lambda key, f: user_value(f, key[0]),
            "cross_item": lambda key, f: item_value(f, key[0]),
            "cross_user_cat": lambda key, f: user_cat_value(key[0], key[1]),
        }
        return np.array(
            [[value[view](tuple(k), f) for f in features] for k in keys], dtype=np.float64
        ).reshape(len(keys), len(features))

    def views(self) -> list[str]:
        return [view for view, _ in self.reads]


def refuse(what: str) -> Callable[..., Any]:
    def called(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"an engine version must not call {what}")

    return called


def serve(
    tmp_path: Path,
    loaded: serving_fakes.FakeLoaded,
    *,
    sources: dict[str, str],
    legacy_allowed: bool = False,
    fake_store: serving_fakes.FakeStore | None = None,
    catalogue: pd.DataFrame | None = None,
) -> tuple[PreRankingModel, EngineStore]:
    store = EngineStore()
    backends = serving_fakes.backends(
        tmp_path / "champion.json", fake_store, sources=sources, catalogue=catalogue
    )
    backends = dataclasses.replace(
        backends,
        champion_version=lambda settings, alias: loaded.version,
        load_champion=lambda settings, alias: loaded,
        open_cross_reader=lambda settings: store,
    )
    if not legacy_allowed:
        backends = dataclasses.replace(
            backends,
            open_feature_store=refuse("open_feature_store"),
            user_features=refuse("user_features"),
            item_features=refuse("item_features"),
            catalog_item_ids=refuse("catalog_item_ids"),
        )
    model = PreRankingModel(
        settings=Settings(home=tmp_path / "home"),
        config=ServingConfig(poll_s=60, max_candidates=1_000, item_batch=ITEM_BATCH),
        backends=backends,
    )
    model.observer = None
    return model, store


def engine_loaded(version: str = "7") -> serving_fakes.FakeLoaded:
    net, encoder = engine_network()
    return serving_fakes.FakeLoaded(model=net, version=version, run_id=RUN, encoder=encoder)


def predict(model: PreRankingModel, user_id: int, item_ids: Sequence[int]) -> np.ndarray:
    inputs = [
        InferInput(name="user_id", shape=[1], datatype="INT64", data=[user_id]),
        InferInput(name="item_ids", shape=[len(item_ids)], datatype="INT64", data=list(item_ids)),
    ]
    request = InferRequest(model_name="preranking", infer_inputs=inputs, request_id="r")
    return np.asarray(asyncio.run(model.predict(request)).outputs[0].data, dtype=np.float64)


def offline_scores(
    loaded: serving_fakes.FakeLoaded, user_id: int, item_ids: Sequence[int]
) -> np.ndarray:
    """The eager network's full forward on the values assembled offline."""
    assert loaded.encoder is not None
    frame = engine_rows([user_id], item_ids, serving_fakes.CATALOG)
    with torch.no_grad():
        logits = loaded.model(loaded.encoder.encode(frame))
    return torch.sigmoid(logits).numpy().astype(np.float64)


CANDIDATES = [*range(1, 41), OUTSIDE, UNKNOWN]


def test_an_engine_version_reads_its_item_fields_once_and_no_legacy_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loaded = engine_loaded()
    model, store = serve(tmp_path, loaded, sources={RUN: SOURCE})
    with caplog.at_level(logging.INFO, logger="serving.preranking"):
        assert model.load()
    served = model._served
    assert served is not None and not served.legacy_store
    # At load: cross_item only, in batches of item_batch, every catalogue item once.
    batches = math.ceil(len(serving_fakes.CATALOG) / ITEM_BATCH)
    assert store.views() == ["cross_item"] * batches
    read_ids = sorted(key[0] for _, keys in store.reads for key in keys)
    assert read_ids == list(serving_fakes.CATALOG)
    assert served.items.columns == ITEM_FIELDS
    assert served.table_fields == set(ITEM_FIELDS)
    assert [r.view for r in served.online.reads] == ["cross_user", "cross_user_cat"]
    assert served.required_fields == {}
    assert "item fields read once, at load, for 200 items" in caplog.text
    # Per request: one read of the user's view and one of user x category, none of items.
    for user_id in (1, 5, ABSENT_USER):
        store.reads.clear()
        scores = predict(model, user_id, CANDIDATES)
        assert np.isfinite(scores).all() and len(scores) == len(CANDIDATES)
        assert sorted(store.views()) == ["cross_user", "cross_user_cat"]
        keys = dict(store.reads)
        assert keys["cross_user"] == [(user_id,)]
        assert sorted(keys["cross_user_cat"]) == [(user_id, g) for g in serving_fakes.GENRES]


def test_engine_scores_equal_the_eager_network_on_the_values_assembled_offline(
    tmp_path: Path,
) -> None:
    loaded = engine_loaded()
    model, _ = serve(tmp_path, loaded, sources={RUN: SOURCE})
    assert model.load()
    for user_id in (1, 4, ABSENT_USER, 10**6):
        got = predict(model, user_id, CANDIDATES)
        want = offline_scores(loaded, user_id, CANDIDATES)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # The item fields matter: with them unknown the scores differ.
    frame = engine_rows([1], CANDIDATES, serving_fakes.CATALOG)
    frame[list(ITEM_FIELDS)] = math.nan
    with torch.no_grad():
        blind = torch.sigmoid(loaded.model(loaded.encoder.encode(frame))).numpy()
    assert not np.allclose(predict(model, 1, CANDIDATES), blind, atol=1e-4)


def test_a_candidate_outside_the_catalogue_scores_with_unknown_item_fields(
    tmp_path: Path,
) -> None:
    """OUTSIDE has statistics in the store, but is not in the catalogue: its item fields are
    NaN (never read per request), its category unknown; no error."""
    loaded = engine_loaded()
    model, store = serve(tmp_path, loaded, sources={RUN: SOURCE})
    assert model.load()
    store.reads.clear()
    got = predict(model, 2, [OUTSIDE, UNKNOWN])
    assert np.isfinite(got).all()
    assert "cross_item" not in store.views()
    frame = engine_rows([2], [OUTSIDE, UNKNOWN], serving_fakes.CATALOG)
    assert frame[list(ITEM_FIELDS)].isna().all().all() and frame["genre"].isna().all()
    np.testing.assert_allclose(got, offline_scores(loaded, 2, [OUTSIDE, UNKNOWN]), atol=1e-5)
    # Had the server read OUTSIDE's statistics, it would have scored differently.
    frame[list(ITEM_FIELDS)] = [[item_value(f, OUTSIDE) for f in ITEM_FIELDS]] * 2
    with torch.no_grad():
        informed = torch.sigmoid(loaded.model(loaded.encoder.encode(frame))).numpy()
    assert abs(float(informed[0]) - float(got[0])) > 1e-4


def test_a_legacy_version_still_reads_the_legacy_store(tmp_path: Path) -> None:
    """The default field set reads the legacy store even when its run names a source; an
    engine-shaped version whose run names none is served from the legacy store too."""
    fake = serving_fakes.FakeStore()
    net, encoder = serving_fakes.cold_network(3)
    legacy = serving_fakes.FakeLoaded(model=net, version="1", run_id=RUN, encoder=encoder)
    model, _ = serve(tmp_path, legacy, sources={RUN: SOURCE}, legacy_allowed=True, fake_store=fake)
    assert model.load() and model._served is not None and model._served.legacy_store
    assert sum(len(ids) for ids in fake.item_calls) == len(serving_fakes.CATALOG)
    predict(model, 5, CANDIDATES)
    assert len(fake.user_calls) == 1 and fake.user_calls[0][0] == 5

    fake = serving_fakes.FakeStore()
    model, store = serve(
        tmp_path, engine_loaded(), sources={}, legacy_allowed=True, fake_store=fake
    )
    assert model.load() and model._served is not None and model._served.legacy_store
    assert fake.item_calls and store.views().count("cross_item") >= 1
    predict(model, 5, CANDIDATES)
    assert len(fake.user_calls) == 1


def test_an_engine_version_without_a_published_catalogue_is_not_served(tmp_path: Path) -> None:
    model, _ = serve(tmp_path, engine_loaded(), sources={RUN: SOURCE})
    model.backends = dataclasses.replace(
        model.backends, item_catalogue=lambda settings, source: None
    )
    with pytest.raises(FileNotFoundError, match="no published item catalogue of 'generated'"):
        model.load()
    assert model._served is None and not model.ready


def test_feedback_of_an_engine_version_records_the_fields_it_read(tmp_path: Path) -> None:
    """The feedback rows hold the version's user fields and item columns as scored (no legacy
    column), and the monitor takes a day without the legacy features without failing."""
    model, _ = serve(tmp_path, engine_loaded(), sources={RUN: SOURCE})
    assert model.load()
    day = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC).timestamp()
    feedback = FeedbackLog(tmp_path / "lake", clock=lambda: day)
    model.observer = ServingObserver(model, ObserverConfig(feedback=True), feedback=feedback)
    try:
        items = [1, 7, OUTSIDE]
        predict(model, 5, items)
        model.observer.drain()
    finally:
        model.observer.close()
    lake = tmp_path / "lake"
    raw = pd.concat(pd.read_parquet(p) for p in (lake / "feedback").rglob("part-*.parquet"))
    # The rows name the item table's snapshot instead of copying its columns, and the user's
    # fields are the request's row ...
    assert not {*ITEM_FIELDS, *USER_FIELDS, "genre"} & set(raw.columns)
    assert raw["item_snapshot"].nunique() == 1
    (request,) = pd.read_parquet(lake / "feedback_requests").to_dict("records")
    assert request["candidates"] == 3 and request["user_id"] == 5
    assert {n: request[n] for n in USER_FIELDS} == {n: user_value(n, 5) for n in USER_FIELDS}
    # ... and the monitor's reader joins them back, one row per candidate.
    frame = load_joined_feedback("2026-11-22", settings=Settings(home=tmp_path))
    assert len(frame) == len(raw) == 3
    assert frame["item_id"].tolist() == items
    assert set(frame.columns) >= {*USER_FIELDS, *ITEM_FIELDS, "genre"}
    assert not {"user_ctr", "item_ctr", "user_impressions"} & set(frame.columns)
    for name in USER_FIELDS:
        assert frame[name].tolist() == [user_value(name, 5)] * 3
    np.testing.assert_array_equal(
        frame["item_dctr_7d"], [item_value("item_dctr_7d", 1), math.nan, math.nan]
    )  # item 7: no statistics in the store; OUTSIDE: not in the catalogue
    assert frame["genre"].tolist() == [serving_fakes.genre_of(1), serving_fakes.genre_of(7), None]
    # A day whose logs carry a legacy column without numbers: no PSI for it, no failure.
    rng = np.random.default_rng(0)
    reference = pd.DataFrame({"user_ctr": rng.random(500), "genre": ["Action"] * 500})
    serving = pd.DataFrame(
        {
            "user_ctr": [math.nan] * 500,
            "genre": ["Action"] * 500,
            "score": rng.random(500),
            "click": rng.integers(0, 2, 500),
        }
    )
    verdict = evaluate_day("2026-11-22", reference, serving, MonitorConfig(min_rows=10))
    assert "user_ctr" not in verdict.psi and "genre" in verdict.psi
    assert any("user_ctr" in reason for reason in verdict.reasons)


def write_partition(lake: Lake, source: str, ds: str, items: list[int], gate: bool | None) -> None:
    """A catalogue partition and its gate verdict (None: no verdict)."""
    folder = lake.ctr_catalogue(source, ds)
    folder.mkdir(parents=True)
    pd.DataFrame(
        {
            "item_id": items,
            "item_category": [serving_fakes.genre_of(i) for i in items],
            "impressions": [3] * len(items),
            "last_seen": [pd.Timestamp(ds, tz="UTC")] * len(items),
        }
    ).to_parquet(folder / "part-00000.parquet")
    if gate is not None:
        report = lake.ctr_cross_gate_report(source, ds)
        report.parent.mkdir(parents=True)
        report.write_text(json.dumps({"success": gate}))


def test_the_catalogue_is_the_newest_partition_whose_gate_passed(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    lake = Lake(settings.lake_root)
    assert lake_item_catalogue(settings, SOURCE) is None  # no catalogue at all
    write_partition(lake, SOURCE, "2026-03-08", [1, 2], gate=True)
    write_partition(lake, SOURCE, "2026-03-09", [3, 4, 5], gate=True)
    write_partition(lake, SOURCE, "2026-03-10", [6], gate=False)
    write_partition(lake, SOURCE, "2026-03-11", [7], gate=None)
    write_partition(lake, "other", "2026-03-12", [8], gate=True)
    # A verdict without a catalogue is no partition to read.
    orphan = lake.ctr_cross_gate_report(SOURCE, "2026-03-13")
    orphan.parent.mkdir(parents=True)
    orphan.write_text(json.dumps({"success": True}))
    frame = lake_item_catalogue(settings, SOURCE)
    assert frame is not None
    assert list(frame.columns) == ["item_id", "item_category"]
    assert frame["item_id"].tolist() == [3, 4, 5]
    assert frame["item_category"].tolist() == [serving_fakes.genre_of(i) for i in (3, 4, 5)]
    other = lake_item_catalogue(settings, "other")
    assert other is not None and other["item_id"].tolist() == [8]
    assert lake_item_catalogue(settings, "absent") is None
    # The engine writes where the server reads: one definition of both paths.
    where = engine.CrossLake(lake, SOURCE)
    assert where.catalogue("2026-03-09") == lake.ctr_catalogue(SOURCE, "2026-03-09")
    assert where.gate_report("2026-03-09") == lake.ctr_cross_gate_report(SOURCE, "2026-03-09")


def test_the_default_backend_reads_a_version_source_from_its_run_param(tmp_path: Path) -> None:
    """The train step logs ``cross_source``; a run without it is a legacy version."""
    import mlflow

    from models.preranking.inference import CROSS_SOURCE_PARAM, run_cross_source

    settings = Settings(home=tmp_path, mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    experiment = client.create_experiment("preranking")
    engine_run = client.create_run(experiment).info.run_id
    client.log_param(engine_run, CROSS_SOURCE_PARAM, SOURCE)
    legacy_run = client.create_run(experiment).info.run_id
    client.log_param(legacy_run, "epochs", "2")
    assert CROSS_SOURCE_PARAM == "cross_source"
    assert run_cross_source(settings, engine_run) == SOURCE
    assert run_cross_source(settings, legacy_run) is None
    backends = default_backends()
    assert backends.version_source is run_cross_source
    assert backends.item_catalogue is lake_item_catalogue


@pytest.mark.slow
def test_an_engine_version_is_scored_by_its_compiled_package(tmp_path: Path) -> None:
    """The package gets the item fields' codes from the table, as the eager network would."""
    from compilers.preranking import compile_cold_preranking

    loaded = engine_loaded()
    package = compile_cold_preranking(loaded.model, tmp_path / "preranking.pt2", fast_build=True)
    loaded = dataclasses.replace(loaded, compiled=package.path)
    model, _ = serve(tmp_path, loaded, sources={RUN: SOURCE})
    assert model.load()
    assert model._served is not None and model._served.backend == "compiled"
    for user_id in (5, ABSENT_USER):
        np.testing.assert_allclose(
            predict(model, user_id, CANDIDATES),
            offline_scores(loaded, user_id, CANDIDATES),
            rtol=0,
            atol=1e-5,
        )
