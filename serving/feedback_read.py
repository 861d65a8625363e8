"""The monitor's read path of the serving feedback (:mod:`serving.feedback_rows` has the
layout): a day's scored candidates joined back with their request's features, their item
snapshot's features and their clicks, and the training set the model learned from.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from cascade.config import Settings, load_settings
from serving.feedback_rows import (
    ITEM_SNAPSHOT,
    JOINED_COLUMNS,
    MODEL,
    feedback_dir,
    item_snapshot_path,
    snapshot_digest,
)

log = logging.getLogger(__name__)


def _read_folder(folder: Path) -> pd.DataFrame:
    parts = sorted(folder.glob("part-*.parquet"))
    if not parts:
        return pd.DataFrame()
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def with_item_features(scored: pd.DataFrame, root: Path) -> pd.DataFrame:
    """``scored`` (feedback rows) with the item features of the snapshot each row names
    (``item_snapshot``) joined on ``item_id``, in row order; rows of a snapshot that is not
    in the lake keep NaN features (logged); a snapshot whose content does not hash to its name
    is refused (ValueError). Rows without the column are returned as they are."""
    if ITEM_SNAPSHOT not in scored.columns or scored.empty:
        return scored
    tables = []
    for digest in scored[ITEM_SNAPSHOT].dropna().unique():
        path = item_snapshot_path(root, str(digest))
        if not path.is_file():
            log.warning("item snapshot %s is missing: its rows have no item features", path)
            continue
        table = pd.read_parquet(path)
        if "item_id" not in table or snapshot_digest(
            table["item_id"].to_numpy(), {c: table[c].to_numpy() for c in table if c != "item_id"}
        ) != str(digest):
            raise ValueError(f"item snapshot {path} does not hash to its name: not loaded")
        tables.append(table.assign(**{ITEM_SNAPSHOT: str(digest)}))
    if not tables:
        return scored
    items = pd.concat(tables, ignore_index=True)
    clash = sorted(set(items.columns) & set(scored.columns) - {ITEM_SNAPSHOT, "item_id"})
    if clash:
        raise ValueError(f"item snapshot columns {clash} are also feedback columns")
    joined = scored.merge(items, on=[ITEM_SNAPSHOT, "item_id"], how="left", validate="many_to_one")
    for name in items.columns:
        if joined[name].dtype == object:  # strings: None where unknown, as a logged column reads
            joined[name] = joined[name].astype(object).where(joined[name].notna(), None)
    return joined


def with_request_features(scored: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """``scored`` (feedback rows) with the columns of their request row (``requests``: the
    day's ``feedback_requests`` rows: ts, user, versions, item snapshot and the request's
    features) joined on ``request_id``, in :data:`JOINED_COLUMNS` order then the rest. A
    request written twice (a retried write) counts once; where a row already has the column (a
    part of the earlier layout logged it per candidate) its own value wins."""
    if requests.empty or scored.empty:
        return scored
    columns = [c for c in requests.columns if c not in ("request_id", "candidates")]
    if not columns:
        return scored
    one = requests.drop_duplicates("request_id", keep="last")[["request_id", *columns]]
    joined = scored.merge(
        one.rename(columns={c: f"__request_{c}" for c in columns}),
        on="request_id",
        how="left",
        validate="many_to_one",
    )
    for name in columns:
        value = joined.pop(f"__request_{name}")
        joined[name] = joined[name].where(joined[name].notna(), value) if name in joined else value
    lead = [c for c in JOINED_COLUMNS if c in joined.columns]
    return joined[[*lead, *(c for c in joined.columns if c not in lead)]]


def load_joined_feedback(ds: str, *, settings: Settings | None = None) -> pd.DataFrame:
    """Scored candidates of day ``ds`` with their request's features
    (:func:`with_request_features`), their item features (:func:`with_item_features`) and
    their click (0 when none was reported)."""
    settings = settings or load_settings()
    scored = _read_folder(feedback_dir(settings.lake_root, "feedback", ds))
    if scored.empty:
        return scored
    requests = _read_folder(feedback_dir(settings.lake_root, "feedback_requests", ds))
    scored = with_request_features(scored, requests)
    scored = with_item_features(scored, settings.lake_root)
    clicks = _read_folder(feedback_dir(settings.lake_root, "clicks", ds))
    if clicks.empty:
        scored["click"] = 0
        return scored
    clicks = clicks.groupby(["request_id", "item_id"], as_index=False)["click"].max()
    joined = scored.merge(clicks, on=["request_id", "item_id"], how="left")
    joined["click"] = joined["click"].fillna(0).astype(int)
    return joined


def load_reference(*, settings: Settings | None = None) -> pd.DataFrame:
    """The newest training set of the model: the distribution the champion learned from, with
    its field declarations (``fields.json`` beside it) in ``attrs["fields"]``."""
    settings = settings or load_settings()
    root = settings.lake_root / "training" / MODEL
    partitions = sorted(root.glob("dt=*"))
    if not partitions:
        raise FileNotFoundError(
            f"no training set under {root}; run `cascade step training_set --ds DS` first"
        )
    # The set's parquet file; its folder also holds the field declarations and provenance.
    data = partitions[-1] / "data.parquet"
    frame = pd.read_parquet(data if data.is_file() else partitions[-1])
    declared = partitions[-1] / "fields.json"
    if declared.is_file():  # which fields are numbers: what the monitor compares by PSI
        fields = json.loads(declared.read_text()).get("fields")
        if not isinstance(fields, list):
            raise ValueError(f"{declared}: 'fields' must be a list of field declarations")
        frame.attrs["fields"] = fields
    return frame
