"""The with/without-cross arms: which fields each keeps, and the lifts they give (no training)."""

from __future__ import annotations

import pytest

from benchmarks.preranking_cross import (
    ARMS,
    FULL,
    cross_pair_of,
    generator_config,
    lifts,
    pipeline_goals,
    planted,
    servable_crosses,
    without_cross,
    without_cross_same_position,
)
from models.preranking.fields import FieldSet, FieldSpec

FIELDS = FieldSet(
    [
        FieldSpec(name="user_id", kind="user", categorical=True),
        FieldSpec(name="user_ctr_7d", kind="user", categorical=False),
        FieldSpec(name="item_id", kind="item", categorical=True),
        FieldSpec(name="item_ctr_7d", kind="item", categorical=False),
        FieldSpec(name="user_cat_ctr_7d", kind="cross", categorical=False),
        FieldSpec(name="user_cat_learned_ctr_30d", kind="cross", categorical=False),
        FieldSpec(name="seg_cat_ctr_7d", kind="cross", categorical=False),
        FieldSpec(name="seg_item_ctr_7d", kind="cross", categorical=False),
        FieldSpec(name="ctx_item_ctr_7d", kind="cross", categorical=False),
        FieldSpec(name="item_pos_ctr_1d", kind="cross", categorical=False),
        FieldSpec(name="item_pos_ctr_30d", kind="cross", categorical=False),
    ]
)
BASE = ("user_id", "user_ctr_7d", "item_id", "item_ctr_7d")


def test_each_arm_keeps_the_ids_and_own_statistics_and_only_its_crosses() -> None:
    assert without_cross(FIELDS).names == BASE
    # Position stays in the "without" arm of the same-position lift: only crosses differ.
    assert without_cross_same_position(FIELDS).names == (
        *BASE,
        "item_pos_ctr_1d",
        "item_pos_ctr_30d",
    )
    # The server keys user, item and genre: user x genre only, the learned field included.
    assert servable_crosses(FIELDS).names == (
        *BASE,
        "user_cat_ctr_7d",
        "user_cat_learned_ctr_30d",
    )
    assert set(ARMS) == {
        "with_cross",
        "without_cross",
        "without_cross_same_position",
        "servable_cross",
    }
    assert cross_pair_of("user_cat_ctr_7d").name == "user_cat"  # not the one-key user pair
    with pytest.raises(ValueError, match="names no pair of the engine"):
        cross_pair_of("mystery_ctr_7d")


def test_lifts_and_pipeline_goals_from_one_seed_s_arms() -> None:
    got = lifts(
        {
            "with_cross": 0.73,
            "without_cross": 0.61,
            "without_cross_same_position": 0.70,
            "servable_cross": 0.64,
        }
    )
    assert got == pytest.approx(
        {"cross_lift": 0.12, "cross_lift_same_position": 0.03, "cross_lift_servable": 0.03}
    )
    assert pipeline_goals(0.98, 0.5) and not pipeline_goals(0.89, 0.3)
    assert not pipeline_goals(0.99, 0.51)


def test_the_planted_effects_are_the_generator_s() -> None:
    effects = planted(generator_config(FULL))
    assert any("position^-0.7" in line for line in effects)
    assert any(line.startswith("user x genre: rank-4") for line in effects)
