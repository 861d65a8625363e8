"""The ranking cascade: field encoding and costs, the three networks, FSCD gates, the
deterministic loop, evaluation metrics, and (slow) a 2-node run, one node of it killed, that
resumes to the same metrics as an uninterrupted one."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from cascade.config import Settings
from cascade.training.crash_points import CRASH_ENV, CRASH_NODE_ENV
from domains.ctr.schema import LABEL, TIMESTAMP
from models.preranking.cascade_train import launch_cascade
from models.preranking.config_registry import (
    CASCADE_CONFIGS,
    CascadeTrainConfig,
    cascade_debug,
    get_cascade_config,
)
from models.preranking.fields import FIELD_NAMES, FIELDS, FieldEncoder, field_cost
from models.preranking.fscd_data import ALL_FIELDS, DegenerateData, prepare
from models.preranking.fscd_metrics import (
    CONSTANT_SCORES,
    BelowBaseline,
    DegenerateModel,
    OverBudget,
    choose_fscd,
    gauc,
    headline_metrics,
    popularity_auc,
    recall_at_k,
    relative_spread,
)
from models.preranking.fscd_phases import (
    PlainTorch,
    build_network,
    epoch_shard,
    fscd_regularizer,
    gate_noise,
    run_steps,
)
from models.preranking.model import (
    ITEM_FOLD_MAX_ROWS,
    ColdPreRanker,
    DCNTeacher,
    TwoTower,
    cross_keys,
)
from models.preranking.movielens_frame import prior_counts
from models.preranking.synthetic_data import synthetic_training_frame
from models.preranking.training_set import time_split


@pytest.fixture(scope="module")
def prepared() -> object:
    config = cascade_debug()
    return prepare(config, synthetic_training_frame(3_000, users=80, items=120, seed=1))


def test_encoder_maps_unknown_and_missing_to_zero_and_round_trips() -> None:
    frame = synthetic_training_frame(2_000, seed=2)
    encoder = FieldEncoder(bins=8).fit(frame)
    new = frame.head(3).copy()
    new.loc[new.index[0], "user_id"] = 10**9  # never seen
    new.loc[new.index[1], "ug_ctr"] = np.nan
    codes = encoder.encode(new)
    user_col, ug_col = ALL_FIELDS.index("user_id"), ALL_FIELDS.index("ug_ctr")
    assert codes[0, user_col] == 0 and codes[1, ug_col] == 0
    assert (codes[2] > 0).all()
    assert (codes < torch.tensor(encoder.cardinalities())).all()
    # Bins are monotone in the value.
    ordered = frame.sort_values("user_ctr")
    binned = encoder.encode(ordered)[:, ALL_FIELDS.index("user_ctr")].numpy()
    assert (np.diff(binned) >= 0).all() and len(np.unique(binned)) >= 6
    again = FieldEncoder.from_state(json.loads(json.dumps(encoder.state())))
    assert torch.equal(again.encode(frame), encoder.encode(frame))
    with pytest.raises(ValueError, match=r"lacks field columns \['genre'\]"):
        FieldEncoder().fit(frame.drop(columns=["genre"]))


def test_costs_grow_with_type_cardinality_and_width() -> None:
    assert field_cost("cross", 17, 8) == pytest.approx(3 * field_cost("user", 17, 8))
    assert field_cost("user", 1_000, 8) > field_cost("user", 17, 8)
    assert field_cost("item", 17, 16) == pytest.approx(2 * field_cost("item", 17, 8))
    with pytest.raises(ValueError, match="unknown field kind 'pair'"):
        field_cost("pair", 10, 8)


@pytest.mark.parametrize("gated", [False, True])
def test_score_request_shares_the_user_part_and_matches_row_scoring(prepared, gated) -> None:
    config = cascade_debug()
    torch.manual_seed(0)
    model = ColdPreRanker(config.net, ALL_FIELDS, prepared.encoder.cardinalities(), gated=gated)
    if gated:  # drop two fields so the hard gates matter
        with torch.no_grad():
            model.gate_logits[[1, 12]] = -3.0
    model.eval()
    candidates = prepared.test.codes[:50]
    user = candidates[0]
    rows = candidates.clone()
    user_cols = [i for i, f in enumerate(FIELDS) if f.kind == "user"]
    rows[:, user_cols] = user[user_cols]
    calls = []
    model.user_linear.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    pairwise = []
    model.interaction_linear.register_forward_hook(lambda m, i, o: pairwise.append(i[0].shape))
    with torch.no_grad():
        shared = model.score_request(user, candidates)
    assert calls == [1]  # the user side ran once, for one row, not once per candidate
    # The interactions are folded into one matrix per request: no Fu x Fi products per row.
    assert pairwise == []
    with torch.no_grad():
        torch.testing.assert_close(shared, model(rows))
    # The scores really depend on the candidates (not a constant).
    assert shared.std() > 1e-4


@pytest.mark.parametrize("gated", [False, True])
def test_score_request_per_cross_key_matches_per_candidate(prepared, gated) -> None:
    """The cross side computed once per distinct cross key and gathered (``cross_codes``,
    ``cross_rows``) scores as the per-candidate form; the candidates' own cross columns are
    then not read, and the cross Linear runs on K rows, not N."""
    config = cascade_debug()
    torch.manual_seed(1)
    model = ColdPreRanker(config.net, ALL_FIELDS, prepared.encoder.cardinalities(), gated=gated)
    if gated:
        with torch.no_grad():
            model.gate_logits[[2, len(ALL_FIELDS) - 1]] = -3.0
    model.eval()
    candidates = prepared.test.codes[:200]
    user = candidates[0]
    cross, rows = cross_keys(model, candidates)
    index = model.cross_index
    assert 1 < cross.shape[0] < len(candidates)  # repeated keys: fewer rows than candidates
    torch.testing.assert_close(cross[rows][:, index], candidates[:, index])
    widths = []
    model.cross_linear.register_forward_hook(lambda m, i, o: widths.append(i[0].shape[0]))
    blanked = candidates.clone()
    blanked[:, index] = 0  # not read when the keys are given
    with torch.no_grad():
        keyed = model.score_request(user, blanked, cross, rows)
        whole = model.score_request(user, candidates)
    assert widths == [cross.shape[0], len(candidates)]
    torch.testing.assert_close(keyed, whole)
    with pytest.raises(ValueError, match="together"):
        model.score_request(user, candidates, cross, None)


class _Request(torch.nn.Module):
    def __init__(self, model: ColdPreRanker) -> None:
        super().__init__()
        self.model = model

    def forward(self, user: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        return self.model.score_request(user, candidates)


@pytest.mark.parametrize("drop", [(), ("item_id",), ("item_ctr", "genre")])
def test_traced_score_request_folds_small_item_fields(prepared, drop) -> None:
    """Traced, item fields of at most ITEM_FOLD_MAX_ROWS codes are folded into the first layer
    per request (a batched product of their table rows, then one fetched row per candidate),
    wider ones stay in the product; with any of them gated off the traced request still scores
    as the row forward and the eager request. The fold's tables are rebuilt from the
    cardinalities, not saved."""
    config = cascade_debug()
    cards = prepared.encoder.cardinalities()
    torch.manual_seed(2)
    model = ColdPreRanker(config.net, ALL_FIELDS, cards, gated=True)
    item_names = [FIELDS[int(p)].name for p in model.item_index]
    folded = {item_names[j] for j in model.item_folded}
    unfolded = {item_names[j] for j in model.item_unfolded}
    by_name = dict(zip(FIELD_NAMES, cards, strict=True))
    assert folded == {n for n in item_names if by_name[n] <= ITEM_FOLD_MAX_ROWS}
    assert "item_id" in unfolded and by_name["item_id"] > ITEM_FOLD_MAX_ROWS
    assert len(folded) >= 2
    with torch.no_grad():
        for name in drop:
            model.gate_logits[model.gate_fields.index(name)] = -3.0
    model.eval()
    assert not any(k.startswith("item_fold") or k == "item_gemm_index" for k in model.state_dict())
    again = ColdPreRanker(config.net, ALL_FIELDS, cards, gated=True)
    again.load_state_dict(model.state_dict())
    candidates = prepared.test.codes[:300]
    rows = candidates.clone()
    user_cols = [i for i, f in enumerate(FIELDS) if f.kind == "user"]
    rows[:, user_cols] = candidates[0, user_cols]
    with torch.no_grad():
        traced = torch.export.export(_Request(again.eval()), (candidates[0], candidates))
        assert any(n.target == torch.ops.aten.bmm.default for n in traced.graph.nodes)
        scored = traced.module()(candidates[0], candidates)
        torch.testing.assert_close(scored, model(rows))
        torch.testing.assert_close(scored, model.score_request(candidates[0], candidates))
        if drop:  # a dropped field's codes change nothing
            other = candidates.clone()
            for name in drop:
                other[:, FIELD_NAMES.index(name)] = 0
            torch.testing.assert_close(traced.module()(candidates[0], other), scored)
    assert scored.std() > 1e-4


def test_hard_gates_make_dropped_fields_irrelevant(prepared) -> None:
    config = cascade_debug()
    torch.manual_seed(0)
    model = ColdPreRanker(config.net, ALL_FIELDS, prepared.encoder.cardinalities(), gated=True)
    ug = ALL_FIELDS.index("ug_ctr")
    with torch.no_grad():
        model.gate_logits[model.gate_fields.index("ug_ctr")] = -1.0
    model.eval()
    assert "ug_ctr" not in model.kept_fields() and len(model.kept_fields()) == len(FIELDS) - 1
    codes = prepared.test.codes[:20].clone()
    changed = codes.clone()
    changed[:, ug] = (changed[:, ug] + 1) % prepared.encoder.cardinality("ug_ctr")
    with torch.no_grad():
        torch.testing.assert_close(model(codes), model(changed))
        model.gate_logits[model.gate_fields.index("ug_ctr")] = 1.0
        assert not torch.allclose(model(codes), model(changed))
    model.train()
    with pytest.raises(ValueError, match="needs uniform noise"):
        model(codes)


def test_fscd_regularizer_pushes_dear_fields_harder(prepared) -> None:
    config = cascade_debug()
    model = ColdPreRanker(config.net, ALL_FIELDS, prepared.encoder.cardinalities(), gated=True)
    fscd_regularizer(model, prepared.costs).backward()
    grad = dict(zip(model.gate_fields, model.gate_logits.grad.tolist(), strict=True))
    assert grad["ug_ctr"] > grad["user_ctr"] > 0  # cross (x3) is dearer than a user value
    assert grad["item_id"] > grad["item_ctr"]  # 120 keys cost more than 16 bins


def test_teacher_and_two_tower_read_the_right_fields(prepared) -> None:
    config = cascade_debug()
    cards = prepared.encoder.cardinalities()
    teacher = build_network("teacher", config, cards)
    tower = build_network("two_tower", config, cards)
    assert isinstance(teacher, DCNTeacher) and isinstance(tower, TwoTower)
    assert teacher.fields == ALL_FIELDS
    assert set(tower.fields) == {f.name for f in FIELDS if f.kind != "cross"}
    codes = prepared.test.codes[:8]
    cross = [i for i, f in enumerate(FIELDS) if f.kind == "cross"]
    changed = codes.clone()
    changed[:, cross] = 0
    with torch.no_grad():
        torch.testing.assert_close(tower(codes), tower(changed))  # no cross features
        assert not torch.allclose(teacher(codes), teacher(changed))


def test_epoch_order_and_noise_are_deterministic_and_sharded() -> None:
    a = [epoch_shard(101, seed=3, epoch=1, rank=r, world=2) for r in range(2)]
    b = [epoch_shard(101, seed=3, epoch=1, rank=r, world=2) for r in range(2)]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert len(a[0]) == len(a[1]) == 50 and not set(a[0].tolist()) & set(a[1].tolist())
    assert not torch.equal(a[0], epoch_shard(101, seed=3, epoch=2, rank=0, world=2))
    assert torch.equal(
        gate_noise((4, 3), seed=1, step=7, rank=1), gate_noise((4, 3), seed=1, step=7, rank=1)
    )
    assert not torch.equal(
        gate_noise((4, 3), seed=1, step=7, rank=1), gate_noise((4, 3), seed=1, step=7, rank=0)
    )


def test_loop_resumes_mid_run_to_identical_weights(prepared) -> None:
    """The single-process core of resumability: batches and noise depend on the step only."""
    config = cascade_debug()
    cards = prepared.encoder.cardinalities()

    def fresh() -> PlainTorch:
        torch.manual_seed(0)
        return PlainTorch(build_network("select", config, cards), config)

    whole = fresh()
    run_steps(whole, prepared.train_codes, prepared.train_labels, config, gated=True, max_steps=6)
    first = fresh()
    stopped = run_steps(
        first, prepared.train_codes, prepared.train_labels, config, gated=True, max_steps=3
    )
    second = fresh()
    second.module.load_state_dict(first.module.state_dict())
    second.optimizer.load_state_dict(first.optimizer.state_dict())
    end = run_steps(
        second,
        prepared.train_codes,
        prepared.train_labels,
        config,
        gated=True,
        start_step=stopped,
        max_steps=3,
    )
    assert (stopped, end) == (3, 6)
    # The weights moved, so equality below is not trivially the initialization.
    assert not torch.equal(whole.module.gate_logits, fresh().module.gate_logits)
    for (name, x), y in zip(
        whole.module.state_dict().items(), second.module.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def test_gauc_and_recall_on_known_cases() -> None:
    labels = np.array([1, 0, 1, 0, 1, 1])
    users = np.array([1, 1, 2, 2, 3, 3])  # user 3 has one class: skipped
    perfect = np.array([0.9, 0.1, 0.8, 0.2, 0.5, 0.6])
    assert gauc(labels, perfect, users) == 1.0
    half = np.array([0.9, 0.1, 0.2, 0.8, 0.5, 0.6])  # user 1 right, user 2 wrong
    assert gauc(labels, half, users) == pytest.approx(0.5)
    teacher = np.arange(6, dtype=float)
    users = np.zeros(6, dtype=int)
    assert recall_at_k(teacher, teacher, users, 2) == 1.0
    assert recall_at_k(-teacher, teacher, users, 2) == 0.0
    assert recall_at_k(np.array([5, 0, 1, 2, 3, 4.0]), teacher, users, 2) == 0.5
    assert math.isnan(recall_at_k(teacher, teacher, users, 6))  # no user with > k candidates


def test_prepare_carves_validation_from_the_training_period() -> None:
    config = cascade_debug()  # test_fraction = validation_fraction = 0.2
    frame = synthetic_training_frame(1_000, users=40, items=60, seed=3)
    newcomer = frame[TIMESTAMP].sort_values().iloc[700]  # inside the validation period
    frame.loc[frame[TIMESTAMP] >= newcomer, "item_id"] = 10**6  # an id training never saw
    data = prepare(config, frame)
    assert (len(data.train_labels), len(data.validation.labels), len(data.test.labels)) == (
        640,
        160,
        200,
    )
    ordered = frame.sort_values(TIMESTAMP, kind="stable")
    assert data.test.labels.tolist() == ordered[LABEL].iloc[800:].tolist()
    assert data.validation.labels.tolist() == ordered[LABEL].iloc[640:800].tolist()
    # The encoder saw the training rows only: the newcomer is unknown (0) in validation too.
    item = ALL_FIELDS.index("item_id")
    assert (data.train_codes[:, item] > 0).all()
    assert data.validation.codes[-1, item] == 0 and (data.test.codes[:, item] == 0).all()
    with pytest.raises(ValueError, match="validation_fraction"):
        CascadeTrainConfig(name="x", validation_fraction=1.0)


def test_prepare_refuses_a_validation_split_too_small_to_choose_on() -> None:
    config = dataclasses.replace(cascade_debug(), min_validation_clicks=100)
    frame = synthetic_training_frame(1_000, users=40, items=60, seed=3)
    with pytest.raises(DegenerateData, match=r"160 rows with \d+ clicks; .* at least 100 clicks"):
        prepare(config, frame)


def test_empty_and_constant_fields_are_flagged_and_an_all_degenerate_set_refused() -> None:
    frame = synthetic_training_frame(1_000, users=40, items=60, seed=3)
    numeric = [f.name for f in FIELDS if not f.categorical]
    frame[numeric[0]] = np.nan
    frame[numeric[1]] = 0.5
    frame.loc[frame.index[::2], numeric[2]] = np.nan  # present on some rows: informative

    data = prepare(cascade_debug(), frame)

    assert data.degenerate == {"all_missing": [numeric[0]], "constant": [numeric[1]]}
    assert data.unusable == {numeric[0], numeric[1]}
    for name in FIELD_NAMES:
        frame[name] = np.nan if name in numeric else frame[name].iloc[0]
    with pytest.raises(DegenerateData, match="every field is empty or constant"):
        prepare(cascade_debug(), frame)


def test_a_model_that_scores_every_row_the_same_is_never_chosen() -> None:
    rows = [
        {**_row("fscd_0.01", 0.5, 0.1), "relative_spread": 0.0, "fields": ["empty"]},
        {**_row("fscd_0.03", 0.49, 0.2), "relative_spread": 0.3, "fields": ["user_id"]},
    ]
    assert choose_fscd(rows, budget=0.5)["model"] == "fscd_0.03"
    with pytest.raises(DegenerateModel, match="scores all validation rows the same"):
        choose_fscd(rows[:1], budget=0.5)


def test_constant_scores_are_judged_relative_to_their_scale() -> None:
    """Scores at a 0.5% click rate with a spread of 8e-6 pass an absolute 1e-6 threshold, yet
    rank nothing; the same relative spread at any scale is refused, a real spread is not."""
    rng = np.random.default_rng(0)
    flat = 0.005 + 8e-6 * rng.standard_normal(2_000)
    assert np.std(flat) > 1e-6
    assert relative_spread(flat) < CONSTANT_SCORES
    assert relative_spread(flat * 100) == pytest.approx(relative_spread(flat))
    assert relative_spread(rng.uniform(0.001, 0.02, 2_000)) > CONSTANT_SCORES
    rows = [{**_row("fscd_0.01", 0.52, 0.3), "relative_spread": relative_spread(flat)}]
    with pytest.raises(DegenerateModel, match="scores all validation rows the same"):
        choose_fscd(rows, budget=0.5)


def test_a_model_over_the_cost_budget_fails_the_step() -> None:
    rows = [
        {**_row("fscd_0.01", 0.70, 1.0), "relative_spread": 0.4},
        {**_row("fscd_0.03", 0.68, 0.8), "relative_spread": 0.4},
        {**_row("fscd_0.1", 0.60, 0.3), "relative_spread": 0.0},  # within, but constant
    ]
    with pytest.raises(OverBudget, match=r"cost budget 0.5: the cheapest, fscd_0.03, costs 0.8"):
        choose_fscd(rows, budget=0.5)


def test_a_model_below_item_popularity_on_validation_is_never_picked() -> None:
    rows = [
        {**_row("fscd_0.01", 0.58, 0.4), "relative_spread": 0.4},
        {**_row("fscd_0.03", 0.48, 0.2), "relative_spread": 0.4},
    ]
    assert choose_fscd(rows, budget=0.5, baseline_auc=0.55)["model"] == "fscd_0.01"
    with pytest.raises(BelowBaseline, match=r"fscd_0.01, has validation AUC 0.5800, not above"):
        choose_fscd(rows, budget=0.5, baseline_auc=0.60)
    with pytest.raises(BelowBaseline, match="item popularity's 0.5500"):
        choose_fscd(rows[1:], budget=0.5, baseline_auc=0.55)
    # Popularity below chance does not let a below-chance model through.
    with pytest.raises(BelowBaseline, match=r"not above chance \(0.5; item popularity's is 0.4"):
        choose_fscd(rows[1:], budget=0.5, baseline_auc=0.45)


def test_item_popularity_auc_is_the_training_clicks_of_each_item() -> None:
    config = cascade_debug()
    frame = synthetic_training_frame(4_000, users=60, items=80, seed=5)
    data = prepare(config, frame)
    period, _ = time_split(frame, config.test_fraction)
    train, validation = time_split(period, config.validation_fraction)
    clicks = train.groupby("item_id")[LABEL].sum()
    expected = np.array([float(clicks.get(item, 0)) for item in validation["item_id"]])
    np.testing.assert_array_equal(data.validation.popularity, expected)
    auc = popularity_auc(data.validation)
    assert auc == pytest.approx(roc_auc_score(validation[LABEL], expected))
    assert auc > 0.5  # the generator's items differ in click rate


def _row(model: str, auc: float, cost_ratio: float) -> dict[str, object]:
    return {
        "model": model,
        "auc": auc,
        "gauc": auc - 0.01,
        "recall_at_3": 0.5,
        "cost_ratio": cost_ratio,
    }


def test_strength_is_chosen_on_validation_and_reported_on_test() -> None:
    """Validation prefers λ=0.01, test would prefer λ=0.03: the run reports λ=0.01's test AUC."""
    config = dataclasses.replace(cascade_debug(), cost_budget=0.5)
    validation = [
        _row("teacher", 0.80, 1.0),
        _row("two_tower", 0.74, 0.6),
        _row("fscd_0.01", 0.79, 0.45),
        _row("fscd_0.03", 0.77, 0.40),
        _row("fscd_0.001", 0.795, 0.8),  # best, but over the budget
    ]
    test = [
        _row("teacher", 0.78, 1.0),
        _row("two_tower", 0.73, 0.6),
        _row("fscd_0.01", 0.75, 0.45),
        _row("fscd_0.03", 0.76, 0.40),
        _row("fscd_0.001", 0.77, 0.8),
    ]
    metrics = headline_metrics(validation, test, config)
    assert metrics["fscd_strength"] == 0.01
    assert metrics["fscd_auc"] == 0.75 and metrics["fscd_validation_auc"] == 0.79
    assert metrics["auc_ratio"] == pytest.approx(0.75 / 0.78)
    assert metrics["validation_auc_ratio"] == pytest.approx(0.79 / 0.80)
    assert metrics["cost_ratio"] == 0.45 and metrics["teacher_auc"] == 0.78


