"""The pre-ranker's fields as data: a FieldSet built from a training frame and declarations,
its costs, fields.json beside the weights, and a model over extra fields saved and reloaded."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from compilers.preranking import ColdPreRankingRequest, cold_preranking_example
from models.preranking.config_registry import CascadeTrainConfig, cascade_debug
from models.preranking.fields import (
    FIELD_NAMES,
    FIELDS,
    FIELDS_FILE,
    FieldEncoder,
    FieldSet,
    field_cost,
)
from models.preranking.fscd_data import prepare
from models.preranking.fscd_phases import PlainTorch, build_network, run_steps, train_phase
from models.preranking.fscd_phases import phases as cascade_phases
from models.preranking.inference import load_cold_dir, save_cold_model, score_frame
from models.preranking.model import ColdPreRanker
from models.preranking.synthetic_data import synthetic_training_frame

CROSS_7D, CROSS_30D = "ctr_user_x_item_genre_7d", "ctr_user_x_item_genre_30d"
DECLARATIONS = {
    CROSS_7D: {"kind": "cross", "categorical": False, "window_days": 7},
    CROSS_30D: {"kind": "cross", "categorical": False, "window_days": 30},
}


def with_cross_columns(frame: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Two cross statistics: the 30-day one on every row, the 7-day one on half of them (a
    pair seen in the last week only), both informative about the click."""
    rng = np.random.default_rng(seed)
    frame = frame.copy()
    signal = frame["click"].to_numpy(np.float64) * 0.3 + rng.random(len(frame)) * 0.7
    frame[CROSS_30D] = signal
    frame[CROSS_7D] = np.where(rng.random(len(frame)) < 0.5, signal, np.nan)
    return frame


def test_costs_rise_with_window_and_key_cardinality() -> None:
    frame = with_cross_columns(synthetic_training_frame(600, users=40, items=60, seed=3))
    declarations = {
        name: {**spec, "keys": ["user_id", "genre"]} for name, spec in DECLARATIONS.items()
    }
    fields = FieldSet.from_declarations(declarations, frame)
    assert fields.names == (*FIELD_NAMES, CROSS_7D, CROSS_30D)
    seven, thirty = fields.spec(CROSS_7D), fields.spec(CROSS_30D)
    assert (seven.window_days, thirty.window_days) == (7, 30)
    # Keys counted where the statistic has a value: fewer pairs in 7 days than in 30.
    pairs = frame[["user_id", "genre"]].drop_duplicates()
    assert thirty.key_cardinality == len(pairs) > seven.key_cardinality > 1
    encoder = FieldEncoder(fields, bins=8).fit(frame)
    costs = dict(zip(fields.names, encoder.costs(8), strict=True))
    assert costs[CROSS_30D] > costs[CROSS_7D] > costs["ug_ctr"]
    # The one formula: longer windows and more keys cost more, everything else equal.
    assert field_cost("cross", 10, 8, window_days=30) > field_cost("cross", 10, 8, window_days=7)
    assert (
        field_cost("cross", 10, 8, window_days=7)
        > field_cost("cross", 10, 8)
        == (field_cost("cross", 10, 8, window_days=1))
    )
    assert field_cost("cross", 10, 8, key_cardinality=5_000) > field_cost(
        "cross", 10, 8, key_cardinality=50
    )
    # The default fields cost what they did: the extra fields change nothing of theirs.
    default = FieldEncoder(bins=8).fit(frame)
    assert costs["user_id"] == default.costs(8)[FIELD_NAMES.index("user_id")]
    assert encoder.costs(8)[: len(FIELDS)] == default.costs(8)


