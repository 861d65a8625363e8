"""Learned cross features on synthetic low-rank CTR tables (no Spark)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from compilers.export import torch_threads
from jobs import ctr_learned_cross as learned


@pytest.mark.slow  # ~35 s of full-batch Adam on a loaded 2-core machine
def test_interaction_term_predicts_held_out_pairs_better_than_additive() -> None:
    rng = np.random.default_rng(3)
    users, categories = rng.normal(size=(300, 2)), rng.normal(size=(12, 2))
    user, category = np.meshgrid(np.arange(300), np.arange(12), indexing="ij")
    logit = -2.0 + (users[user] * categories[category]).sum(-1)
    frame = pd.DataFrame(
        {
            "user_id": user.ravel(),
            "item_category": [f"c{c}" for c in category.ravel()],
            "x_ctr_30d": 1 / (1 + np.exp(-logit.ravel())),
            "x_imp_30d": rng.integers(5, 50, size=user.size),
        }
    )

    got = learned.evaluate(
        frame,
        keys=("user_id", "item_category"),
        target="x_ctr_30d",
        weight="x_imp_30d",
        config=learned.LearnedCrossConfig(dim=4, steps=300),
    )

    assert got["pairs"] == 3600 and got["nodes"] == [300, 12]
    assert got["learned"]["spearman"] > 0.75
    assert got["learned"]["spearman"] > got["additive"]["spearman"] + 0.2
    assert got["learned"]["rmse"] < got["additive"]["rmse"]
    assert got["storage_saving"] == pytest.approx(1 - 312 * (8 + 4 * 5) / (3600 * 20))


def partition(day: int, frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(event_timestamp=pd.Timestamp(f"2026-11-{day:02d}", tz="UTC"))


def test_rare_pairs_are_judged_against_their_later_value() -> None:
    rng = np.random.default_rng(5)
    users, categories = rng.normal(size=(60, 2)), rng.normal(size=(6, 2))
    user, category = (g.ravel() for g in np.meshgrid(np.arange(60), np.arange(6), indexing="ij"))
    rate = 1 / (1 + np.exp(1.0 - 2.0 * (users[user] * categories[category]).sum(-1)))
    rare = rng.random(user.size) < 0.3
    # Rare pairs: one impression, so their own smoothed CTR is a coin flip around the truth.
    clicks = (rng.random(user.size) < rate).astype(float)
    keys = {"user_id": user, "item_category": [f"c{c}" for c in category]}
    before = pd.DataFrame(
        {
            **keys,
            "x_imp_30d": np.where(rare, 1, 40),
            "x_ctr_30d": np.where(rare, (clicks + 0.2) / 2.0, rate),
            "x_imp_7d": 1,  # the same names as the later window's: not read from here
            "x_ctr_7d": 0.5,
        }
    )
    after = pd.DataFrame({**keys, "x_imp_7d": 5, "x_ctr_7d": rate})
    config = learned.LearnedCrossConfig(dim=2, steps=150)

    with torch_threads(1):  # tiny tensors: more threads only contend for the 2 cores
        got = learned.rare_pair_scores(
            partition(15, before),
            partition(22, after),
            pair="x",
            keys=("user_id", "item_category"),
            config=config,
        )

    assert got["rare_pairs"] == rare.sum() and got["fitted_pairs"] == user.size
    assert got["learned_cross_rare_pair_spearman"] > 0.7
    assert got["learned_cross_rare_pair_spearman"] > got["additive_rare_pair_spearman"] + 0.2
    assert got["learned_cross_rare_pair_spearman"] > got["explicit_rare_pair_spearman"]
    # One impression against a prior of one: half the coin flip, half the learned value.
    assert got["blend_prior_impressions"] == 1.0
    assert got["blend_rare_pair_spearman"] > got["explicit_rare_pair_spearman"] + 0.1
    with pytest.raises(ValueError, match="overlaps the fitted window"):
        learned.rare_pair_scores(
            partition(15, before),
            partition(18, after),
            pair="x",
            keys=("user_id", "item_category"),
            config=config,
        )


def test_blend_weights_the_explicit_ctr_by_its_impressions() -> None:
    explicit, learned_ctr = np.array([0.9, 0.9, 0.9]), np.array([0.1, 0.1, 0.1])
    got = learned.blend(explicit, learned_ctr, np.array([0.0, 1.0, 3.0]), prior=1.0)
    np.testing.assert_allclose(got, [0.1, 0.5, 0.7])
    frame = pd.DataFrame(
        {"user_id": [1], "item_category": ["a"], "x_imp_30d": [1], "x_ctr_30d": [0.5]}
    )
    with pytest.raises(ValueError, match="blend_prior must be > 0"):
        learned.rare_pair_scores(
            frame,
            frame.rename(columns={"x_imp_30d": "x_imp_7d", "x_ctr_30d": "x_ctr_7d"}),
            pair="x",
            keys=("user_id", "item_category"),
            blend_prior=0.0,
        )


def test_learned_pair_ctr_scores_unseen_pairs_of_known_nodes_and_not_unknown_nodes() -> None:
    from jobs.ctr_learned_cross import LearnedCrossConfig, learned_pair_ctr

    rng = np.random.default_rng(0)
    users, cats = np.arange(40), np.array(["a", "b", "c"])
    rows = [(u, c) for u in users for j, c in enumerate(cats) if (u + j) % 5]  # some never seen
    part = pd.DataFrame(rows, columns=["user_id", "item_category"])
    part["user_cat_imp_30d"] = rng.integers(1, 20, len(part)).astype(float)
    part["user_cat_ctr_30d"] = np.where(part.item_category == "a", 0.3, 0.05)

    predict, facts = learned_pair_ctr(
        part,
        pair="user_cat",
        keys=("user_id", "item_category"),
        config=LearnedCrossConfig(steps=60),
    )

    unseen = pd.DataFrame({"user_id": [5, 4, 999], "item_category": ["a", "b", "a"]})
    assert not set(map(tuple, unseen.to_numpy()[:2])) & set(rows)
    got = predict(unseen)
    assert facts["nodes"] == [40, 3] and np.isfinite(got[:2]).all() and np.isnan(got[2])
    assert got[0] > got[1]  # genre a clicks more for everyone
    with pytest.raises(ValueError, match="lacks columns"):
        learned_pair_ctr(part, pair="user_cat", keys=("user_id", "item_category"), window=7)