def test_choose_fscd_prefers_best_auc_within_budget() -> None:
    rows = [
        {"model": "fscd_0.01", "auc": 0.80, "cost_ratio": 0.7},
        {"model": "fscd_0.03", "auc": 0.78, "cost_ratio": 0.45},
        {"model": "fscd_0.1", "auc": 0.75, "cost_ratio": 0.2},
        {"model": "teacher", "auc": 0.81, "cost_ratio": 1.0},
    ]
    assert choose_fscd(rows, 0.5)["model"] == "fscd_0.03"
    with pytest.raises(OverBudget):  # none within: no model is deployed over the budget
        choose_fscd(rows, 0.1)


def test_cascade_configs_validate_and_round_trip() -> None:
    assert set(CASCADE_CONFIGS) == {
        "debug",
        "debug_cross",
        "ml100k",
        "generated",
        "generated_cross",
        "pipeline",
    }
    for name in CASCADE_CONFIGS:
        config = get_cascade_config(name)
        assert CascadeTrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert get_cascade_config("generated").rows > get_cascade_config("debug").rows
    with pytest.raises(ValueError, match="unknown cascade config 'huge'"):
        get_cascade_config("huge")
    with pytest.raises(ValueError, match="fscd_strengths"):
        CascadeTrainConfig(name="x", fscd_strengths=())
    with pytest.raises(ValueError, match="zero_stage"):
        CascadeTrainConfig(name="x", zero_stage=4)


