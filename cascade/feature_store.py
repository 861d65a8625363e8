"""The Feast feature store of the CTR features: the cross-statistics engine's views (applied,
materialized in bulk, read point in time and online).

The engine's views (``cross_<pair>``, service ``ctr_cross_v2``) are what the ``ctr_cross``
pipeline materializes (:func:`materialize_cross`) and what the pre-ranking server reads per
request (:class:`cascade.online_cross.OnlineCrossReader`); :func:`cross_features_at` is their
offline point-in-time join, which the online answers are held equal to.

The feature repo is ``features/`` (definitions only, so ``feast apply`` works on it too); its
``feature_store.yaml`` for the active profile is ``features/profiles/<profile>/``. Every
path (registry, online store, lake) comes from :func:`cascade.config.load_settings`, so
``CASCADE_HOME`` moves all of it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import feast
import pandas as pd
import yaml
from feast.repo_config import RepoConfig

from cascade.config import REPO_ROOT, Settings, load_settings
from cascade.ctr_schema import TIMESTAMP
from cascade.lake import Lake, check_ds, dated_partitions

FEATURE_REPO = REPO_ROOT / "features"

_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


def feature_store_yaml(profile: str) -> Path:
    """The ``feature_store.yaml`` of one settings profile."""
    return FEATURE_REPO / "profiles" / profile / "feature_store.yaml"


def repo_config(settings: Settings) -> RepoConfig:
    """The profile's ``feature_store.yaml`` with ``${...}`` filled from settings, then env."""
    path = feature_store_yaml(settings.profile)
    if not path.is_file():
        raise FileNotFoundError(
            f"no Feast config for profile {settings.profile!r} at {path}; add one there"
        )
    text = path.read_text()
    from_settings = {
        "CASCADE_HOME": str(settings.home),
        "CASCADE_SPARK_MASTER": settings.spark_master,
        "CASCADE_REDIS": settings.feature_store.redis,
        "CASCADE_FEAST_REGISTRY_URL": settings.feature_store.feast_registry_url,
    }
    if settings.profile == "cluster":
        # Unset: the cluster stack's own Redis and PostgreSQL, once it has been started here.
        from cascade import data_services

        stack = {
            "CASCADE_REDIS": data_services.redis_connection,
            "CASCADE_FEAST_REGISTRY_URL": data_services.feast_registry_url,
        }
        for name, of_stack in stack.items():
            if not from_settings[name] and "${" + name + "}" in text:
                with contextlib.suppress(FileNotFoundError):
                    from_settings[name] = of_stack(settings)
    for name, value in from_settings.items():
        if value:  # an unset one stays a placeholder, named below
            text = text.replace("${" + name + "}", value)
    text = os.path.expandvars(text)
    missing = sorted(set(_PLACEHOLDER.findall(text)))
    if missing:
        raise ValueError(
            f"{path} needs environment variables {missing}; export them before using the "
            f"{settings.profile!r} profile"
        )
    loaded = yaml.safe_load(text)
    offline = loaded.get("offline_store") or {}
    if offline.get("type") == "spark":
        # The stack's standalone master wants its authentication secret (and keeps an event
        # log): held in this config in memory only, never written into a file. Before the
        # stack's first start there is none; online reads need no Spark.
        from cascade.data_services import spark_client_conf

        with contextlib.suppress(FileNotFoundError):
            offline["spark_conf"] = {
                **(offline.get("spark_conf") or {}),
                **spark_client_conf(settings),
            }
    config = RepoConfig(**loaded)
    config.repo_path = FEATURE_REPO
    return config


def feature_store(settings: Settings | None = None) -> feast.FeatureStore:
    """A FeatureStore for the active (or given) settings; creates ``<home>/feast`` if needed."""
    settings = settings or load_settings()
    if settings.profile == "local":
        (settings.home / "feast").mkdir(parents=True, exist_ok=True)
    return feast.FeatureStore(repo_path=str(FEATURE_REPO), config=repo_config(settings))


def repo_module(name: str) -> ModuleType:
    """Import a module of the feature repo the way ``feast apply`` does (repo on sys.path).

    Feast names repo modules by their path inside the repo (``ctr.views``), so the repo's own
    imports use those names; importing them any other way would create second copies.
    """
    if str(FEATURE_REPO) not in sys.path:
        sys.path.append(str(FEATURE_REPO))
    module = importlib.import_module(name)
    origin = Path(module.__file__ or "").resolve()
    if FEATURE_REPO.resolve() not in origin.parents:
        raise ImportError(
            f"module {name!r} came from {origin}, not the feature repo {FEATURE_REPO}; "
            "an installed package shadows it: rename the repo folder or uninstall that package"
        )
    return module


CROSS_FEATURE_SERVICE = "ctr_cross_v2"


