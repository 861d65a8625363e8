"""Unit tests of the pre-ranking KServe model, in process, with fake registry and store: the
versions served are the cross-statistics engine's (``serving_fakes``)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import serving_fakes
import torch
from kserve import InferRequest
from kserve.errors import InvalidInput, ModelNotReady
from kserve.protocol.infer_type import InferInput
from serving_fakes import CATALOG, CROSS_FIELD, ENGINE_FIELDS, EngineStore

from cascade.config import Settings
from domains.ctr.schema import ITEM_GENRE
from serving.cold_scorer import CompiledColdScorer
from serving.item_table import ItemTable
from serving.preranking import PreRankingModel, ServingConfig
from serving.preranking_inputs import parse_request
from serving.served_version import ServedVersion
from serving.v2_codec import MalformedRequest, decode_v2_json


def request(*inputs: InferInput, request_id: str | None = None) -> InferRequest:
    return InferRequest(model_name="preranking", infer_inputs=list(inputs), request_id=request_id)


def user(
    value: object = 7, *, datatype: str = "INT64", shape: list[int] | None = None
) -> InferInput:
    return InferInput(name="user_id", shape=shape or [1], datatype=datatype, data=[value])


def items(
    data: Sequence[object], *, datatype: str = "INT64", shape: list[int] | None = None
) -> InferInput:
    return InferInput(
        name="item_ids",
        shape=[len(data)] if shape is None else shape,
        datatype=datatype,
        data=list(data),
    )


# Request parsing --------------------------------------------------------------------------------


def test_parse_request_returns_user_and_item_ids() -> None:
    user_id, item_ids = parse_request(request(user(7), items([3, 1, 2**40])), max_candidates=10)
    assert user_id == 7
    assert item_ids.dtype == np.int64
    assert item_ids.tolist() == [3, 1, 2**40]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ((items([1]),), "missing input 'user_id'"),
        ((user(),), "missing input 'item_ids'"),
        ((user(), items([1]), InferInput("extra", [1], "INT64", [1])), "unknown inputs ['extra']"),
        ((user(), items([1]), items([2])), "'item_ids' is given twice"),
        ((user(), items([1], datatype="FP32")), "datatype FP32"),
        ((user(datatype="INT32"), items([1])), "datatype INT32"),
        ((user(), items([1, 2], shape=[1, 2])), "one-dimensional"),
        ((user(shape=[2]), items([1])), "must be [1]"),
        ((user(), items([])), "'item_ids' is empty"),
        ((user(), items(list(range(11)))), "at most 10"),
        ((user(), items([1, 2.5])), "holds 2.5; ids must be integers"),
        ((user(), items([1, True])), "holds True"),
        ((user("12"), items([1])), "'user_id' holds '12'"),
        ((user(), items([1, 2], shape=[3])), "declares shape [3] but carries 2"),
        ((user(), items([2**63])), "outside the INT64 range"),
    ],
)
def test_parse_request_rejects_malformed_input(
    inputs: tuple[InferInput, ...], message: str
) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_request(request(*inputs), max_candidates=10)
    assert message in str(info.value)


def test_serving_config_reads_and_validates_environment() -> None:
    config = ServingConfig.from_env(
        {"CASCADE_SERVING_POLL_S": "0.5", "CASCADE_SERVING_MAX_CANDIDATES": "9"}
    )
    assert (config.poll_s, config.max_candidates) == (0.5, 9)
    with pytest.raises(ValueError, match="CASCADE_SERVING_POLL_S"):
        ServingConfig.from_env({"CASCADE_SERVING_POLL_S": "0"})
    with pytest.raises(ValueError, match="CASCADE_SERVING_MAX_CANDIDATES"):
        ServingConfig.from_env({"CASCADE_SERVING_MAX_CANDIDATES": "many"})


# Item table -------------------------------------------------------------------------------------


def catalogue_table(item_ids: Sequence[int], unknown_genre: Sequence[int] = ()) -> ItemTable:
    """The item table of a catalogue of ``item_ids`` (the genre of ``unknown_genre`` unset)."""
    frame = serving_fakes.catalogue_frame(item_ids).set_index("item_id")
    frame = frame.rename(columns={"item_category": ITEM_GENRE})
    frame.loc[list(unknown_genre), ITEM_GENRE] = None
    return ItemTable.from_frame(frame)


def test_item_table_gives_unknown_items_no_row_no_genre_and_unknown_fields() -> None:
    table = catalogue_table([1, 2, 500], unknown_genre=[500])
    table = table.with_columns({"item_dctr_7d": np.array([0.25, np.nan, 0.5])})
    rows = table.rows(np.array([2, 123456, 1, 500]))
    assert rows.tolist()[1] == -1  # 123456: not in the table
    codes = table.codes(rows)
    assert table.genres[codes[0]] == serving_fakes.genre_of(2)
    assert table.genres[codes[2]] == serving_fakes.genre_of(1)
    assert codes[1] == -1 and codes[3] == -1  # 500: in the catalogue without a category
    column = table.feature_column("item_dctr_7d")
    np.testing.assert_array_equal(column[rows[[0, 2, 3]]], [np.nan, 0.25, 0.5])
    with pytest.raises(ValueError, match="already holds columns"):
        table.with_columns({"item_dctr_7d": np.zeros(3)})


def test_item_table_rows_are_the_same_for_dense_and_sparse_ids() -> None:
    """Dense ids take the flat-array path, huge ids the hash-index path: same answers."""
    frame = serving_fakes.catalogue_frame([1, 2, 3, 50]).set_index("item_id")
    frame = frame.rename(columns={"item_category": ITEM_GENRE})
    sparse = frame.set_axis(frame.index * 10**12, axis=0)
    queries = np.array([3, -1, 2, 10**7, 50, 1, 4])
    dense_table, sparse_table = ItemTable.from_frame(frame), ItemTable.from_frame(sparse)
    assert dense_table._row_of_id is not None and sparse_table._row_of_id is None
    got = dense_table.rows(queries)
    want = sparse_table.rows(np.where(queries > 0, queries * 10**12, queries))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(dense_table.codes(got), sparse_table.codes(want))
    assert (got[[1, 3, 6]] == -1).all() and (got[[0, 2, 4, 5]] >= 0).all()
    assert ItemTable.from_frame(frame.iloc[:0]).rows(np.array([1])).tolist() == [-1]


def test_item_table_names_missing_columns() -> None:
    frame = pd.DataFrame({"item_category": ["Drama"]}, index=pd.Index([1], name="item_id"))
    with pytest.raises(ValueError, match=ITEM_GENRE):
        ItemTable.from_frame(frame)


# The model --------------------------------------------------------------------------------------


@pytest.fixture
def champion_file(tmp_path: Path) -> Path:
    return tmp_path / "champion.json"


@pytest.fixture
def store() -> EngineStore:
    return EngineStore()


@pytest.fixture
def model(tmp_path: Path, champion_file: Path, store: EngineStore) -> PreRankingModel:
    return PreRankingModel(
        settings=Settings(home=tmp_path / "home"),
        config=ServingConfig(poll_s=0.05, max_candidates=100),
        backends=serving_fakes.backends(champion_file, store),
    )


def infer(model: PreRankingModel, user_id: int, item_ids: list[int], request_id: str | None = None):
    return asyncio.run(
        model.predict(request(user(user_id), items(item_ids), request_id=request_id))
    )


def full_network(
    served: ServedVersion, user_id: int, candidates: Sequence[int], **columns: Any
) -> np.ndarray:
    """The reference: every candidate's fields as the offline join assembles them (and
    ``columns``' values), encoded, through the whole network."""
    frame = serving_fakes.engine_rows([user_id], candidates)
    for name, values in columns.items():
        frame[name] = values
    assert served.encoder is not None
    with torch.no_grad():
        return torch.sigmoid(served.network(served.encoder.encode(frame))).numpy()