def test_movielens_counts_only_see_strictly_earlier_impressions() -> None:
    ts = pd.to_datetime([1, 2, 2, 3], unit="s", utc=True)
    frame = pd.DataFrame({"user_id": [7, 7, 7, 7], TIMESTAMP: ts, LABEL: [1, 1, 0, 1]})
    impressions, clicks = prior_counts(frame, ["user_id"])
    # The two rows in second 2 see only second 1, not each other.
    assert impressions.tolist() == [0, 1, 1, 3] and clicks.tolist() == [0, 1, 1, 2]


@pytest.mark.slow
def test_killed_two_process_run_on_two_nodes_resumes_to_the_same_metrics(
    settings: Settings, tmp_path: Path
) -> None:
    """One node of a 2-node x 1-process run dies whole mid-phase; the run fails naming it, and
    the relaunch resumes from the checkpoint to the metrics of an uninterrupted 1-node x
    2-process run (the same world: the node layout changes nothing)."""
    import mlflow

    whole = tmp_path / "whole"
    code, tail = launch_cascade("debug", whole, processes=2, nodes=1, settings=settings)
    assert (whole / "result.json").exists(), tail
    expected = json.loads((whole / "metrics.json").read_text())

    killed = tmp_path / "killed"
    # Step 6 of 7 of the FSCD selection: after its step-5 checkpoint, before it finishes. Node
    # 1 (rank 1) dies with its launcher; node 0 (rank 0, the rendezvous host) is ended.
    code, tail = launch_cascade(
        "debug",
        killed,
        processes=1,
        nodes=2,
        settings=settings,
        extra_env={CRASH_ENV: "select_0.05:6", CRASH_NODE_ENV: "1"},
    )
    assert code != 0 and not (killed / "result.json").exists(), tail
    assert tail.splitlines()[-1].startswith(
        "[launch] node 1 of 2 failed: its launcher was killed by SIGKILL; "
    ), tail
    assert (killed / "checkpoints" / "select_0.05" / "step5").is_dir()
    log = (killed / "train.log").read_text()
    # Each node's command line, rank 0's pid at the start and a line per checkpoint.
    assert "--nnodes 2 --node_rank 1 --nproc_per_node 1" in log, log[:3000]
    assert re.search(r"\[node 0\] \[cascade\] config=debug world=2 .* pid=\d+", log), log[-3000:]
    assert "[cascade] select_0.05: checkpoint at step 5 in " in log, log[-3000:]
    assert "[node 1] [cascade] CASCADE_CRASH_AT: node 1 dies after select_0.05 step 6" in log
    assert (killed / "phases" / "two_tower" / "model.pt").exists()
    assert not (killed / "phases" / "select_0.05" / "model.pt").exists()
    code, tail = launch_cascade("debug", killed, processes=1, nodes=2, settings=settings)
    assert "select_0.05: resumed at step 5" in tail and "teacher: done" not in tail
    got = json.loads((killed / "metrics.json").read_text())
    for key in (
        "teacher_auc",
        "fscd_auc",
        "two_tower_auc",
        "fscd_gauc",
        "recall_at_k",
        "cost_ratio",
    ):
        assert got[key] == expected[key], key
    assert expected["teacher_auc"] > 0.6  # it learned something

    result = json.loads((killed / "result.json").read_text())
    client = mlflow.tracking.MlflowClient(tracking_uri=settings.tracking_uri)
    run = client.get_run(result["run_id"])  # the resumed run continued the same MLflow run
    assert (
        run.info.status == "FINISHED"
        and json.loads((killed / "mlflow_run.json").read_text())["run_id"] == result["run_id"]
    )
    assert run.data.metrics["fscd_auc"] == pytest.approx(got["fscd_auc"])
    # debug logs every 5 of 7 steps: one point per phase, kept across the kill.
    for phase in ("teacher", "select_0.05", "fscd_0.05"):
        assert client.get_metric_history(result["run_id"], f"loss.{phase}"), phase
    assert (killed / "tradeoff.png").stat().st_size > 1_000
    # The curves and the trade-off DVC plots: the resumed run's are the uninterrupted run's.
    for phase in ("teacher", "select_0.05", "fscd_0.05"):
        curve = (killed / "curves" / f"{phase}.csv").read_text()
        assert curve.startswith("step,loss\n5,"), curve
        assert curve == (whole / "curves" / f"{phase}.csv").read_text(), phase
    tradeoff = (killed / "tradeoff.csv").read_text().splitlines()
    assert tradeoff[0] == "model,split,cost_ratio,auc,gauc" and len(tradeoff) > 4
    evaluation = json.loads((killed / "evaluation.json").read_text())
    assert {r["model"] for r in evaluation["rows"]} == {
        "teacher",
        "two_tower",
        "fscd_0.05",
    }
    # λ is chosen on validation rows carved from the training period, never on test rows.
    assert evaluation["selected_on"] == "validation" and evaluation["chosen"] == "fscd_0.05"
    assert {r["model"] for r in evaluation["validation_rows"]} == {
        r["model"] for r in evaluation["rows"]
    }
    assert evaluation["split_rows"] == {"train": 3_200, "validation": 800, "test": 1_000}
    assert got["fscd_validation_auc"] > 0.5 and got["fscd_strength"] == 0.05
    # The logged model (a pyfunc with the network and its encoder) scores like the phase's
    # weights, and is the deployable kind the registry reads.
    assert result["model_kind"] == "fscd" and result["test_auc"] == got["fscd_auc"]
    mlflow.set_tracking_uri(settings.tracking_uri)
    signature = mlflow.models.get_model_info(result["model_uri"]).signature
    assert signature is not None and signature.inputs.input_names() == list(FIELD_NAMES)
    loaded = mlflow.pyfunc.load_model(result["model_uri"]).unwrap_python_model().model
    encoder = FieldEncoder.from_state(json.loads((killed / "encoder.json").read_text()))
    codes = encoder.encode(synthetic_training_frame(5, seed=5))
    fields = tuple(result["fscd_fields"])
    reference = build_network("fscd", cascade_debug(), encoder.cardinalities(), fields)
    state = torch.load(killed / "phases" / "fscd_0.05" / "model.pt", weights_only=True)
    reference.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(loaded(codes), reference.eval()(codes))


