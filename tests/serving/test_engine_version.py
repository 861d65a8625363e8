"""A version trained on the cross-statistics engine's training set, as the server serves it:
its item table is the source's newest published item catalogue, its item fields are read from
the online store once per version, its user and user x category fields per request; any other
version is refused when it loads.

The network is a ColdPreRanker over the id fields and engine statistics of the three served
pairs (``jobs.ctr_training_set.SERVED_PAIRS``), named and kinded as the training-set builder
declares them (``serving_fakes.engine_network``); the online store is a recording fake over
fixed tables keyed as the engine's ``cross_<pair>`` views are (``serving_fakes.EngineStore``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import logging
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import serving_fakes
import torch
from kserve import InferRequest
from kserve.errors import ModelNotReady
from kserve.protocol.infer_type import InferInput

from cascade.config import Settings
from cascade.lake import Lake
from jobs import ctr_cross_stats as engine
from serving.feedback import FeedbackLog
from serving.feedback_read import load_joined_feedback
from serving.item_table import lake_item_catalogue
from serving.monitor import MonitorConfig, evaluate_day
from serving.preranking import PreRankingModel, ServingConfig, default_backends
from serving.shadow import ObserverConfig, ServingObserver

SOURCE = serving_fakes.SOURCE
RUN = "run-7"
USER_FIELDS = serving_fakes.USER_FIELDS
ITEM_FIELDS = serving_fakes.ITEM_FIELDS
ABSENT_USER = serving_fakes.ABSENT_USER
OUTSIDE = serving_fakes.OUTSIDE
UNKNOWN = serving_fakes.UNKNOWN
ITEM_BATCH = 64
user_value = serving_fakes.user_value
item_value = serving_fakes.item_value
engine_rows = serving_fakes.engine_rows
engine_loaded = serving_fakes.engine_loaded


def serve(
    tmp_path: Path,
    loaded: serving_fakes.FakeLoaded,
    *,
    sources: dict[str, str],
    catalogue: pd.DataFrame | None = None,
) -> tuple[PreRankingModel, serving_fakes.EngineStore]:
    store = serving_fakes.EngineStore()
    backends = serving_fakes.backends(
        tmp_path / "champion.json", store, sources=sources, catalogue=catalogue
    )
    backends = dataclasses.replace(
        backends,
        champion_version=lambda settings, alias: loaded.version,
        load_champion=lambda settings, alias: loaded,
    )
    model = PreRankingModel(
        settings=Settings(home=tmp_path / "home"),
        config=ServingConfig(poll_s=60, max_candidates=1_000, item_batch=ITEM_BATCH),
        backends=backends,
    )
    model.observer = None
    return model, store


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


def test_an_engine_version_reads_its_item_fields_once_and_the_others_per_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loaded = engine_loaded()
    model, store = serve(tmp_path, loaded, sources={RUN: SOURCE})
    with caplog.at_level(logging.INFO, logger="serving.preranking"):
        assert model.load()
    served = model._served
    assert served is not None
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


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("mlp", r"model version 4 \(run run-4\) is a PreRanker; the server serves only"),
        (
            "movielens",
            r"model version 4 \(run run-4\) reads the MovieLens-shaped fields \['user_ctr', "
            r"'item_ctr', 'ug_ctr'\]",
        ),
        ("unsourced", r"model version 4: its run run-4 names no cross-statistics source"),
    ],
)
def test_a_version_that_is_not_the_engines_is_refused_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str, message: str
) -> None:
    """A dense PreRanker, a ColdPreRanker reading the MovieLens-shaped fields, a version whose
    run names no cross source: refused, with the version and what to do in the log, not
    served, and nothing of it read from the online store or the catalogue."""
    store = serving_fakes.EngineStore()
    catalogue_reads: list[str] = []

    def catalogue(settings: Settings, source: str) -> pd.DataFrame:
        catalogue_reads.append(source)
        return serving_fakes.catalogue_frame()

    backends = serving_fakes.backends(tmp_path / "champion.json", store)
    backends = dataclasses.replace(backends, item_catalogue=catalogue)
    model = PreRankingModel(
        settings=Settings(home=tmp_path / "home"), config=ServingConfig(), backends=backends
    )
    model.observer = None
    serving_fakes.write_champion(tmp_path / "champion.json", "4", seed=4, kind=kind)
    with caplog.at_level(logging.ERROR, logger="serving.preranking"):
        assert model.load() is False
    assert model._served is None and not model.ready
    assert list(model.refused_versions) == ["4"]
    refusal = model.refused_versions["4"]
    assert re.search(message, refusal)
    assert "cascade rollback --model preranking" in refusal and "ctr_preranking" in refusal
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "refusing preranking version 4" in record.getMessage()
    assert "still serving None" in record.getMessage()
    assert store.reads == [] and catalogue_reads == []
    with pytest.raises(ModelNotReady):
        predict(model, 5, [1, 2])


def test_a_refused_shadow_version_is_loaded_once_and_never_scored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The shadow alias on a version the server cannot serve (a dense PreRanker): no shadow
    score, one load and one logged refusal however many requests follow, the refusal kept
    with the model's others, and the champion's responses unchanged."""
    champion, challenger = tmp_path / "champion.json", tmp_path / "challenger.json"
    serving_fakes.write_champion(champion, "1", seed=1)
    serving_fakes.write_champion(challenger, "8", seed=8, kind="mlp")
    base = serving_fakes.backends(champion)
    other = serving_fakes.backends(challenger)
    loads: list[str] = []

    def version(settings: Settings, alias: str) -> str | None:
        return (other if alias == "challenger" else base).champion_version(settings, alias)

    def load(settings: Settings, alias: str) -> Any:
        loaded = (other if alias == "challenger" else base).load_champion(settings, alias)
        loads.append(f"{alias}:{loaded.version}")
        return loaded

    backends = dataclasses.replace(base, champion_version=version, load_champion=load)
    model = PreRankingModel(
        settings=Settings(home=tmp_path / "home"), config=ServingConfig(), backends=backends
    )
    model.observer = None
    model.load()
    observer = ServingObserver(model, ObserverConfig(shadow_alias="challenger"))
    items = np.array([1, 5, 9], dtype=np.int64)
    with caplog.at_level(logging.ERROR, logger="serving.shadow"):
        assert observer._shadow_scores(5, items) is None
        assert observer._shadow_scores(6, items) is None
    assert loads == ["champion:1", "challenger:8"]
    assert list(model.refused_versions) == ["8"]
    assert "is a PreRanker" in model.refused_versions["8"]
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "not scoring in shadow with alias challenger" in record.getMessage()
    assert model.served_version == "1"