def test_not_ready_until_a_champion_exists(model: PreRankingModel, champion_file: Path) -> None:
    assert model.load() is False
    assert model.ready is False
    with pytest.raises(ModelNotReady):
        infer(model, 1, [1])
    serving_fakes.write_champion(champion_file, "4", seed=4)
    assert model.load() is True
    assert model.served_version == "4"


def test_predict_scores_each_candidate_with_only_the_needed_reads(
    model: PreRankingModel, champion_file: Path, store: EngineStore
) -> None:
    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()
    # The item fields were read once, at load, for the catalogue, in one batch.
    assert store.views() == ["cross_item"]
    assert sorted(key for _, keys in store.reads for (key,) in keys) == list(CATALOG)
    store.reads.clear()
    candidates = [3, 4, 6, 999_999]  # 3, 6: Action; 4: Comedy; 999999: unknown
    response = infer(model, 5, candidates, request_id="req-1")
    scores = response.outputs[0].data
    assert response.id == "req-1"
    server_id = response.parameters.pop("request_id")
    assert server_id != "req-1" and len(server_id) == 32
    assert response.parameters == {"model_version": "1", "run_id": "run-1"}
    assert response.outputs[0].name == "scores" and response.outputs[0].datatype == "FP32"
    assert scores.shape == (4,) and scores.dtype == np.float32
    assert np.isfinite(scores).all() and ((scores >= 0) & (scores <= 1)).all()
    # Per request only the user's fields and the user x genre fields of the candidates'
    # genres are read, one read each; no item field.
    assert sorted(store.views()) == ["cross_user", "cross_user_cat"]
    assert {view: sorted(keys) for view, keys in store.reads} == {
        "cross_user": [(5,)],
        "cross_user_cat": [(5, "Action"), (5, "Comedy")],
    }
    # A generated id when the request has none.
    assert infer(model, 5, candidates).id


def test_a_version_scores_like_the_full_network_with_the_user_side_once(
    model: PreRankingModel, champion_file: Path
) -> None:
    serving_fakes.write_champion(champion_file, "5", seed=5)
    model.load()
    served = model._served
    assert served is not None and isinstance(served.scorer, CompiledColdScorer)
    assert served.backend == "eager"  # no compiled package: the network's request call
    # The item side: encoded once, at load, for every catalogue item (and a row for none).
    assert served.scorer.item_codes.shape == (len(CATALOG) + 1, len(served.encoder.fields))
    calls: list[int] = []
    served.network.user_linear.register_forward_hook(lambda m, i, o: calls.append(len(i[0])))
    candidates = [3, 4, 6, 150, 999_999]  # 999999: not in the catalogue
    for user_id in (5, serving_fakes.ABSENT_USER, 10**6):  # the last two: no statistics
        calls.clear()
        got = infer(model, user_id, candidates).outputs[0].data
        assert calls == [1]  # the user side ran once for the five candidates
        np.testing.assert_allclose(got, full_network(served, user_id, candidates), atol=1e-5)
        assert np.ptp(got) > 1e-3  # the scores depend on the candidate


