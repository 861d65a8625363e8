"""The dense PreRanker's configs (the compile benchmark's first network): names, validation,
JSON round trip."""

from __future__ import annotations

import dataclasses
import json

import pytest

from models.preranking.config_registry import (
    CONFIGS,
    TrainConfig,
    get_config,
    preranking_debug,
    preranking_ml100k,
)
from models.preranking.model import PreRankerConfig


def test_named_configs_are_complete_and_fresh() -> None:
    assert set(CONFIGS) == {"debug", "ml100k"}
    debug, ml100k = get_config("debug"), get_config("ml100k")
    assert (debug.name, ml100k.name) == ("debug", "ml100k")
    assert debug == preranking_debug() and ml100k == preranking_ml100k()
    assert ml100k.batch_size >= debug.batch_size
    # Each call builds a new object: a caller's change must not leak into the next run.
    debug.lr = 1.0
    assert get_config("debug").lr != 1.0


def test_unknown_config_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown pre-ranking config 'large'.*'debug', 'ml100k'"):
        get_config("large")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("batch_size", 0, "batch_size"),
        ("lr", 0.0, "lr"),
        ("epochs", 0, "epochs"),
        ("max_steps", 0, "max_steps"),
        ("test_fraction", 0.0, "test_fraction"),
        ("test_fraction", 1.0, "test_fraction"),
        ("zero_stage", 4, "zero_stage"),
        ("log_every", 0, "log_every"),
        ("weight_decay", -1.0, "weight_decay"),
        ("seed", -1, "seed"),
        ("name", "", "name"),
    ],
)
def test_invalid_fields_are_rejected(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(preranking_debug(), **{field: value})


def test_model_must_be_a_preranker_config() -> None:
    with pytest.raises(TypeError, match="PreRankerConfig"):
        TrainConfig(name="x", model={"hidden": (8,)})  # type: ignore[arg-type]


def test_json_round_trip_restores_tuples() -> None:
    config = dataclasses.replace(
        preranking_ml100k(), model=PreRankerConfig(hidden=(8, 4)), max_steps=7
    )
    restored = TrainConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert restored == config
    assert restored.model.hidden == (8, 4)
    assert config.flat_params()["model.hidden"] == "(8, 4)"