def test_field_sets_are_validated_and_round_trip_through_fields_json(tmp_path: Path) -> None:
    frame = with_cross_columns(synthetic_training_frame(200, users=20, items=30, seed=4))
    with pytest.raises(ValueError, match="unknown kind 'pair'"):
        FieldSet.from_declarations({CROSS_7D: {"kind": "pair"}}, frame)
    with pytest.raises(ValueError, match=r"duplicate field names \['user_ctr'\]"):
        FieldSet.from_declarations({"user_ctr": {"kind": "user"}}, frame)
    with pytest.raises(ValueError, match=r"lacks field columns \['ctr_item_1d'\]"):
        FieldSet.from_declarations({"ctr_item_1d": {"kind": "item", "window_days": 1}}, frame)
    with pytest.raises(ValueError, match="window_days must be an integer >= 1"):
        FieldSet.from_declarations({CROSS_7D: {"kind": "cross", "window_days": 0}}, frame)
    with pytest.raises(ValueError, match="unknown declaration keys"):
        FieldSet.from_declarations({CROSS_7D: {"kind": "cross", "window": 7}}, frame)
    fields = FieldSet.from_declarations(DECLARATIONS, frame)
    path = fields.save(tmp_path)
    assert path.name == FIELDS_FILE and FieldSet.load(path) == fields
    assert FieldSet.from_json(json.loads(path.read_text())) == fields
    # A builder's declarations file extends the default set; a repeated name is refused.
    declared = tmp_path / "declared.json"
    declared.write_text(json.dumps(DECLARATIONS))
    assert FieldSet.load(declared, frame) == fields
    twice = f'"{CROSS_7D}": {{"kind": "cross"}}'
    declared.write_text("{" + twice + ", " + twice + "}")
    with pytest.raises(ValueError, match="duplicate field names"):
        FieldSet.load(declared)
    assert FieldSet.beside(tmp_path / "nowhere") == FIELDS
    with pytest.raises(ValueError, match="fields"):
        CascadeTrainConfig(name="x", fields=["not", "a", "mapping"])  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def custom_run() -> tuple[CascadeTrainConfig, object]:
    config = dataclasses.replace(cascade_debug(), fields=DECLARATIONS)
    frame = with_cross_columns(synthetic_training_frame(1_200, users=50, items=80, seed=5))
    return config, prepare(config, frame)


def test_debug_config_trains_saves_and_reloads_with_extra_cross_fields(
    custom_run, tmp_path: Path
) -> None:
    config, prepared = custom_run
    assert prepared.fields.names == (*FIELD_NAMES, CROSS_7D, CROSS_30D)
    assert prepared.train_codes.shape[1] == len(FIELDS) + 2
    assert set(prepared.costs) == set(prepared.fields.names)
    assert prepared.costs[CROSS_30D] > prepared.costs[CROSS_7D]
    cards = prepared.encoder.cardinalities()
    # The FSCD selection: every field, the extra ones included, has a gate.
    torch.manual_seed(0)
    selector = PlainTorch(build_network("select", config, cards, field_set=prepared.fields), config)
    run_steps(
        selector, prepared.train_codes, prepared.train_labels, config, gated=True, max_steps=3
    )
    assert selector.module.gate_fields[-2:] == (CROSS_7D, CROSS_30D)
    # The fine-tuned pre-ranker on a kept subset with both cross statistics.
    kept = ("user_id", "item_id", "item_ctr", CROSS_7D, CROSS_30D)
    torch.manual_seed(0)
    tuned = PlainTorch(
        build_network("fscd", config, cards, kept, field_set=prepared.fields), config
    )
    run_steps(tuned, prepared.train_codes, prepared.train_labels, config, max_steps=4)
    model = tuned.module.eval()
    assert isinstance(model, ColdPreRanker) and model.cross_index.tolist() == [
        len(FIELDS),
        len(FIELDS) + 1,
    ]
    folder = save_cold_model(tmp_path / "fscd_model", model, config, prepared.encoder)
    saved = json.loads((folder / FIELDS_FILE).read_text())
    assert [f["name"] for f in saved["fields"]][-2:] == [CROSS_7D, CROSS_30D]
    assert saved["fields"][-1] == {
        "name": CROSS_30D, "kind": "cross", "categorical": False, "window_days": 30,
    }  # fmt: skip
    again, encoder, config_again = load_cold_dir(folder)
    assert encoder.fields == prepared.fields and config_again.fields == DECLARATIONS
    rows = synthetic_training_frame(300, users=60, items=90, seed=6)
    rows = with_cross_columns(rows, seed=7)
    want = score_frame(model, rows, prepared.encoder)
    got = score_frame(again, rows, encoder)
    np.testing.assert_array_equal(got, want)
    # The cross statistics matter to the scores (the values are not ignored).
    assert not np.array_equal(score_frame(again, rows.assign(**{CROSS_30D: np.nan}), encoder), got)
    # The request module the compiler exports takes the field set's width.
    example = cold_preranking_example(4, len(encoder.fields))
    assert example[1].shape == (4, len(FIELDS) + 2)
    assert ColdPreRankingRequest(again)(*example).shape == (4,)


