"""Feast views of the explicit cross statistics (``jobs.ctr_cross_stats``), keyed by pairs.

Each configured pair of the job becomes one feature view whose entities are the pair's key
columns: one for the user's and the item's own statistics (``cross_user``, ``cross_item``), two
for a cross (a composite key: user x item_category, item x position, ...). A view's source is the
pair's whole folder ``<lake>/features/ctr_cross/<source>/<pair>/``: every ``dt=<ds>``
partition holds statistics of windows that END at ``ds`` (not cumulative snapshots) and
carries ``event_timestamp = ds`` midnight, so partitions never share a timestamp, and Feast's
point-in-time join (newest row with ``event_timestamp <= t``) picks for an impression at ``t``
the partition computed from data strictly before ``t``'s day start.

The versioned service ``ctr_cross_v<N>`` bundles every pair view; bump
:data:`CROSS_SERVICE_VERSION` with a new service when the feature list changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.data_format import ParquetFormat
from feast.data_source import DataSource
from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import SparkSource
from feast.types import Float64, Int64

from cascade.config import Settings, load_settings
from cascade.lake import Lake
from domains.ctr.online_packed import LAYOUT_TAG, PACKED
from domains.ctr.schema import TIMESTAMP
from features.common.entities import item, user

CROSS_SERVICE_VERSION = 2
CROSS_FEATURE_SERVICE = f"ctr_cross_v{CROSS_SERVICE_VERSION}"
"""The service that bundles every pair view."""
CROSS_SOURCE = "generated"
"""The log source whose cross statistics the module-level views (``feast apply``) read."""
WINDOWS_DAYS = (1, 7, 30)
"""The job's default windows; a view's schema lists these columns."""
ONLINE_LAYOUT = PACKED
"""How the online store keeps the pair views: ``packed`` (one row per key, see
:mod:`domains.ctr.online_packed`; a store that is not packed ignores the tag) or ``feast``
(Feast's row per key and feature)."""
STALE_AFTER = timedelta(days=2)
"""A cross row describes the windows ending at its ds: after two days without a newer
partition it is stale, and serving no value is better than a week-old 1-day CTR."""

user_segment = Entity(
    name="user_segment",
    join_keys=["user_segment"],
    value_type=ValueType.STRING,
    description="A user's segment (age band on ML-100k, a hashed segment in generated logs).",
)
item_category = Entity(
    name="item_category",
    join_keys=["item_category"],
    value_type=ValueType.STRING,
    description="An item's category (primary genre on ML-100k).",
)
context = Entity(
    name="context",
    join_keys=["context"],
    value_type=ValueType.STRING,
    description="The request context (query, surface) an impression was served in.",
)
position = Entity(
    name="position",
    join_keys=["position"],
    value_type=ValueType.INT32,
    description="The slot an item was shown in (1 = top).",
)

PAIRS: dict[str, tuple[Entity, ...]] = {
    "user": (user,),
    "item": (item,),
    "seg_cat": (user_segment, item_category),
    "user_cat": (user, item_category),
    "seg_item": (user_segment, item),
    "ctx_item": (context, item),
    "item_pos": (item, position),
}
"""Pair name of ``jobs.ctr_cross_stats`` -> its entities (join keys = the pair's keys): the
user's and the item's own statistics, then the two-key crosses."""


def cross_root(lake: Lake, source: str, pair: str) -> str:
    """The pair's folder of every ``dt=`` partition (same layout as ``CrossLake.pair_root``)."""
    return str(lake.root / "features" / "ctr_cross" / source / pair)


def cross_source(pair: str, *, settings: Settings, source: str = CROSS_SOURCE) -> DataSource:
    """The batch source of one pair view (file source locally, Spark source on a cluster)."""
    path = cross_root(Lake(settings.lake_root), source, pair)
    name = f"ctr_cross_{source}_{pair}"
    if settings.profile == "cluster":
        return SparkSource(name=name, path=path, file_format="parquet", timestamp_field=TIMESTAMP)
    return FileSource(name=name, path=path, file_format=ParquetFormat(), timestamp_field=TIMESTAMP)


def cross_fields(pair: str) -> list[Field]:
    """The feature columns of one pair, as ``jobs.ctr_cross_stats.feature_columns`` writes."""
    fields: list[Field] = []
    for w in WINDOWS_DAYS:
        fields += [
            Field(name=f"{pair}_imp_{w}d", dtype=Int64),
            Field(name=f"{pair}_clk_{w}d", dtype=Int64),
            Field(name=f"{pair}_ctr_{w}d", dtype=Float64),
            Field(name=f"{pair}_dctr_{w}d", dtype=Float64),
        ]
    return [
        *fields,
        Field(name=f"{pair}_days_since_imp", dtype=Float64),
        Field(name=f"{pair}_days_since_click", dtype=Float64),
        Field(name=f"{pair}_decay_ctr", dtype=Float64),
    ]


def cross_feature_views(sources: Mapping[str, DataSource]) -> list[FeatureView]:
    """One view per pair in ``sources`` (pair name -> source), named ``cross_<pair>``."""
    return [
        FeatureView(
            name=f"cross_{pair}",
            entities=list(PAIRS[pair]),
            ttl=STALE_AFTER,
            schema=cross_fields(pair),
            source=source,
            online=True,
            tags={LAYOUT_TAG: ONLINE_LAYOUT},
            description=f"{'Cross statistics' if len(PAIRS[pair]) > 1 else 'Statistics'} of "
            f"{' x '.join(e.name for e in PAIRS[pair])} over "
            f"{', '.join(f'{w}d' for w in WINDOWS_DAYS)} windows ending at the partition date.",
        )
        for pair, source in sources.items()
    ]


def cross_service(views: list[FeatureView]) -> FeatureService:
    """The ``ctr_cross_v<N>`` service: every feature of the given pair views."""
    return FeatureService(
        name=CROSS_FEATURE_SERVICE,
        features=list(views),
        tags={"domain": "ctr_cross", "version": str(CROSS_SERVICE_VERSION)},
        description="Explicit cross statistics (jobs.ctr_cross_stats) with composite keys.",
    )


def repo_objects(*, settings: Settings, source: str = CROSS_SOURCE) -> list[Any]:
    """Every object of this repo with sources over the pair folders of the log ``source``: the
    entities, one view per pair and the service (what ``feast apply`` finds for
    :data:`CROSS_SOURCE`)."""
    views = cross_feature_views(
        {pair: cross_source(pair, settings=settings, source=source) for pair in PAIRS}
    )
    entities = [user, item, user_segment, item_category, context, position]
    return [*entities, *views, cross_service(views)]


_settings = load_settings()
_views = cross_feature_views({pair: cross_source(pair, settings=_settings) for pair in PAIRS})
(
    cross_user,
    cross_item,
    cross_seg_cat,
    cross_user_cat,
    cross_seg_item,
    cross_ctx_item,
    cross_item_pos,
) = _views
ctr_cross_v2 = cross_service(_views)
