"""The FSCD cascade's data: the labelled impressions, split in time into train / validation /
test, encoded by a field encoder fitted on the training rows only.

The fields are data (:func:`resolve_fields`): ``CascadeTrainConfig.fields`` (a JSON path or
inline declarations), else a ``fields.json`` written beside the training parquet by whoever
built the training set, else the default 11 fields."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from domains.ctr.schema import LABEL, TIMESTAMP
from models.preranking.config_registry import CascadeTrainConfig
from models.preranking.fields import FIELDS, FIELDS_FILE, FieldEncoder, FieldSet

ALL_FIELDS = FIELDS.names
"""The default field set's names."""


def resolve_fields(config: CascadeTrainConfig, frame: pd.DataFrame | None = None) -> FieldSet:
    """The field set a run trains on: ``config.fields`` (a JSON file's path, or inline
    declarations extending the default set), else ``fields.json`` beside ``config.data`` when
    it is a file path with one, else :data:`FIELDS`. With ``frame``, every field's column must
    be in it (ValueError naming the missing ones)."""
    if isinstance(config.fields, dict):
        fields = FieldSet.from_declarations(config.fields, frame)
    elif isinstance(config.fields, str):
        fields = FieldSet.load(Path(config.fields), frame)
    else:
        beside = Path(config.data).parent / FIELDS_FILE
        if config.data not in ("synthetic", "ml100k") and beside.is_file():
            fields = FieldSet.load(beside, frame)
        else:
            fields = FIELDS
    if frame is not None:
        fields.require_columns(frame, "the training set")
    return fields


class DegenerateData(ValueError):
    """The training set cannot train or choose a model (see :func:`prepare`)."""


def degenerate_fields(train: pd.DataFrame, fields: FieldSet = FIELDS) -> dict[str, list[str]]:
    """Fields no model can learn from on these rows: ``all_missing`` (no value at all) and
    ``constant`` (the same value on every row; missing counts as a value, so a field that is
    present on some rows and missing on others is not constant)."""
    all_missing = [name for name in fields.names if train[name].isna().all()]
    constant = [
        name
        for name in fields.names
        if name not in all_missing and train[name].nunique(dropna=False) <= 1
    ]
    return {"all_missing": all_missing, "constant": constant}