def test_a_version_with_an_extra_field_needs_it_in_every_request(
    model: PreRankingModel, champion_file: Path
) -> None:
    """A field of the model's field set that no store serves (a cross statistic) comes with the
    request: without it the answer is a 400 naming it; with it the scores are the network's."""
    serving_fakes.write_champion(champion_file, "6", seed=6, kind="engine_cross")
    model.load()
    served = model._served
    cross = CROSS_FIELD
    assert served is not None and set(served.request_fields) == {*ENGINE_FIELDS, cross}
    assert served.required_fields == {cross: "cross"}
    assert {"name": cross, "datatype": "FP32", "shape": [-1]} in model.get_input_types()
    candidates = [3, 4, 150, 999_999]
    with pytest.raises(InvalidInput, match=rf"missing inputs \['{cross}'\]"):
        infer(model, 5, candidates)
    with pytest.raises(InvalidInput, match=rf"missing inputs \['{cross}'\]"):
        asyncio.run(model.infer_json(
            b'{"inputs": [{"name": "user_id", "datatype": "INT64", "shape": [1], "data": [5]},'
            b'{"name": "item_ids", "datatype": "INT64", "shape": [1], "data": [3]}]}'
        ))  # fmt: skip
    values = [serving_fakes.cross_value(5, i) for i in candidates[:-1]] + [None]
    column = InferInput(name=cross, shape=[3], datatype="FP32", data=values[:3])
    with pytest.raises(InvalidInput, match=rf"'{cross}' has shape \[3\]; it must be \[4\]"):
        asyncio.run(model.predict(request(user(5), items(candidates), column)))
    column = InferInput(name=cross, shape=[4], datatype="FP32", data=values)
    got = asyncio.run(model.predict(request(user(5), items(candidates), column)))
    got = got.outputs[0].data
    sent = [np.nan if v is None else v for v in values]
    want = full_network(served, 5, candidates, **{cross: sent})
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    unknown = InferInput(name=cross, shape=[4], datatype="FP32", data=[None] * 4)
    blind = asyncio.run(model.predict(request(user(5), items(candidates), unknown)))
    assert not np.allclose(blind.outputs[0].data[:3], got[:3])  # the values are read