def test_an_engine_version_without_a_published_catalogue_is_not_served(tmp_path: Path) -> None:
    model, _ = serve(tmp_path, engine_loaded(), sources={RUN: SOURCE})
    model.backends = dataclasses.replace(
        model.backends, item_catalogue=lambda settings, source: None
    )
    with pytest.raises(FileNotFoundError, match="no published item catalogue of 'generated'"):
        model.load()
    assert model._served is None and not model.ready


def test_feedback_of_an_engine_version_records_the_fields_it_read(tmp_path: Path) -> None:
    """The feedback rows hold the version's user fields and item columns as scored (no
    MovieLens-shaped column), and the monitor takes a day without those features without
    failing."""
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
    assert not {*ITEM_FIELDS, *USER_FIELDS, "genre", "item_snapshot"} & set(raw.columns)
    (request,) = pd.read_parquet(lake / "feedback_requests").to_dict("records")
    assert request["candidates"] == 3 and request["user_id"] == 5
    assert len(request["item_snapshot"]) == 64
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
    # A day whose logs carry a MovieLens-shaped column without numbers: no PSI for it, no
    # failure.
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


def test_a_client_cannot_steer_the_logged_features_or_the_click_join(tmp_path: Path) -> None:
    """A request that sends a user field's value other than the store's is scored with it, but
    the feedback log keeps the store's value and the override is counted; a value equal to the
    store's counts as none. The request id clicks join on is the server's own (returned as the
    ``request_id`` parameter, a new one per request); the client's id is echoed and kept only
    as ``client_request_id``."""
    model, _ = serve(tmp_path, engine_loaded(), sources={RUN: SOURCE})
    assert model.load()
    day = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC).timestamp()
    feedback = FeedbackLog(tmp_path / "lake", clock=lambda: day)
    model.observer = ServingObserver(model, ObserverConfig(feedback=True), feedback=feedback)
    steered, kept = USER_FIELDS
    sent = {steered: user_value(steered, 5) + 0.3, kept: user_value(kept, 5)}

    def send(fields: dict[str, float]) -> Any:
        inputs = [
            InferInput(name="user_id", shape=[1], datatype="INT64", data=[5]),
            InferInput(name="item_ids", shape=[2], datatype="INT64", data=[1, 2]),
            *(InferInput(name=n, shape=[1], datatype="FP64", data=[v]) for n, v in fields.items()),
        ]
        request = InferRequest(model_name="preranking", infer_inputs=inputs, request_id="victim")
        return asyncio.run(model.predict(request))

    try:
        honest = send({})
        overriding = send(sent)
        matching = send({kept: sent[kept]})
        model.observer.drain()
    finally:
        model.observer.close()
    scores = [np.asarray(r.outputs[0].data) for r in (honest, overriding, matching)]
    assert not np.allclose(scores[0], scores[1])  # the override was scored with ...
    np.testing.assert_allclose(scores[0], scores[2])
    assert model.feature_overrides == 1  # ... and counted once: the matching value is none
    requests = pd.read_parquet(tmp_path / "lake" / "feedback_requests")
    for name in USER_FIELDS:  # ... but every request row holds the store's values
        assert requests[name].tolist() == [user_value(name, 5)] * 3
    ids = [r.parameters["request_id"] for r in (honest, overriding, matching)]
    assert all(re.fullmatch("[0-9a-f]{32}", i) for i in ids) and len(set(ids)) == 3
    assert {r.id for r in (honest, overriding, matching)} == {"victim"}  # echoed, no more
    assert requests["request_id"].tolist() == ids
    raw = pd.concat(pd.read_parquet(p) for p in (tmp_path / "lake" / "feedback").rglob("*.parquet"))
    assert raw["request_id"].tolist() == [i for i in ids for _ in range(2)]
    assert set(requests["client_request_id"]) == {"victim"}


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
    """The train step logs ``cross_source``; a run without it names no source."""
    import mlflow

    from models.preranking.inference import CROSS_SOURCE_PARAM, run_cross_source

    settings = Settings(home=tmp_path, mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    experiment = client.create_experiment("preranking")
    engine_run = client.create_run(experiment).info.run_id
    client.log_param(engine_run, CROSS_SOURCE_PARAM, SOURCE)
    other_run = client.create_run(experiment).info.run_id
    client.log_param(other_run, "epochs", "2")
    assert CROSS_SOURCE_PARAM == "cross_source"
    assert run_cross_source(settings, engine_run) == SOURCE
    assert run_cross_source(settings, other_run) is None
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