def cross_repo_objects(*, settings: Settings, source: str = "generated") -> list[Any]:
    """The cross-statistics entities, one view per pair and ``ctr_cross_v2``, with sources
    over the pair folders of the given log ``source`` (see ``features/ctr/cross_views.py``)."""
    entities = repo_module("common.entities")
    cross = repo_module("ctr.cross_views")
    views = cross.cross_feature_views(
        {pair: cross.cross_source(pair, settings=settings, source=source) for pair in cross.PAIRS}
    )
    service = cross.cross_service(views)
    if service.name != CROSS_FEATURE_SERVICE:
        raise RuntimeError(
            f"the repo defines {service.name!r} but cascade.feature_store serves "
            f"{CROSS_FEATURE_SERVICE!r}; update CROSS_FEATURE_SERVICE together with the views"
        )
    extra = [cross.user_segment, cross.item_category, cross.context, cross.position]
    return [entities.user, entities.item, *extra, *views, service]


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
    store.apply(cross_repo_objects(settings=settings, source=source))
    view = store.get_feature_view(f"cross_{pair}")
    refs = [f"{view.name}:{f.name}" for f in view.features]
    rows = entity_rows.copy()
    rows[TIMESTAMP] = pd.to_datetime(rows[TIMESTAMP], utc=True)
    found = store.get_historical_features(entity_df=rows, features=refs).to_df()
    found = found.reset_index(drop=True)
    keys = list(view.join_keys)
    root = Path(repo_module("ctr.cross_views").cross_root(Lake(settings.lake_root), source, pair))
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


MATERIALIZE_ENGINES = ("bulk", "feast", "spark")
"""How :func:`materialize_cross` loads the online store: ``bulk`` (Arrow batches straight into
SQLite or Redis from this process, :mod:`cascade.online_bulk`), ``feast``
(``FeatureStore.materialize``, row by row) or ``spark`` (Redis only: the bulk engine's encoding
and writes run on Spark executors, one task per Spark partition; the caller hands in the
``loader``, e.g. ``jobs.online_materialize.SparkViewLoader``, since the kernel starts no
Spark)."""


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
    (:class:`cascade.online_cross.OnlineCrossReader`) answer them as missing: the newest
    partition is the largest end of the view's materialization intervals recorded here.

    ``engine`` (default: :func:`default_materialize_engine`): ``"bulk"`` writes the SQLite
    (local) or Redis (cluster) online store from Arrow batches and records the interval in the
    registry as Feast does; stores it does not write go through Feast. ``"spark"`` writes Redis
    from Spark executors through ``loader`` (required; a store that is not Redis falls back to
    ``bulk``). ``"feast"`` always uses ``FeatureStore.materialize`` (for comparison)."""
    from cascade import online_bulk

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
    cross = repo_module("ctr.cross_views")
    unknown = sorted(set(pairs or ()) - set(cross.PAIRS))
    if unknown:
        raise ValueError(f"no cross views for pairs {unknown}; the repo defines {cross.PAIRS}")
    chosen = [pair for pair in cross.PAIRS if pairs is None or pair in pairs]
    folders = {pair: Path(cross.cross_root(lake, source, pair)) / f"dt={ds}" for pair in chosen}
    absent = [pair for pair, folder in folders.items() if not folder.is_dir()]
    if absent:
        raise FileNotFoundError(
            f"cross statistics of {absent} for ds={ds} ({source}) are missing; run "
            f"`cascade step stats --pipeline ctr_cross --ds {ds}` first"
        )
    store = feature_store(settings)
    objects = cross_repo_objects(settings=settings, source=source)
    store.apply(objects)
    views = [f"cross_{pair}" for pair in chosen]
    moment = dt.datetime.combine(dt.date.fromisoformat(ds), dt.time(), tzinfo=dt.UTC)
    if engine == "spark" and not _is_redis(store):
        print(
            f"[feature_store] the spark engine writes Redis, not {store.config.online_store.type}:"
            " materializing in bulk from this process",
            flush=True,
        )
        engine = "bulk"
    if engine in ("bulk", "spark"):
        try:
            online_bulk.check_supported(store)
        except online_bulk.BulkUnsupported as why:
            print(f"[feature_store] {why}: materializing through Feast", flush=True)
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
                    f"[feature_store] {view.name}: skipped {result.skipped_missing_key:,} rows "
                    "with a missing key",
                    flush=True,
                )
            rows += result.rows
            write_s += result.seconds
    seconds = round(time.perf_counter() - started, 1)
    print(
        f"[feature_store] materialized {views} for ds={ds} ({source}, {engine}) in {seconds} s",
        flush=True,
    )
    return {
        "ds": ds,
        "source": source,
        "feature_views": views,
        "feature_service": CROSS_FEATURE_SERVICE,
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


def online_cross_features(
    store: feast.FeatureStore, pair: str, keys: Sequence[Mapping[str, Any]]
) -> pd.DataFrame:
    """The online cross features of one pair for ``keys`` (dicts of the pair's key columns):
    one row per key in order, the key columns then the view's features; NaN for a key the
    online store does not hold. Feast's online read does not apply the views' ttl: the
    newest materialized partition answers, however old."""
    view = store.get_feature_view(f"cross_{pair}")
    names = [f.name for f in view.features]
    response = store.get_online_features(
        features=[f"{view.name}:{name}" for name in names], entity_rows=[dict(k) for k in keys]
    ).to_dict()
    frame = pd.DataFrame(response)
    for name in names:
        frame[name] = pd.to_numeric(frame[name], errors="coerce").astype("float64")
    return frame[[*view.join_keys, *names]]
