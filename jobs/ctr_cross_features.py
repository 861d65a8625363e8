"""The ``ctr_cross`` pipeline's Feast step and the offline read of the same views: apply the
cross views of a log source and load one partition into the online store
(:func:`materialize_cross`), and join them point in time for a frame of entity rows
(:func:`cross_features_at`), which the online answers are held equal to.

The views are the feature repo's (:mod:`features.ctr.cross_views`); the store's configuration
per profile is :mod:`domains.ctr.feature_store`, the bulk writer :mod:`domains.ctr.online_bulk`,
and the Spark executors' loader :class:`jobs.online_materialize.SparkViewLoader`.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import feast
import pandas as pd

from cascade.config import Settings, load_settings
from cascade.lake import Lake, check_ds, dated_partitions
from domains.ctr import online_bulk, online_encoding
from domains.ctr.feature_store import feature_store
from domains.ctr.schema import TIMESTAMP
from features.ctr import cross_views

MATERIALIZE_ENGINES = ("bulk", "feast", "spark")
"""How :func:`materialize_cross` loads the online store: ``bulk`` (Arrow batches straight into
SQLite or Redis from this process, :mod:`domains.ctr.online_bulk`), ``feast``
(``FeatureStore.materialize``, row by row) or ``spark`` (Redis only: the bulk engine's encoding
and writes run on Spark executors, one task per Spark partition; the caller hands in the
``loader``, e.g. ``jobs.online_materialize.SparkViewLoader``: the step that owns the Spark
session)."""


class ViewLoader(Protocol):
    """Loads the rows of a parquet partition with ``start <= event time <= end`` into one
    view's online store, leaving the registry alone (the ``spark`` engine)."""

    def __call__(
        self,
        store: feast.FeatureStore,
        view: feast.FeatureView,
        path: Path,
        start: dt.datetime,
        end: dt.datetime,
    ) -> Any: ...


def default_materialize_engine(settings: Settings) -> str:
    """The profile's engine: ``spark`` in the ``cluster`` profile (its online store is Redis,
    which executors write in parallel), ``bulk`` otherwise (one SQLite file takes one writer)."""
    return "spark" if settings.profile == "cluster" else "bulk"


def materialize_cross(
    ds: str,
    *,
    settings: Settings | None = None,
    source: str = "generated",
    engine: str | None = None,
    pairs: Sequence[str] | None = None,
    loader: ViewLoader | None = None,
) -> dict[str, Any]:
    """Apply the cross views of ``source`` and load partition ``ds`` of every pair (or of
    ``pairs``: the ones the source's log could key) into the online store (rows with
    ``event_timestamp == ds`` midnight: the statistics of windows ending at ``ds``, the newest
    a request on that day may see). Idempotent; a later partition
    overwrites an earlier one key by key, an older one loaded later changes nothing. Keys
    absent from the newest partition keep their older row in the store, and readers
    (:class:`domains.ctr.online_cross.OnlineCrossReader`) answer them as missing: the newest
    partition is the largest end of the view's materialization intervals recorded here.

    ``engine`` (default: :func:`default_materialize_engine`): ``"bulk"`` writes the SQLite
    (local) or Redis (cluster) online store from Arrow batches and records the interval in the
    registry as Feast does; stores it does not write go through Feast. ``"spark"`` writes Redis
    from Spark executors through ``loader`` (required; a store that is not Redis falls back to
    ``bulk``). ``"feast"`` always uses ``FeatureStore.materialize`` (for comparison)."""
    settings = settings or load_settings()
    engine = engine or default_materialize_engine(settings)
    if engine not in MATERIALIZE_ENGINES:
        raise ValueError(f"engine must be one of {MATERIALIZE_ENGINES}, not {engine!r}")
    if engine == "spark" and loader is None:
        raise ValueError(
            "engine 'spark' writes from Spark executors and needs their loader: pass "
            "loader=jobs.online_materialize.SparkViewLoader(spark, settings) (the ctr_cross "
            "pipeline's feast step does), or engine='bulk' to write from this process"
        )
    check_ds(ds)
    started = time.perf_counter()
    lake = Lake(settings.lake_root)
    unknown = sorted(set(pairs or ()) - set(cross_views.PAIRS))
    if unknown:
        raise ValueError(
            f"no cross views for pairs {unknown}; the repo defines {cross_views.PAIRS}"
        )
    chosen = [pair for pair in cross_views.PAIRS if pairs is None or pair in pairs]
    folders = {
        pair: Path(cross_views.cross_root(lake, source, pair)) / f"dt={ds}" for pair in chosen
    }
    absent = [pair for pair, folder in folders.items() if not folder.is_dir()]
    if absent:
        raise FileNotFoundError(
            f"cross statistics of {absent} for ds={ds} ({source}) are missing; run "
            f"`cascade step stats --pipeline ctr_cross --ds {ds}` first"
        )
    store = feature_store(settings)
    objects = cross_views.repo_objects(settings=settings, source=source)
    store.apply(objects)
    views = [f"cross_{pair}" for pair in chosen]
    moment = dt.datetime.combine(dt.date.fromisoformat(ds), dt.time(), tzinfo=dt.UTC)
    if engine == "spark" and not _is_redis(store):
        print(
            f"[ctr_cross_features] the spark engine writes Redis, not "
            f"{store.config.online_store.type}: materializing in bulk from this process",
            flush=True,
        )
        engine = "bulk"
    if engine in ("bulk", "spark"):
        try:
            online_bulk.check_supported(store)
        except online_encoding.BulkUnsupported as why:
            print(f"[ctr_cross_features] {why}: materializing through Feast", flush=True)
            engine = "feast"
    rows: int | None = None
    write_s: float | None = None
    writers: set[str] = set()
    """The spark engine's tasks that wrote rows: their executors' working folders."""
    if engine == "feast":
        # Both bounds are inclusive: exactly the ds partition (every row carries ds midnight).
        store.materialize(start_date=moment, end_date=moment, feature_views=views)
    else:
        rows, write_s = 0, 0.0
        for pair, folder in folders.items():
            view = store.get_feature_view(f"cross_{pair}")
            if engine == "spark":
                assert loader is not None
                result = loader(store, view, folder, moment, moment)
                writers.update(t["workdir"] for t in getattr(result, "tasks", []) if t["rows"])
            else:
                result = online_bulk.write_path(store, view, folder, moment, moment)
            online_bulk.record_materialization(store, view, moment, moment)
            if result.skipped_missing_key:
                print(
                    f"[ctr_cross_features] {view.name}: skipped {result.skipped_missing_key:,} "
                    "rows with a missing key",
                    flush=True,
                )
            rows += result.rows
            write_s += result.seconds
    seconds = round(time.perf_counter() - started, 1)
    print(
        f"[ctr_cross_features] materialized {views} for ds={ds} ({source}, {engine}) in "
        f"{seconds} s",
        flush=True,
    )
    return {
        "ds": ds,
        "source": source,
        "feature_views": views,
        "feature_service": cross_views.CROSS_FEATURE_SERVICE,
        "materialized": moment.isoformat(),
        "seconds": seconds,
        "engine": engine,
        "rows": rows,
        "write_s": write_s,
        "rows_per_s": rows / write_s if rows and write_s else None,
        **({"writer_dirs": sorted(writers)} if engine == "spark" else {}),
    }


