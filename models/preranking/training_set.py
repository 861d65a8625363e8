"""The pre-ranker's training set as the trainer, the register step and the compile step read it:
the partition's parquet (:func:`partition_training_set`, :func:`load_training_frame`), its
time split (:func:`time_split`: the latest rows are the hold-out), a model's AUC and log loss
on rows of it (:func:`evaluate`), and the keys a finished training's ``result.json`` carries
(:data:`RESULT_KEYS`, :func:`read_complete_result`).

The FSCD trainer (:mod:`models.preranking.cascade_train`) takes the set's other columns from its
field set (``fields.json`` beside the parquet), which checks them itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import log_loss, roc_auc_score

from cascade.lake import Lake
from cascade.training import launch as launching
from domains.ctr.schema import LABEL, TIMESTAMP
from models.preranking.fields import FieldEncoder
from models.preranking.inference import score_frame

ROW_COLUMNS = ("user_id", "item_id", TIMESTAMP, LABEL)
"""What every training set needs whatever its fields."""
RESULT_KEYS = ("run_id", "test_auc", "model_uri", "config", "ds")
"""Keys every complete ``result.json`` carries."""


def partition_training_set(lake: Lake, ds: str) -> Path:
    """The partition's training-set parquet, or FileNotFoundError naming the missing task."""
    data = lake.training_set("preranking", ds) / "data.parquet"
    if not data.exists():
        raise FileNotFoundError(
            f"training set {data} does not exist; run the training-set task for ds={ds} first"
        )
    return data


def load_training_frame(path: Path, required: tuple[str, ...] = ROW_COLUMNS) -> pd.DataFrame:
    """Read and check the training parquet (the ``required`` columns, labels, timestamps)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"training set {path} does not exist; build it first (the training-set step of "
            "the ctr_preranking pipeline writes Lake.training_set('preranking', ds)/data.parquet)"
        )
    frame = pd.read_parquet(path)
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ValueError(f"training set {path} lacks columns {missing}; expected {required}")
    labels = set(pd.unique(frame[LABEL]))
    if not labels <= {0, 1}:
        raise ValueError(f"training set {path}: column {LABEL!r} must be 0/1, found {labels}")
    if frame[TIMESTAMP].isna().any():
        raise ValueError(f"training set {path}: {TIMESTAMP!r} has nulls; drop or fix those rows")
    return frame


def time_split(frame: pd.DataFrame, test_fraction: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(train, test)``: test is the latest ``test_fraction`` of rows by event time.

    Ties are broken by row order (stable sort), so the split is deterministic.
    """
    if len(frame) < 2:
        raise ValueError(f"need at least 2 rows for a train/test split, got {len(frame)}")
    ordered = frame.sort_values(TIMESTAMP, kind="stable").reset_index(drop=True)
    n_test = min(len(ordered) - 1, max(1, math.ceil(len(ordered) * test_fraction)))
    return ordered.iloc[: len(ordered) - n_test], ordered.iloc[len(ordered) - n_test :]


def evaluate(
    model: torch.nn.Module, frame: pd.DataFrame, encoder: FieldEncoder | None = None
) -> dict[str, float]:
    """AUC and log loss of ``model`` on ``frame`` (a ColdPreRanker reads it through its
    ``encoder``)."""
    labels = frame[LABEL].to_numpy()
    if len(np.unique(labels)) < 2:
        raise ValueError(
            "the hold-out has a single class, so AUC is undefined; use more data or a larger "
            "test_fraction"
        )
    scores = score_frame(model, frame, encoder)
    return {
        "auc": float(roc_auc_score(labels, scores)),
        "logloss": float(log_loss(labels, np.clip(scores, 1e-7, 1 - 1e-7))),
    }


def read_complete_result(
    path: Path, ds: str | None, keys: Sequence[str] = RESULT_KEYS
) -> dict[str, Any] | None:
    """The training result at ``path`` if complete (every one of ``keys``) and for ``ds``."""
    return launching.read_complete_result(path, ds, keys)