def load_frame(config: CascadeTrainConfig) -> pd.DataFrame:
    """The labelled impressions named by ``config.data``."""
    if config.data == "synthetic":
        from models.preranking.synthetic_data import synthetic_training_frame

        return synthetic_training_frame(
            config.rows, users=max(50, config.rows // 40), items=max(80, config.rows // 25)
        )
    if config.data == "ml100k":
        from models.preranking.movielens_frame import movielens_training_frame

        return movielens_training_frame()
    from models.preranking.training_set import ROW_COLUMNS, load_training_frame

    # Only the row columns here: the fields (resolve_fields) name and check the others.
    return load_training_frame(Path(config.data), required=ROW_COLUMNS)


@dataclass(frozen=True, kw_only=True)
class EvalSplit:
    """Encoded rows that a model is scored on, never trained on."""

    codes: torch.Tensor
    labels: np.ndarray
    users: np.ndarray
    popularity: np.ndarray
    """Each row's item popularity: the item's clicks in the training rows (0 for an item the
    training rows never showed), the baseline score every model must beat."""

    @classmethod
    def of(cls, frame: pd.DataFrame, encoder: FieldEncoder, item_clicks: pd.Series) -> EvalSplit:
        return cls(
            codes=encoder.encode(frame),
            labels=frame[LABEL].to_numpy(np.int64),
            users=frame["user_id"].to_numpy(np.int64),
            popularity=frame["item_id"].map(item_clicks).fillna(0.0).to_numpy(np.float64),
        )


def item_clicks(train: pd.DataFrame) -> pd.Series:
    """Clicks per item id in the training rows (item popularity)."""
    return train.groupby("item_id")[LABEL].sum().astype(np.float64)


def validation_counts(frame: pd.DataFrame, config: CascadeTrainConfig) -> tuple[int, int]:
    """``(rows, clicks)`` of the validation split :func:`prepare` carves from ``frame`` (the
    rows before the test split, latest ``validation_fraction`` of them)."""
    from models.preranking.training_set import time_split

    period, _ = time_split(frame, config.test_fraction)
    if len(period) < 2:
        raise DegenerateData(
            f"{len(frame)} rows leave {len(period)} before the test split; need at least 2 to "
            "carve a validation split (lower test_fraction or use more data)"
        )
    _, validation = time_split(period, config.validation_fraction)
    return len(validation), int(validation[LABEL].sum())


def check_validation_clicks(rows: int, clicks: int, config: CascadeTrainConfig) -> None:
    """Raise :class:`DegenerateData` (one line) when the validation split has fewer than
    ``min_validation_clicks`` clicks or non-clicks."""
    need = config.min_validation_clicks
    if min(clicks, rows - clicks) < need:
        raise DegenerateData(
            f"the validation split ({config.validation_fraction:g} of the training period) has "
            f"{rows:,} rows with {clicks:,} clicks; FSCD needs at least {need} clicks and "
            f"{need} non-clicks to choose its strength: train on more days or impressions, or "
            f"raise CASCADE_PRERANKING_VALIDATION_FRACTION"
        )


def check_training_set(config: CascadeTrainConfig, data: Path) -> dict[str, int]:
    """Before any training process starts: the validation split of the training parquet
    ``data`` (only its time and label columns are read) has the clicks :func:`prepare` needs,
    else :class:`DegenerateData` in one line. Returns its ``rows`` and ``clicks``."""
    frame = pd.read_parquet(data, columns=[TIMESTAMP, LABEL])
    rows, clicks = validation_counts(frame, config)
    check_validation_clicks(rows, clicks, config)
    return {"validation_rows": rows, "validation_clicks": clicks}


@dataclass(kw_only=True)
class Prepared:
    """Encoded splits and the encoder fitted on the training rows.

    Three splits in time order: the networks train on ``train``; ``validation`` (the end of
    the training period) chooses the FSCD regularizer strength; ``test`` (the latest rows) is
    only reported, so its numbers are an unbiased estimate for the chosen model.
    """

    encoder: FieldEncoder
    """Fitted on the training rows; ``encoder.fields`` is the run's :class:`FieldSet`."""
    train_codes: torch.Tensor
    train_labels: torch.Tensor
    validation: EvalSplit
    test: EvalSplit
    costs: dict[str, float]
    example: pd.DataFrame
    """A few raw test rows (the field columns): the logged model's input example."""
    degenerate: dict[str, list[str]]
    """Fields of :func:`degenerate_fields` on the training rows: never kept by FSCD."""

    @property
    def fields(self) -> FieldSet:
        return self.encoder.fields

    @property
    def unusable(self) -> set[str]:
        return {name for names in self.degenerate.values() for name in names}


def prepare(config: CascadeTrainConfig, frame: pd.DataFrame | None = None) -> Prepared:
    """Time split into train / validation / test, fit the encoder on train only, encode all.

    The encoder sees only the training rows, so ids first seen in the validation period are
    unknown to it exactly as ids first seen in the test period are: validation mimics test.
    """
    from models.preranking.training_set import time_split

    frame = load_frame(config) if frame is None else frame
    fields = resolve_fields(config, frame)
    check_validation_clicks(*validation_counts(frame, config), config)
    period, test = time_split(frame, config.test_fraction)
    train, validation = time_split(period, config.validation_fraction)
    degenerate = degenerate_fields(train, fields)
    unusable = {name for names in degenerate.values() for name in names}
    if unusable >= set(fields.names):
        raise DegenerateData(f"every field is empty or constant on the training rows: {degenerate}")
    if unusable:
        print(f"[cascade] WARNING fields FSCD will not keep: {degenerate}", flush=True)
    encoder = FieldEncoder(fields, bins=config.bins).fit(train)
    popular = item_clicks(train)
    return Prepared(
        encoder=encoder,
        train_codes=encoder.encode(train),
        train_labels=torch.from_numpy(train[LABEL].to_numpy(np.float32)),
        validation=EvalSplit.of(validation, encoder, popular),
        test=EvalSplit.of(test, encoder, popular),
        costs=dict(zip(fields.names, encoder.costs(config.net.embedding_dim), strict=True)),
        example=test[list(fields.names)].head(5).reset_index(drop=True),
        degenerate=degenerate,
    )
