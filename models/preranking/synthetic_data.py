"""Synthetic pre-ranking training frames with a known, learnable click signal.

The frame follows the training-set contract (``user_id``, ``item_id``, ``genre``,
``event_timestamp``, ``click``, then :data:`domains.ctr.schema.MODEL_FEATURES`), so tests and
benchmarks can train at any scale without the feature pipeline. Clicks are drawn from
``sigmoid(user propensity + item quality + user x genre affinity)``; the CTR features are noisy
estimates of those three terms, so a model that reads them beats AUC 0.5 by a wide margin.

Write one for a manual run with::

    python -c "from models.preranking.synthetic_data import synthetic_training_frame as f; \
f(50_000).to_parquet('/tmp/preranking.parquet')"
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from domains.ctr.schema import LABEL, MODEL_FEATURES, TIMESTAMP

GENRES = ("Action", "Comedy", "Drama", "Horror", "Romance", "Sci-Fi", "Thriller")


def _observed_ctr(
    rng: np.random.Generator, logit: np.ndarray, mean_impressions: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Impressions, clicks and CTR as a feature pipeline would count them from a history."""
    impressions = rng.poisson(mean_impressions, size=logit.shape).astype(np.float64) + 1.0
    clicks = rng.binomial(impressions.astype(np.int64), 1.0 / (1.0 + np.exp(-logit)))
    return impressions, clicks.astype(np.float64), clicks / impressions


def synthetic_training_frame(
    rows: int,
    *,
    users: int = 500,
    items: int = 800,
    seed: int = 0,
    end: str = "2026-01-31",
    days: int = 30,
    missing_fraction: float = 0.05,
) -> pd.DataFrame:
    """``rows`` labelled impressions over ``days`` days ending at ``end`` (UTC).

    ``missing_fraction`` of the user x genre features are NaN, as for a cold-start pair.
    """
    if rows < 1 or users < 1 or items < 1 or days < 1:
        raise ValueError("rows, users, items and days must be >= 1")
    rng = np.random.default_rng(seed)
    user_propensity = rng.normal(0.0, 1.0, users)
    item_quality = rng.normal(0.0, 1.0, items)
    item_genre = rng.integers(0, len(GENRES), items)
    affinity = rng.normal(0.0, 0.7, (users, len(GENRES)))

    user = rng.integers(0, users, rows)
    item = rng.integers(0, items, rows)
    genre = item_genre[item]
    logit = 0.2 + user_propensity[user] + item_quality[item] + affinity[user, genre]
    click = rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))

    u_imp, u_clk, u_ctr = _observed_ctr(rng, user_propensity[user], 30.0)
    i_imp, i_clk, i_ctr = _observed_ctr(rng, item_quality[item], 40.0)
    g_imp, g_clk, g_ctr = _observed_ctr(rng, affinity[user, genre], 8.0)
    missing = rng.random(rows) < missing_fraction
    for column in (g_imp, g_clk, g_ctr):
        column[missing] = np.nan

    end_ts = pd.Timestamp(end, tz="UTC")
    offsets = rng.integers(0, days * 86_400, rows)
    timestamps = end_ts - pd.to_timedelta(offsets, unit="s")
    features = {
        "user_impressions": u_imp,
        "user_clicks": u_clk,
        "user_ctr": u_ctr,
        "user_age": rng.integers(18, 70, users)[user].astype(np.float64),
        "item_impressions": i_imp,
        "item_clicks": i_clk,
        "item_ctr": i_ctr,
        "item_release_year": rng.integers(1950, 2000, items)[item].astype(np.float64),
        "ug_impressions": g_imp,
        "ug_clicks": g_clk,
        "ug_ctr": g_ctr,
    }
    if tuple(features) != MODEL_FEATURES:
        raise RuntimeError("synthetic features are out of step with domains.ctr.schema")
    frame = pd.DataFrame(
        {
            "user_id": (user + 1).astype(np.int64),
            "item_id": (item + 1).astype(np.int64),
            "genre": np.asarray(GENRES, dtype=object)[genre],
            # Microseconds: Spark and Feast cannot read nanosecond parquet timestamps.
            TIMESTAMP: pd.DatetimeIndex(timestamps).as_unit("us"),
            LABEL: click.astype(np.int64),
            **features,
        }
    )
    return frame.sort_values(TIMESTAMP, kind="stable").reset_index(drop=True)
