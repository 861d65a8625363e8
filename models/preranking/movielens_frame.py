"""MovieLens-100k as a pre-ranking training frame, built in pandas with point-in-time features.

The pre-ranking pipeline trains on the cross-statistics engine's training set
(:mod:`jobs.ctr_training_set`); this builds the default field set's MovieLens-shaped columns
directly from the RecBole files for the FSCD cascade's ``ml100k`` config (``cascade bench
preranking``): experiments and benchmarks that must not need Spark or a materialized store.
Every count is taken strictly before the impression's timestamp (ratings in the same second are
not visible to each other), so no row sees its own label. Clicks are ratings >= 4; CTRs are
Bayesian-smoothed toward the click rate of the earliest half of the log (never the test
period)::

    python -c "from models.preranking.movielens_frame import movielens_training_frame as f; \
print(f().describe().T)"
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

from domains.ctr.schema import LABEL, MODEL_FEATURES, TIMESTAMP

CLICK_MIN_RATING = 4.0
PRIOR_STRENGTH = 20.0
"""Pseudo-impressions of the smoothing prior (as in the Spark job's default)."""


def movielens_dir() -> Path:
    """The ml-100k folder of the installed ``recbole`` package, found without importing it."""
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "MovieLens-100k comes from the recbole package: run "
            "`.venv/bin/pip install --no-deps recbole` (infra/install.sh does)"
        )
    return Path(spec.submodule_search_locations[0]) / "dataset_example" / "ml-100k"


def _read_atomic(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    frame.columns = [c.split(":", 1)[0] for c in frame.columns]
    return frame


def prior_counts(frame: pd.DataFrame, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(impressions, clicks)`` of each row's key strictly before the row's timestamp."""
    grouped = (
        frame.groupby([*keys, TIMESTAMP], sort=True)[LABEL]
        .agg(["size", "sum"])
        .rename(columns={"size": "n", "sum": "c"})
    )
    cumulative = grouped.groupby(level=list(range(len(keys)))).cumsum()
    before = (cumulative - grouped).rename(columns={"n": "imp", "c": "clk"})
    joined = frame[[*keys, TIMESTAMP]].merge(
        before.reset_index(), on=[*keys, TIMESTAMP], how="left", validate="many_to_one"
    )
    return joined["imp"].to_numpy(np.float64), joined["clk"].to_numpy(np.float64)


def movielens_training_frame(root: Path | None = None) -> pd.DataFrame:
    """The 100k ratings as labelled impressions with the training-set columns."""
    root = root or movielens_dir()
    inter = _read_atomic(root / "ml-100k.inter")
    users = _read_atomic(root / "ml-100k.user")
    items = _read_atomic(root / "ml-100k.item")
    frame = pd.DataFrame(
        {
            "user_id": inter["user_id"].astype(np.int64),
            "item_id": inter["item_id"].astype(np.int64),
            TIMESTAMP: pd.to_datetime(inter["timestamp"].astype(float), unit="s", utc=True),
            LABEL: (inter["rating"].astype(float) >= CLICK_MIN_RATING).astype(np.int64),
        }
    )
    frame[TIMESTAMP] = frame[TIMESTAMP].astype("datetime64[us, UTC]")
    age = pd.Series(
        pd.to_numeric(users["age"], errors="coerce").to_numpy(),
        index=users["user_id"].astype(np.int64),
    )
    item_index = items["item_id"].astype(np.int64)
    year = pd.Series(
        pd.to_numeric(items["release_year"], errors="coerce").to_numpy(), index=item_index
    )
    genre = pd.Series(
        items["class"].str.split(" ").str[0].replace("", "unknown").to_numpy(), index=item_index
    )
    frame["genre"] = genre.reindex(frame["item_id"]).fillna("unknown").to_numpy()
    frame = frame.sort_values(TIMESTAMP, kind="stable").reset_index(drop=True)
    prior_rate = float(frame[LABEL].iloc[: len(frame) // 2].mean())

    def smoothed(clicks: np.ndarray, impressions: np.ndarray) -> np.ndarray:
        return (clicks + PRIOR_STRENGTH * prior_rate) / (impressions + PRIOR_STRENGTH)

    features: dict[str, np.ndarray] = {}
    for prefix, keys in (
        ("user", ["user_id"]),
        ("item", ["item_id"]),
        ("ug", ["user_id", "genre"]),
    ):
        imp, clk = prior_counts(frame, keys)
        features[f"{prefix}_impressions"] = imp
        features[f"{prefix}_clicks"] = clk
        features[f"{prefix}_ctr"] = smoothed(clk, imp)
    features["user_age"] = age.reindex(frame["user_id"]).to_numpy(np.float64)
    features["item_release_year"] = year.reindex(frame["item_id"]).to_numpy(np.float64)
    ordered = {name: features[name] for name in MODEL_FEATURES}
    return pd.concat(
        [frame[["user_id", "item_id", "genre", TIMESTAMP, LABEL]], pd.DataFrame(ordered)], axis=1
    )
