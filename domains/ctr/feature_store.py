"""The Feast feature store of the CTR features: its configuration per settings profile and
the online read of the cross views.

The views themselves (``cross_<pair>``, service ``ctr_cross_v2``) are defined in the feature
repo ``features/`` (definitions only, so ``feast apply`` works on it too:
:mod:`features.ctr.cross_views`); the ``ctr_cross`` pipeline applies and materializes them
(:mod:`jobs.ctr_cross_features`) and the pre-ranking server reads them per request
(:class:`domains.ctr.online_cross.OnlineCrossReader`). The ``feature_store.yaml`` of the
active profile is ``features/profiles/<profile>/``. Every path (registry, online store, lake)
comes from :func:`cascade.config.load_settings`, so ``CASCADE_HOME`` moves all of it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import feast
import pandas as pd
import yaml
from feast.repo_config import RepoConfig

from cascade.config import REPO_ROOT, Settings, load_settings

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
        # log): the secret goes to the drivers' own 0600 spark-defaults.conf, never into this
        # config or the JVM's command line. Before the stack's first start there is none;
        # online reads need no Spark.
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
