"""Column contract of the CTR features, shared by the Spark job, Feast, training and serving.

Keys: ``user_id`` (int64), ``item_id`` (int64), ``genre`` (string: the item's primary genre).
Every feature row carries ``event_timestamp`` (the snapshot time, UTC, microseconds): the value
was computed from impressions strictly before it, so a point-in-time join never sees the future.
"""

from __future__ import annotations

USER_FEATURES = ("user_impressions", "user_clicks", "user_ctr", "user_age")
ITEM_FEATURES = ("item_impressions", "item_clicks", "item_ctr", "item_release_year")
USER_GENRE_FEATURES = ("ug_impressions", "ug_clicks", "ug_ctr")

ITEM_GENRE = "item_genre"
"""Item-view string column: the item's primary genre, the join key into the user x genre view."""

MODEL_FEATURES = USER_FEATURES + ITEM_FEATURES + USER_GENRE_FEATURES
"""Dense input columns of the pre-ranking model, in order."""

COUNT_FEATURES = frozenset(
    f for f in MODEL_FEATURES if f.endswith("_impressions") or f.endswith("_clicks")
)
"""Heavy-tailed counts; the model applies log1p to them."""

LABEL = "click"
TIMESTAMP = "event_timestamp"