DEEPSPEED_MATCHES_PLAIN = """
import dataclasses, json, sys
import torch
from cascade.training.launch import init_distributed
from models.preranking import fscd_phases as ct
from models.preranking.config_registry import cascade_debug
from models.preranking.fscd_data import prepare
from models.preranking.synthetic_data import synthetic_training_frame

init_distributed()
config = dataclasses.replace(cascade_debug(), zero_stage=0, bf16=False)
data = prepare(config, synthetic_training_frame(3_000, users=80, items=120, seed=1))
cards = data.encoder.cardinalities()
torch.manual_seed(0)
plain = ct.PlainTorch(ct.build_network("teacher", config, cards), config)
torch.manual_seed(0)
engine = ct.make_engine(ct.build_network("teacher", config, cards), config)
initial = {k: v.clone() for k, v in plain.module.state_dict().items()}
for loop in (plain, engine):
    ct.run_steps(loop, data.train_codes, data.train_labels, config, max_steps=4)
worst = max(
    (a - b).abs().max().item()
    for a, b in zip(plain.module.state_dict().values(), engine.module.state_dict().values())
)
moved = max((v - initial[k]).abs().max().item() for k, v in plain.module.state_dict().items())
print(json.dumps({
    "worst": worst,
    "moved": moved,
    "allreduce": engine.enable_backward_allreduce,
    "optimizer": type(engine.optimizer).__name__,
}))
"""