def test_a_finished_phase_reloads_only_with_its_own_fields(custom_run, tmp_path: Path) -> None:
    config, prepared = custom_run
    teacher = next(p for p in cascade_phases(config) if p.kind == "teacher")
    folder = tmp_path / "phases" / "teacher"
    folder.mkdir(parents=True)
    network = build_network(
        "teacher", config, prepared.encoder.cardinalities(), field_set=prepared.fields
    )
    torch.save(network.state_dict(), folder / "model.pt")
    # Without fields.json a phase was trained on the default fields: not this run's.
    with pytest.raises(ValueError, match="trained on fields"):
        train_phase(teacher, config, prepared, tmp_path)
    prepared.fields.save(folder)
    loaded = train_phase(teacher, config, prepared, tmp_path)
    assert loaded.field_set == prepared.fields and loaded.fields == prepared.fields.names


def test_a_model_saved_without_fields_json_loads_with_the_default_fields(
    tmp_path: Path,
) -> None:
    config = cascade_debug()
    frame = synthetic_training_frame(400, users=30, items=40, seed=8)
    encoder = FieldEncoder(bins=config.bins).fit(frame)
    torch.manual_seed(0)
    model = ColdPreRanker(config.net, ("user_id", "item_ctr", "ug_ctr"), encoder.cardinalities())
    folder = save_cold_model(tmp_path / "fscd_model", model.eval(), config, encoder)
    (folder / FIELDS_FILE).unlink()  # as every folder written before fields.json existed
    again, loaded_encoder, _ = load_cold_dir(folder)
    assert loaded_encoder.fields == FIELDS and again.field_set == FIELDS
    np.testing.assert_array_equal(
        score_frame(again, frame, loaded_encoder), score_frame(model, frame, encoder)
    )


def test_numeric_codes_are_the_bucket_after_each_edge_and_zero_for_missing() -> None:
    from models.preranking.fields import FieldEncoder, FieldSpec

    rng = np.random.default_rng(5)
    train = pd.DataFrame({"x": rng.normal(size=500), "flat": np.full(500, np.nan)})
    specs = [FieldSpec(name="x", kind="user", categorical=False)]
    specs.append(FieldSpec(name="flat", kind="user", categorical=False))
    encoder = FieldEncoder(specs, bins=8).fit(train)
    edges = encoder.edges["x"]
    assert len(edges) == 7 and len(encoder.edges["flat"]) == 0
    values = np.concatenate(
        [rng.normal(size=200) * 3, edges, [np.nan, np.inf, -np.inf, edges[0] - 1e-9]]
    )
    expected = np.searchsorted(edges, values, side="right") + 1
    expected[np.isnan(values)] = 0
    got = encoder.encode_column("x", values)
    assert got.dtype == np.int64 and (got == expected).all()
    assert got[-4:].tolist() == [0, 8, 1, 1]  # NaN unknown; +inf past the last edge
    # A value on an edge goes to the bucket after it; a list of objects goes through pandas.
    assert encoder.encode_column("x", [edges[2], None, "nope"]).tolist() == [4, 0, 0]
    # No edges (a field with no numbers in training): every number is bucket 1, NaN 0.
    assert encoder.encode_column("flat", np.array([1.0, np.nan])).tolist() == [1, 0]
    # Replaced edges (a reloaded state) are used, not the cached ones.
    encoder.edges["x"] = np.array([0.0])
    assert encoder.encode_column("x", np.array([-1.0, 0.0, 2.0, np.nan])).tolist() == [1, 2, 2, 0]


