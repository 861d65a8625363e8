"""CTR feature views and the versioned feature service of the pre-ranking model.

Feature names and keys follow ``cascade.ctr_schema``. A snapshot row's ``event_timestamp``
is the time it was computed at, from impressions strictly before it, so Feast's point-in-time
join (latest row with ``event_timestamp <= impression time``) never leaks the label.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from common.entities import genre, item, user
from common.sources import item_source, user_genre_source, user_source
from feast import FeatureService, FeatureView, Field
from feast.data_source import DataSource
from feast.types import Float64, Int64, String

from cascade.ctr_schema import ITEM_GENRE

# Feast reads a ttl of 0 as "never expires". The counts are cumulative, so an old snapshot
# stays the right answer until a newer one replaces it; a finite ttl would also have to span
# the 28 years between the 1997-98 data and today's online reads.
NO_EXPIRY = timedelta(0)

SERVICE_VERSION = 1
"""Bump with a new ``preranking_v<N>`` service whenever the feature list changes."""


def ctr_feature_views(
    sources: Mapping[str, DataSource],
) -> tuple[FeatureView, FeatureView, FeatureView]:
    """user_stats, item_stats and user_genre_stats over the given lake-view sources."""
    user_stats = FeatureView(
        name="user_stats",
        entities=[user],
        ttl=NO_EXPIRY,
        schema=[
            Field(name="user_impressions", dtype=Int64),
            Field(name="user_clicks", dtype=Int64),
            Field(name="user_ctr", dtype=Float64),
            Field(name="user_age", dtype=Int64),
        ],
        source=sources["user"],
        online=True,
        description="Cumulative impressions, clicks and CTR per user, plus age.",
    )
    item_stats = FeatureView(
        name="item_stats",
        entities=[item],
        ttl=NO_EXPIRY,
        schema=[
            Field(name="item_impressions", dtype=Int64),
            Field(name="item_clicks", dtype=Int64),
            Field(name="item_ctr", dtype=Float64),
            Field(name="item_release_year", dtype=Int64),
            Field(name=ITEM_GENRE, dtype=String),
        ],
        source=sources["item"],
        online=True,
        description="Cumulative impressions, clicks and CTR per item, release year, genre.",
    )
    user_genre_stats = FeatureView(
        name="user_genre_stats",
        entities=[user, genre],
        ttl=NO_EXPIRY,
        schema=[
            Field(name="ug_impressions", dtype=Int64),
            Field(name="ug_clicks", dtype=Int64),
            Field(name="ug_ctr", dtype=Float64),
        ],
        source=sources["user_genre"],
        online=True,
        description="Cumulative impressions, clicks and CTR per user and genre.",
    )
    return user_stats, item_stats, user_genre_stats


def preranking_service(views: tuple[FeatureView, FeatureView, FeatureView]) -> FeatureService:
    """The ``preranking_v1`` service: every feature of the three CTR views."""
    return FeatureService(
        name=f"preranking_v{SERVICE_VERSION}",
        features=list(views),
        tags={"model": "preranking", "version": str(SERVICE_VERSION)},
        description="Dense CTR features of the pre-ranking model (cascade.ctr_schema).",
    )


user_stats, item_stats, user_genre_stats = ctr_feature_views(
    {"user": user_source, "item": item_source, "user_genre": user_genre_source}
)
preranking_v1 = preranking_service((user_stats, item_stats, user_genre_stats))