def test_deepspeed_step_is_the_plain_pytorch_step_on_one_process(tmp_path: Path) -> None:
    """The throughput comparison is fair only if both loops do the same work: same optimizer
    (Adam, not DeepSpeed's default AdamW), no hidden clipping, identical weights after 4 steps."""
    import os
    import subprocess
    import sys

    from cascade.training.launch import extension_build_env

    env = {**os.environ, "DS_ACCELERATOR": "cpu", "CASCADE_HOME": str(tmp_path)}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    # The launcher's shared cache: DeepSpeed's CPU comm extension compiles once, not per test.
    extension_build_env(env)
    done = subprocess.run(
        [sys.executable, "-c", DEEPSPEED_MATCHES_PLAIN],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["moved"] > 1e-3  # training changed the weights
    assert report["worst"] <= 1e-6, report
    assert report["optimizer"] == "Adam" and report["allreduce"] is False


def test_only_the_debug_flavours_skip_the_popularity_floor() -> None:
    """A smoke run (``debug``) reports a model under item popularity; every other config fails."""
    assert [name for name in CASCADE_CONFIGS if not get_cascade_config(name).beat_baseline] == [
        "debug",
        "debug_cross",
    ]
    rows = [
        _row("teacher", 0.60, 1.0),
        _row("two_tower", 0.55, 0.6),
        {**_row("fscd_0.01", 0.52, 0.45), "relative_spread": 0.4},
    ]
    baseline = {"validation_auc": 0.56, "test_auc": 0.56}
    smoke = headline_metrics(rows, rows, cascade_debug(), baseline)
    assert smoke["fscd_strength"] == 0.01
    with pytest.raises(BelowBaseline):
        headline_metrics(rows, rows, get_cascade_config("pipeline"), baseline)