def test_numbers_of_several_fields_encode_at_once_as_one_by_one() -> None:
    """encode_numbers (a request's few values of many fields) gives the codes encode_column
    gives each field: NaN, +-inf, values on the edges, a field without edges, replaced edges."""
    from models.preranking.fields import FieldEncoder, FieldSpec

    rng = np.random.default_rng(11)
    train = pd.DataFrame(
        {
            "a": rng.normal(size=400),
            "b": rng.exponential(size=400),
            "flat": np.full(400, np.nan),
            "c": rng.integers(0, 3, 400).astype(float),  # few distinct values: few edges
        }
    )
    names = list(train.columns)
    specs = [FieldSpec(name=n, kind="cross", categorical=False) for n in names]
    specs.append(FieldSpec(name="cat", kind="item", categorical=True))
    encoder = FieldEncoder(specs, bins=8).fit(train.assign(cat=["x", "y"] * 200))
    assert len({len(encoder.edges[n]) for n in names}) > 2  # ragged edge lists
    edge_values = np.concatenate([np.asarray(encoder.edges[n]) for n in names])
    pool = np.concatenate([edge_values, [np.nan, np.inf, -np.inf, 0.0], rng.normal(size=50) * 2])

    def check() -> None:
        values = rng.choice(pool, size=(30, len(names)))
        got = encoder.encode_numbers(names, values)
        want = np.column_stack(
            [encoder.encode_column(n, values[:, k]) for k, n in enumerate(names)]
        )
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want)

    check()
    encoder.edges["a"] = np.array([0.0, 1.0])  # a reloaded state: the new edges are used
    check()
    with pytest.raises(ValueError, match="categorical"):
        encoder.encode_numbers(["cat"], np.zeros((1, 1)))
    with pytest.raises(ValueError, match="shape"):
        encoder.encode_numbers(names, np.zeros((2, 1)))


def test_a_few_categorical_values_encode_as_the_index_does() -> None:
    """The dict used for a request's few ids gives get_indexer's codes: ints, numpy ints, an
    integral float, strings, None, NaN, unseen values; a replaced
    vocabulary is used; a vocabulary holding NaN goes through the Index."""
    from models.preranking.fields import SMALL_LOOKUP, FieldEncoder, FieldSpec

    specs = [
        FieldSpec(name="user_id", kind="user", categorical=True),
        FieldSpec(name="genre", kind="item", categorical=True),
    ]
    train = pd.DataFrame({"user_id": [5, 9, 12, 5], "genre": ["Drama", "Action", None, "Drama"]})
    encoder = FieldEncoder(specs).fit(train)

    def by_index(name: str, values: list) -> list[int]:
        return (encoder.vocab[name].get_indexer(pd.Index(values, dtype=object)) + 1).tolist()

    ids = [5, np.int64(9), 12.0, 7, None, float("nan"), "5"]
    assert encoder.encode_column("user_id", ids).tolist() == by_index("user_id", ids) == [
        1, 2, 3, 0, 0, 0, 0,
    ]  # fmt: skip
    assert encoder.encode_column("user_id", np.array([12, 5, 1])).tolist() == [3, 1, 0]
    genres = ["Action", "Drama", "Comedy", None]
    assert encoder.encode_column("genre", genres).tolist() == by_index("genre", genres)
    many = list(range(SMALL_LOOKUP + 5))  # past the dict's size: the Index, same codes
    assert encoder.encode_column("user_id", many).tolist() == by_index("user_id", many)
    encoder.vocab["user_id"] = pd.Index([7, 5])
    assert encoder.encode_column("user_id", [5, 7, 9]).tolist() == [2, 1, 0]
    encoder.vocab["genre"] = pd.Index(["Action", np.nan], dtype=object)
    assert encoder.encode_column("genre", [np.nan, "Action"]).tolist() == [2, 1]