def _is_redis(store: feast.FeatureStore) -> bool:
    from feast.infra.online_stores.redis import RedisOnlineStoreConfig

    return isinstance(store.config.online_store, RedisOnlineStoreConfig)


def cross_features_at(
    entity_rows: pd.DataFrame,
    pair: str,
    *,
    settings: Settings | None = None,
    source: str = "generated",
) -> pd.DataFrame:
    """Point-in-time cross features of one pair for ``entity_rows`` (the pair's key columns and
    ``event_timestamp``), as the training set and the online reader answer: each row reads the
    newest partition with ``event_timestamp <=`` its own (statistics of windows that ended
    before it), NaN when there is none within the view's ttl or when the key is not in that
    partition.

    The join is Feast's (``get_historical_features`` over the pair's view); Feast carries a
    key's row from an older partition forward within the ttl, which the engine's partitions
    forbid (they are snapshots: a key absent from one had no impression in its longest window),
    so such values are masked here with the keys of the partition each row reads. The result
    keeps Feast's row order. Applies the cross views first (idempotent), so a training-set
    builder can call it alone.
    """
    settings = settings or load_settings()
    store = feature_store(settings)
    store.apply(cross_views.repo_objects(settings=settings, source=source))
    view = store.get_feature_view(f"cross_{pair}")
    refs = [f"{view.name}:{f.name}" for f in view.features]
    rows = entity_rows.copy()
    rows[TIMESTAMP] = pd.to_datetime(rows[TIMESTAMP], utc=True)
    found = store.get_historical_features(entity_df=rows, features=refs).to_df()
    found = found.reset_index(drop=True)
    keys = list(view.join_keys)
    root = Path(cross_views.cross_root(Lake(settings.lake_root), source, pair))
    published = dated_partitions(root)
    if not published or found.empty:
        return found
    midnights = pd.to_datetime(pd.Series(published), utc=True)
    stamps = pd.to_datetime(found[TIMESTAMP], utc=True)
    at = midnights.searchsorted(stamps, side="right") - 1
    reads = pd.Series([published[i] if i >= 0 else None for i in at], index=found.index)
    present = pd.Series(False, index=found.index)
    for ds in reads.dropna().unique():
        held = pd.read_parquet(root / f"dt={ds}", columns=keys).drop_duplicates()
        mine = found.loc[reads == ds, keys]
        marked = mine.reset_index().merge(held.assign(_held=True), on=keys, how="left")
        present.loc[marked["index"].to_numpy()] = marked["_held"].notna().to_numpy()
    retired = ~present.to_numpy()
    if retired.any():
        for feature in (f.name for f in view.features):
            found[feature] = found[feature].astype("float64")
            found.loc[retired, feature] = float("nan")
    return found