@pytest.fixture(scope="module")
def cold_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The AOTInductor package of ``engine_network(5)`` (the compile step's artifact)."""
    from compilers.preranking import compile_cold_preranking

    cold, _ = serving_fakes.engine_network(5)
    out = tmp_path_factory.mktemp("compiled") / "preranking.pt2"
    return compile_cold_preranking(cold.eval(), out, fast_build=True).path


@pytest.mark.slow
def test_a_version_is_scored_by_its_compiled_package(
    model: PreRankingModel,
    champion_file: Path,
    cold_package: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    candidates = [3, 4, 6, 150, 999_999, 7, 7]  # 999999: unknown; 7 twice
    serving_fakes.write_champion(champion_file, "5", seed=5)
    model.load()
    assert model._served is not None and model._served.backend == "eager"
    eager = infer(model, 5, candidates).outputs[0].data
    unknown_user = infer(model, 424242, candidates).outputs[0].data

    serving_fakes.write_champion(champion_file, "6", seed=5, compiled=cold_package)
    assert model.refresh() is True
    served = model._served
    assert served is not None and served.backend == "compiled"
    assert isinstance(served.scorer, CompiledColdScorer)
    calls: list[int] = []
    served.network.user_linear.register_forward_hook(lambda m, i, o: calls.append(1))
    np.testing.assert_allclose(infer(model, 5, candidates).outputs[0].data, eager, atol=1e-5)
    np.testing.assert_allclose(
        infer(model, 424242, candidates).outputs[0].data, unknown_user, atol=1e-5
    )
    assert calls == []  # the eager network did not run

    # A package that does not load (another torch build, a broken file): the version is served
    # eagerly and the log says why.
    broken = tmp_path / "broken.pt2"
    broken.write_bytes(b"not a package")
    serving_fakes.write_champion(champion_file, "7", seed=5, compiled=broken)
    with caplog.at_level("WARNING", logger="serving.served_version"):
        assert model.refresh() is True
    assert model._served is not None and model._served.backend == "eager"
    assert "broken.pt2 not used" in caplog.text
    np.testing.assert_allclose(infer(model, 5, candidates).outputs[0].data, eager, atol=1e-6)


@pytest.mark.slow
def test_a_package_of_another_model_or_switched_off_is_not_used(
    champion_file: Path, cold_package: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def served_backend(config: ServingConfig, seed: int) -> str:
        model = PreRankingModel(
            settings=Settings(home=tmp_path / "home"),
            config=config,
            backends=serving_fakes.backends(champion_file),
        )
        serving_fakes.write_champion(champion_file, "1", seed=seed, compiled=cold_package)
        model.load()
        assert model._served is not None
        return model._served.backend

    # The package was built from seed 5's weights: seed 6's network differs, parity fails.
    with caplog.at_level("WARNING", logger="serving.served_version"):
        assert served_backend(ServingConfig(), seed=6) == "eager"
    assert "differ from the network's" in caplog.text
    off = ServingConfig.from_env({"CASCADE_SERVING_COMPILED": "0"})
    assert served_backend(off, seed=5) == "eager"
    assert served_backend(ServingConfig(), seed=5) == "compiled"
    with pytest.raises(ValueError, match="CASCADE_SERVING_COMPILED"):
        ServingConfig.from_env({"CASCADE_SERVING_COMPILED": "yes"})


def test_hot_swap_between_field_sets(model: PreRankingModel, champion_file: Path) -> None:
    """A version with a field no store serves replaces one without: its inputs change with it,
    and swapping back needs none again."""
    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()
    plain = infer(model, 9, [1, 2, 3])
    assert CROSS_FIELD not in {t["name"] for t in model.get_input_types()}
    serving_fakes.write_champion(champion_file, "2", seed=2, kind="engine_cross")
    assert model.refresh() is True
    assert CROSS_FIELD in {t["name"] for t in model.get_input_types()}
    with pytest.raises(InvalidInput, match=CROSS_FIELD):
        infer(model, 9, [1, 2, 3])
    column = InferInput(name=CROSS_FIELD, shape=[3], datatype="FP32", data=[0.1, 0.2, 0.3])
    crossed = asyncio.run(model.predict(request(user(9), items([1, 2, 3]), column)))
    assert (plain.model_version, crossed.model_version) == ("1", "2")
    assert not np.allclose(plain.outputs[0].data, crossed.outputs[0].data)
    serving_fakes.write_champion(champion_file, "3", seed=1)
    assert model.refresh() is True
    np.testing.assert_allclose(infer(model, 9, [1, 2, 3]).outputs[0].data, plain.outputs[0].data)


def test_a_version_without_its_encoder_or_not_a_cold_preranker_is_refused() -> None:
    table = catalogue_table([1, 2])
    cold, _ = serving_fakes.engine_network(1)
    with pytest.raises(ValueError, match="without its field encoder"):
        ServedVersion(network=cold, version="3", run_id="r", items=table)
    dense = serving_fakes.dense_network(1)
    with pytest.raises(ValueError, match="version 4 is a PreRanker; only a ColdPreRanker"):
        ServedVersion(network=dense, version="4", run_id="r", items=table)  # type: ignore[arg-type]


def test_swap_changes_version_and_scores(model: PreRankingModel, champion_file: Path) -> None:
    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()
    before = infer(model, 9, [1, 2, 3])
    assert model.refresh() is False  # same version: nothing reloads
    serving_fakes.write_champion(champion_file, "2", seed=2)
    assert model.refresh() is True
    after = infer(model, 9, [1, 2, 3])
    assert (before.model_version, after.model_version) == ("1", "2")
    assert not np.allclose(before.outputs[0].data, after.outputs[0].data)


def test_request_in_flight_finishes_on_the_old_version(
    model: PreRankingModel, champion_file: Path
) -> None:
    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()
    assert model._served is not None
    old_scorer = model._served.scorer
    old_logits = old_scorer.logits
    entered, release = threading.Event(), threading.Event()

    def blocking(*args: Any, **kwargs: Any) -> torch.Tensor:
        entered.set()
        assert release.wait(5)
        return old_logits(*args, **kwargs)

    old_scorer.logits = blocking  # type: ignore[method-assign]
    result: dict[str, object] = {}
    worker = threading.Thread(target=lambda: result.update(r=infer(model, 2, [1, 2])))
    worker.start()
    assert entered.wait(5)
    serving_fakes.write_champion(champion_file, "2", seed=2)
    assert model.refresh() is True  # swapped while the request is inside the old version
    release.set()
    worker.join(5)
    assert result["r"].model_version == "1"  # type: ignore[attr-defined]
    assert infer(model, 2, [1, 2]).model_version == "2"


def test_failed_load_keeps_serving_the_old_version(
    model: PreRankingModel, champion_file: Path
) -> None:
    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()

    def broken(settings: Settings, alias: str) -> None:
        raise OSError("registry unreachable")

    model.backends.load_champion = broken  # type: ignore[assignment]
    serving_fakes.write_champion(champion_file, "2", seed=2)
    with pytest.raises(OSError):
        model.refresh()
    assert model.served_version == "1"
    assert infer(model, 1, [1]).model_version == "1"


@pytest.mark.parametrize("kind", ["mlp", "movielens", "unsourced"])
def test_a_refused_version_keeps_the_old_one_served_and_is_not_loaded_again(
    model: PreRankingModel, champion_file: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """The poller meets a version the server cannot serve: it logs the refusal once, keeps
    serving the version it had, does not load the refused one again on later ticks, and
    serves the next version the alias moves to."""
    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()
    served = infer(model, 5, [1, 2, 3]).outputs[0].data
    loads: list[str] = []
    load = model.backends.load_champion

    def counted(settings: Settings, alias: str) -> Any:
        loaded = load(settings, alias)
        loads.append(loaded.version)
        return loaded

    model.backends.load_champion = counted  # type: ignore[assignment]
    serving_fakes.write_champion(champion_file, "2", seed=2, kind=kind)
    with caplog.at_level(logging.INFO, logger="serving.preranking"):
        model.start()
        try:
            deadline = time.monotonic() + 5
            while "2" not in model.refused_versions and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(10 * model.config.poll_s)  # ten more ticks on the refused version
            assert model.served_version == "1" and model.ready
            again = infer(model, 5, [1, 2, 3])
            assert again.model_version == "1"
            np.testing.assert_array_equal(again.outputs[0].data, served)
            serving_fakes.write_champion(champion_file, "3", seed=3)
            deadline = time.monotonic() + 5
            while model.served_version != "3" and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            model.stop()
    assert loads == ["2", "3"]  # the refused version was loaded once
    assert model.served_version == "3"
    refusals = [r for r in caplog.records if r.getMessage().startswith("refusing preranking")]
    assert len(refusals) == 1 and refusals[0].levelno == logging.ERROR
    assert "version 2" in refusals[0].getMessage()
    assert "still serving 1" in refusals[0].getMessage()
    assert "champion refresh failed" not in caplog.text


def test_a_champion_refused_for_its_files_is_fetched_again_only_when_it_changes(
    model: PreRankingModel, champion_file: Path
) -> None:
    """A champion whose files are not the signed ones is fetched and hashed once, not on every
    tick: again only when its registry record changes (an operator signed it anew) or when
    the alias moves away and back."""
    from cascade.artifacts import TamperedArtifact

    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()
    records = {"2": "signed-a"}
    fetched: list[str] = []
    load = model.backends.load_champion

    def fetch(settings: Settings, alias: str) -> Any:
        loaded = load(settings, alias)
        fetched.append(loaded.version)
        if loaded.version == "2":
            raise TamperedArtifact("preranking v2: model.pt is not the signed file")
        return loaded

    model.backends.load_champion = fetch  # type: ignore[assignment]
    model.backends.version_record = lambda settings, version: records.get(version)
    serving_fakes.write_champion(champion_file, "2", seed=2)
    for _ in range(5):
        assert model.refresh() is False
    assert fetched == ["2"] and "not the signed file" in model.refused_versions["2"]
    records["2"] = "signed-b"  # a new release of the same version: checked once more
    time.sleep(model.config.poll_s)  # (its record is read at most once a poll interval)
    for _ in range(3):
        model.refresh()
    assert fetched == ["2", "2"]
    serving_fakes.write_champion(champion_file, "3", seed=3)  # the alias moves on ...
    assert model.refresh() is True and model.served_version == "3"
    serving_fakes.write_champion(champion_file, "2", seed=2)  # ... and back: judged afresh
    model.refresh()
    model.refresh()
    assert fetched == ["2", "2", "3", "2"] and model.served_version == "3"


def test_poller_makes_the_model_ready_when_a_champion_appears(
    model: PreRankingModel, champion_file: Path
) -> None:
    model.start()
    try:
        time.sleep(0.2)
        assert model.ready is False
        serving_fakes.write_champion(champion_file, "3", seed=3)
        deadline = time.monotonic() + 5
        while not model.ready and time.monotonic() < deadline:
            time.sleep(0.02)
        assert model.served_version == "3"
    finally:
        model.stop()
    assert model.ready is False


def test_poller_survives_registry_errors(model: PreRankingModel, champion_file: Path) -> None:
    real = model.backends.champion_version
    failures = {"left": 3}

    def flaky(settings: Settings, alias: str) -> str | None:
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("registry down")
        return real(settings, alias)

    model.backends.champion_version = flaky  # type: ignore[assignment]
    serving_fakes.write_champion(champion_file, "5", seed=5)
    model.start()
    try:
        deadline = time.monotonic() + 5
        while not model.ready and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        model.stop()
    assert failures["left"] == 0
    assert model.served_version == "5"


# The JSON route's codec ------------------------------------------------------------------------


def test_decode_v2_json_builds_the_request_parse_request_reads() -> None:
    body = (
        b'{"id": "r9", "inputs": ['
        b'{"name": "user_id", "datatype": "INT64", "shape": [1], "data": [5]},'
        b'{"name": "item_ids", "datatype": "INT64", "shape": [3], "data": [7, 9, 11]}]}'
    )
    decoded = decode_v2_json(body, "preranking")
    assert decoded.id == "r9"
    user_id, item_ids = parse_request(decoded, max_candidates=10)
    assert user_id == 5 and item_ids.tolist() == [7, 9, 11]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[1]", "JSON list"),
        (b'{"inputs": 5}', "'inputs' must be a list"),
        (b'{"id": 3, "inputs": []}', "'id' must be a string"),
        (b'{"inputs": [7]}', r"inputs\[0\] must be an object"),
        (b'{"inputs": [{"name": "user_id", "shape": [1], "data": [1]}]}', "'datatype'"),
        (
            b'{"inputs": [{"name": "u", "datatype": "INT64", "shape": "1", "data": [1]}]}',
            "list of integers",
        ),
        (b'{"inputs": [{"name": "u", "datatype": "INT64", "shape": [1], "data": 1}]}', "'data'"),
    ],
)
def test_decode_v2_json_names_what_is_malformed(body: bytes, message: str) -> None:
    with pytest.raises(MalformedRequest, match=message):
        decode_v2_json(body, "preranking")


def test_encode_v2_json_matches_kserve_to_rest(model: PreRankingModel, champion_file: Path) -> None:
    import orjson

    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()
    body = orjson.dumps(
        {
            "id": "abc",
            "inputs": [
                {"name": "user_id", "datatype": "INT64", "shape": [1], "data": [5]},
                {"name": "item_ids", "datatype": "INT64", "shape": [3], "data": [3, 4, 999]},
            ],
        }
    )
    ours = orjson.loads(asyncio.run(model.infer_json(body)))
    reference, _ = infer(model, 5, [3, 4, 999], request_id="abc").to_rest()
    assert ours["id"] == reference["id"] == "abc"
    # Each answer names the server's own id of its request (a new one per request).
    ours_id, reference_id = (
        ours["parameters"].pop("request_id"),
        reference["parameters"].pop("request_id"),
    )
    assert len({ours_id, reference_id, "abc"}) == 3
    assert (
        ours["parameters"] == reference["parameters"] == {"model_version": "1", "run_id": "run-1"}
    )
    assert ours["model_version"] == reference["model_version"]
    (out,), (ref,) = ours["outputs"], reference["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == (ref["name"], ref["datatype"], [3])
    np.testing.assert_allclose(out["data"], ref["data"], rtol=1e-6)
    with pytest.raises(InvalidInput, match="ids must be integers"):
        asyncio.run(model.infer_json(body.replace(b"[3,4,999]", b"[3,4,true]")))


def test_served_version_encodes_the_item_side_once_and_scores_as_the_full_network(
    model: PreRankingModel, champion_file: Path
) -> None:
    """Every catalogue item's codes are built when the version loads; a request gathers them:
    the whole catalogue and unknown items score as the network on the assembled rows, for
    users with and without statistics."""
    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()
    served = model._served
    assert served is not None
    candidates = np.array([*CATALOG, 424_242, 999_999, 0])  # last 3 unknown
    for user_id in (1, 5, 11, serving_fakes.ABSENT_USER, -3):  # the last two: NaN fields
        split = model.score_request(served, user_id, candidates)
        whole = full_network(served, user_id, candidates.tolist())
        np.testing.assert_allclose(split.scores, whole, rtol=1e-5, atol=1e-6)
        assert split.rows.tolist()[-3:] == [-1, -1, -1]
        expected_user = {
            name: serving_fakes.user_value(name, user_id) for name in serving_fakes.USER_FIELDS
        }
        np.testing.assert_equal(dict(split.user), expected_user)  # as read, NaN when unknown


@pytest.mark.parametrize(
    "body",
    [
        b'{"id": "a", "inputs": [{"name": "user_id", "datatype": "INT64", "shape": [1], '
        b'"data": [5]}, {"name": "item_ids", "datatype": "INT64", "shape": [3], '
        b'"data": [3, 4, 999]}]}',
        b"{not json",
        b'{"inputs": []}',
        b'{"inputs": [{"name": "user_id", "datatype": "INT64", "shape": [1], "data": [1]},'
        b'{"name": "item_ids", "datatype": "INT64", "shape": [2], "data": [1.5, 2]}]}',
        b'{"inputs": [{"name": "user_id", "datatype": "INT64", "shape": [1], "data": [1]},'
        b'{"name": "item_ids", "datatype": "INT64", "shape": [101], "data": [1]}]}',
        b'{"inputs": [{"name": "user_id", "datatype": "FP32", "shape": [1], "data": [1]},'
        b'{"name": "item_ids", "datatype": "INT64", "shape": [1], "data": [1]},'
        b'{"name": "extra", "datatype": "INT64", "shape": [1], "data": [1]}]}',
    ],
    ids=["good", "not-json", "no-inputs", "float-ids", "too-many", "extra-input"],
)
def test_infer_json_answers_as_predict_on_the_decoded_request(
    model: PreRankingModel, champion_file: Path, body: bytes
) -> None:
    """The JSON route skips KServe's request and response objects, not a single check."""
    import orjson

    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()

    def outcome(call: object) -> object:
        try:
            return ("ok", asyncio.run(call))  # type: ignore[arg-type]
        except Exception as exc:
            return (type(exc), str(exc))

    fast = outcome(model.infer_json(body))
    try:
        request = decode_v2_json(body, "preranking")
    except MalformedRequest as exc:
        assert fast == (MalformedRequest, str(exc))
        return
    slow = outcome(model.predict(request))
    if slow[0] != "ok":
        assert fast == slow
        return
    assert fast[0] == "ok"
    ours = orjson.loads(fast[1])  # type: ignore[index]
    reference, _ = slow[1].to_rest()  # type: ignore[index,union-attr]
    # The server's own request id: a new one per request, on either route.
    assert ours["parameters"].pop("request_id") != reference["parameters"].pop("request_id")
    assert {k: v for k, v in ours.items() if k != "outputs"} == {
        k: v for k, v in reference.items() if k != "outputs"
    }
    np.testing.assert_allclose(ours["outputs"][0]["data"], reference["outputs"][0]["data"])


def test_not_ready_is_answered_before_the_ids_are_checked(model: PreRankingModel) -> None:
    body = (
        b'{"inputs": [{"name": "user_id", "datatype": "INT64", "shape": [1], "data": [1]},'
        b'{"name": "item_ids", "datatype": "INT64", "shape": [1], "data": [1.5]}]}'
    )
    with pytest.raises(ModelNotReady):
        asyncio.run(model.infer_json(body))


def test_feature_store_lock_timeouts_are_not_model_errors_and_never_roll_back(
    tmp_path: Path, champion_file: Path, store: EngineStore
) -> None:
    """A materialization holding SQLite's write lock makes the online reads fail with
    "database is locked": 503s counted on their own, never toward the automatic rollback; the
    model's own errors still are."""
    import sqlite3

    from prometheus_client import REGISTRY

    from serving.preranking import FeatureStoreBusy
    from serving.shadow import ObserverConfig, ServingObserver

    online = tmp_path / "online.db"
    with sqlite3.connect(online) as setup:
        setup.execute("CREATE TABLE cross_user (user_id INTEGER, value REAL)")
    broken: list[Exception] = []
    read = store.read

    def locked_store_reads(view: str, join_keys: Any, keys: Any, features: Any) -> np.ndarray:
        # A real read of a real SQLite file (short busy timeout) before the fake's answer.
        with sqlite3.connect(online, timeout=0.05) as reader:
            reader.execute("SELECT value FROM cross_user WHERE user_id = ?", (1,))
        if broken:
            raise broken[0]
        return read(view, join_keys, keys, features)

    store.read = locked_store_reads  # type: ignore[method-assign]
    model = PreRankingModel(
        settings=Settings(home=tmp_path / "home"),
        config=ServingConfig(),
        backends=serving_fakes.backends(champion_file, store),
    )
    rollbacks: list[dict[str, object]] = []
    model.observer = ServingObserver(
        model,
        ObserverConfig(auto_rollback=True),
        rollback=lambda **kwargs: rollbacks.append(kwargs),
    )
    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()

    def count(kind: str) -> float:
        labels = {"model_name": "preranking", "kind": kind}
        return REGISTRY.get_sample_value("cascade_inference_errors_total", labels) or 0.0

    timeouts_before, model_errors_before = count("feature_store_timeout"), count("model")
    writer = sqlite3.connect(online, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")  # what a materialization's write holds
    try:
        for _ in range(30):
            with pytest.raises(FeatureStoreBusy) as busy:
                infer(model, 5, [3, 4])
            assert isinstance(busy.value, ModelNotReady)  # answered 503 by both routes
            assert "database is locked" in str(busy.value.__cause__)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    model.observer.drain()
    assert model.observer.feature_store_timeouts == {"1": 30}
    assert model.observer.errors == {} and model.observer.requests == {} and rollbacks == []
    assert model.feature_store_timeouts == 30
    assert count("feature_store_timeout") == timeouts_before + 30
    assert count("model") == model_errors_before

    assert infer(model, 5, [3, 4]).outputs[0].data.shape == (2,)  # the lock is gone
    broken.append(RuntimeError("the model's own failure"))
    with pytest.raises(RuntimeError):
        infer(model, 5, [3, 4])
    model.observer.drain()
    assert model.observer.errors == {"1": 1} and count("model") == model_errors_before + 1
    assert [(call["served_version"], call["errors"]) for call in rollbacks] == [("1", 1)]


def test_non_finite_scores_are_a_model_error_naming_the_rollback(
    model: PreRankingModel, champion_file: Path
) -> None:
    """A version whose network answers NaN for some candidate gets a 500 naming the version and
    the rollback, never a NaN score."""
    from kserve.errors import InferenceError

    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()
    served = model._served
    assert served is not None
    logits = served.scorer.logits

    def with_nan(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = logits(*args, **kwargs).clone()
        out[1] = float("nan")
        return out

    served.scorer.logits = with_nan  # type: ignore[method-assign]
    with pytest.raises(InferenceError, match="model version 1 returned 3 scores") as failed:
        infer(model, 5, [1, 2, 3])
    assert "non-finite values for 3 candidates; roll back the champion alias" in str(failed.value)
    served.scorer.logits = logits  # type: ignore[method-assign]
    assert np.isfinite(infer(model, 5, [1, 2, 3]).outputs[0].data).all()


def test_lock_timeouts_are_told_apart_from_other_failures() -> None:
    import sqlite3

    from serving.preranking import is_lock_timeout

    client_timeout = type("TimeoutError", (Exception,), {})  # as redis.exceptions names it

    try:
        try:
            raise sqlite3.OperationalError("database is locked")
        except sqlite3.OperationalError as inner:
            raise RuntimeError("lookup failed") from inner
    except RuntimeError as wrapped:
        assert is_lock_timeout(wrapped)
    assert is_lock_timeout(client_timeout("Timeout reading from socket"))
    assert is_lock_timeout(TimeoutError("timed out"))
    assert not is_lock_timeout(sqlite3.OperationalError("no such table: user_features"))
    assert not is_lock_timeout(ValueError("database is locked"))


# Binary tensors and the request profile ----------------------------------------------------------

BINARY_HEADERS = ((b"content-type", b"application/octet-stream"),)


def _json_and_binary(
    user_id: int, item_ids: list[int], request_id: str
) -> tuple[bytes, bytes, int]:
    """The same request as v2 JSON and in the binary tensor extension (by the project's
    client encoder), asking for the scores as raw bytes."""
    import orjson

    from serving.v2_client import encode_binary_request

    body = {
        "id": request_id,
        "inputs": [
            {"name": "user_id", "datatype": "INT64", "shape": [1], "data": [user_id]},
            {"name": "item_ids", "datatype": "INT64", "shape": [len(item_ids)], "data": item_ids},
        ],
    }
    binary, json_length = encode_binary_request(body)
    return orjson.dumps(body), binary, json_length


def test_binary_requests_score_exactly_as_json_ones(
    model: PreRankingModel, champion_file: Path
) -> None:
    import orjson

    from serving.v2_client import decode_binary_response

    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()
    for user_id, candidates in ((5, [3, 4, 6, 999_999]), (2, list(CATALOG)[:60]), (999, [1])):
        text, binary, json_length = _json_and_binary(user_id, candidates, "r-7")
        plain = asyncio.run(model.infer_v2(text, ()))
        assert plain.json_length is None and plain.timing is None  # JSON in, JSON out
        headers = (*BINARY_HEADERS, (b"inference-header-content-length", b"%d" % json_length))
        answer = asyncio.run(model.infer_v2(binary, headers))
        assert answer.json_length is not None
        header = orjson.loads(answer.body[: answer.json_length])
        (scores,) = header["outputs"]
        assert "data" not in scores and scores["datatype"] == "FP32"
        assert scores["parameters"] == {"binary_data_size": 4 * len(candidates)}
        raw = np.frombuffer(answer.body[answer.json_length :], dtype="<f4")
        from_json = np.asarray(orjson.loads(plain.body)["outputs"][0]["data"], dtype=np.float32)
        np.testing.assert_array_equal(raw, from_json)  # bit for bit
        decoded = decode_binary_response(answer.body, answer.json_length)
        assert decoded["outputs"][0]["data"] == from_json.tolist()
        assert decoded["id"] == "r-7" and decoded["parameters"]["model_version"] == "1"
    # A JSON request may ask for binary scores per output; binary inputs may answer JSON.
    text, binary, json_length = _json_and_binary(5, [3, 4], "r-8")
    asked = orjson.loads(text)
    asked["outputs"] = [{"name": "scores", "parameters": {"binary_data": True}}]
    assert asyncio.run(model.infer_v2(orjson.dumps(asked), ())).json_length is not None


def _binary_body(header: dict[str, Any], *chunks: bytes) -> tuple[bytes, tuple[Any, ...]]:
    import orjson

    encoded = orjson.dumps(header)
    length = (b"inference-header-content-length", b"%d" % len(encoded))
    return encoded + b"".join(chunks), (*BINARY_HEADERS, length)


def _ids_input(name: str, count: int, *, datatype: str = "INT64", size: int | None = None) -> Any:
    return {
        "name": name,
        "datatype": datatype,
        "shape": [count],
        "parameters": {"binary_data_size": 8 * count if size is None else size},
    }


@pytest.mark.parametrize(
    ("case", "error", "message"),
    [
        ("size disagrees with shape", InvalidInput, "shape \\[3\\] of INT64 is 24 bytes"),
        ("bytes missing", InvalidInput, "but 8 bytes follow"),
        ("bytes left over", InvalidInput, "8 bytes follow the declared binary inputs"),
        ("no header length", InvalidInput, "needs the inference-header-content-length header"),
        ("header length past the body", MalformedRequest, "but the body has"),
        ("unknown datatype", InvalidInput, "'BF16', which has no binary form"),
        ("ids as floats", InvalidInput, "send ids as INT64"),
        ("header not JSON", MalformedRequest, "the JSON header is not JSON"),
    ],
)
def test_a_malformed_binary_body_is_a_clear_4xx(
    model: PreRankingModel, champion_file: Path, case: str, error: type, message: str
) -> None:
    serving_fakes.write_champion(champion_file, "1", seed=1)
    model.load()
    one = np.array([5], dtype="<i8").tobytes()
    three = np.array([3, 4, 6], dtype="<i8").tobytes()
    user_in = _ids_input("user_id", 1)
    header = {"inputs": [user_in, _ids_input("item_ids", 3)]}
    body, headers = _binary_body(header, one, three)
    if case == "size disagrees with shape":
        body, headers = _binary_body(
            {"inputs": [user_in, _ids_input("item_ids", 3, size=16)]}, one, three[:16]
        )
    elif case == "bytes missing":
        body = body[:-16]
    elif case == "bytes left over":
        body += one
    elif case == "no header length":
        headers = BINARY_HEADERS
    elif case == "header length past the body":
        headers = (*BINARY_HEADERS, (b"inference-header-content-length", b"%d" % (len(body) + 1)))
    elif case == "unknown datatype":
        bad = {**_ids_input("item_ids", 3), "datatype": "BF16"}
        body, headers = _binary_body({"inputs": [user_in, bad]}, one, three)
    elif case == "ids as floats":
        floats = {**_ids_input("item_ids", 3), "datatype": "FP64"}
        body, headers = _binary_body({"inputs": [user_in, floats]}, one, three)
    elif case == "header not JSON":
        body = b"{not json" + one
        headers = (*BINARY_HEADERS, (b"inference-header-content-length", b"9"))
    with pytest.raises(error, match=message):
        asyncio.run(model.infer_v2(body, headers))


def test_a_profiled_request_times_every_stage_in_its_answer(
    tmp_path: Path, champion_file: Path, store: EngineStore
) -> None:
    from cascade.config import ServingSettings
    from serving.request_profile import STAGES, parse_server_timing

    profiled = PreRankingModel(
        settings=Settings(home=tmp_path / "home", serving=ServingSettings(profile=1)),
        config=ServingConfig(poll_s=0.05, max_candidates=100),
        backends=serving_fakes.backends(champion_file, store),
    )
    serving_fakes.write_champion(champion_file, "1", seed=1)
    profiled.load()
    text, binary, json_length = _json_and_binary(5, [3, 4, 6], "r-9")
    answer = asyncio.run(profiled.infer_v2(text, ()))
    assert answer.timing is not None
    stages = parse_server_timing(answer.timing.decode())
    assert tuple(stages) == STAGES  # each stage once, in the order it ran
    assert all(wall >= 0 and cpu >= 0 for wall, cpu in stages.values())
    assert sum(wall for wall, _ in stages.values()) > 0
    # The same scores as without the profile.
    import orjson

    served = asyncio.run(profiled.infer_v2(text, ()))
    assert orjson.loads(served.body)["outputs"] == orjson.loads(answer.body)["outputs"]
    # Sampled: one request in three is timed, the others answer without the header.
    profiled.profile = 3
    timed = [asyncio.run(profiled.infer_v2(text, ())).timing is not None for _ in range(6)]
    assert timed == [False, False, True, False, False, True]


def test_server_timing_is_read_back_stage_by_stage() -> None:
    from serving.request_profile import StageClock, parse_server_timing

    clock = StageClock()
    clock.lap("parse")
    sum(range(10_000))
    clock.lap("score")
    value = clock.header_value().decode()
    assert value.startswith("parse;dur=") and ", parse-cpu;dur=" in value
    read = parse_server_timing(value + ', other;desc="no duration", score;dur=1.5')
    assert list(read) == ["parse", "score"]
    assert read["score"][0] >= 1.5 and read["score"][1] >= 0
