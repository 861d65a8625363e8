"""The pre-ranker's training set: the synthetic frame's contract, the time split, the reader's
checks, and the FSCD trainer reading only the row columns (the rest from ``fields.json``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cascade.lake import Lake
from domains.ctr.schema import LABEL, MODEL_FEATURES, TIMESTAMP
from models.preranking.config_registry import get_cascade_config
from models.preranking.fscd_data import load_frame, prepare
from models.preranking.synthetic_data import synthetic_training_frame
from models.preranking.training_set import (
    load_training_frame,
    partition_training_set,
    time_split,
)


def test_synthetic_frame_follows_the_training_contract() -> None:
    frame = synthetic_training_frame(2_000, seed=3)
    assert list(frame.columns[:5]) == ["user_id", "item_id", "genre", TIMESTAMP, LABEL]
    assert tuple(frame.columns[5:]) == MODEL_FEATURES
    assert frame["user_id"].dtype == np.int64 and frame[LABEL].isin([0, 1]).all()
    assert str(frame[TIMESTAMP].dtype) == "datetime64[us, UTC]"
    assert 0.3 < frame[LABEL].mean() < 0.8
    assert frame["ug_ctr"].isna().any() and not frame["user_ctr"].isna().any()
    # Deterministic for a seed, different across seeds.
    pd.testing.assert_frame_equal(frame, synthetic_training_frame(2_000, seed=3))
    assert not frame[LABEL].equals(synthetic_training_frame(2_000, seed=4)[LABEL])


def test_time_split_holds_out_the_latest_rows() -> None:
    frame = synthetic_training_frame(1_001, seed=1).sample(frac=1.0, random_state=0)
    train, test = time_split(frame, 0.2)
    assert len(test) == 201 and len(train) == 800
    assert train[TIMESTAMP].max() <= test[TIMESTAMP].min()
    assert sorted(train.index.tolist() + test.index.tolist()) == list(range(1_001))
    again_train, _ = time_split(frame, 0.2)
    pd.testing.assert_frame_equal(train, again_train)
    with pytest.raises(ValueError, match="at least 2 rows"):
        time_split(frame.head(1), 0.5)


def test_load_training_frame_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="training set .* does not exist"):
        load_training_frame(tmp_path / "missing.parquet")
    with pytest.raises(FileNotFoundError, match="run the training-set task for ds=2026-01-31"):
        partition_training_set(Lake(tmp_path), "2026-01-31")
    frame = synthetic_training_frame(50)
    frame.drop(columns=[LABEL]).to_parquet(tmp_path / "no_label.parquet")
    with pytest.raises(ValueError, match=r"lacks columns \['click'\]"):
        load_training_frame(tmp_path / "no_label.parquet")
    frame.assign(click=frame[LABEL] * 2).to_parquet(tmp_path / "bad_label.parquet")
    with pytest.raises(ValueError, match="must be 0/1"):
        load_training_frame(tmp_path / "bad_label.parquet")
    frame.to_parquet(tmp_path / "good.parquet")
    assert len(load_training_frame(tmp_path / "good.parquet")) == 50


def test_fscd_reads_only_the_row_columns_and_takes_the_rest_from_fields_json(
    tmp_path: Path,
) -> None:
    rows = synthetic_training_frame(600)
    engine_built = rows[["user_id", "item_id", "genre", "event_timestamp", LABEL]].assign(
        user_cat_ctr_7d=rows["user_ctr"] * 0.5
    )
    engine_built.to_parquet(tmp_path / "data.parquet")
    fields = [
        {"name": "user_id", "kind": "user", "categorical": True},
        {"name": "item_id", "kind": "item", "categorical": True},
        {"name": "genre", "kind": "item", "categorical": True},
        {"name": "user_cat_ctr_7d", "kind": "cross", "categorical": False, "window_days": 7},
    ]
    (tmp_path / "fields.json").write_text(json.dumps({"version": 1, "fields": fields}))
    config = dataclasses.replace(
        get_cascade_config("debug"), data=str(tmp_path / "data.parquet"), min_validation_clicks=1
    )

    assert "item_ctr" not in load_frame(config).columns  # no MovieLens-shaped column required
    prepared = prepare(config)
    assert prepared.fields.names == ("user_id", "item_id", "genre", "user_cat_ctr_7d")
    assert prepared.train_codes.shape[1] == 4
    with pytest.raises(ValueError, match=r"lacks columns \['click'\]"):
        engine_built.drop(columns=LABEL).to_parquet(tmp_path / "data.parquet")
        load_frame(config)
