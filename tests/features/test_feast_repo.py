"""The Feast repo in features/: its definitions, and that ``feast apply`` accepts the folder."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from cascade import feature_store as fs
from cascade.config import Settings, load_settings
from cascade.lake import CTR_VIEWS, Lake

FEAST = Path(sys.executable).with_name("feast")


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The repo's module-level sources read the env settings when first imported.
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.delenv("CASCADE_PROFILE", raising=False)


def _touch_partitions(lake: Lake, dates: list[str]) -> None:
    for ds in dates:
        for view in CTR_VIEWS:
            lake.ctr_features(view, ds).mkdir(parents=True)


def test_repo_folder_holds_only_definition_modules() -> None:
    from feast.repo_operations import get_repo_files

    found = {
        p.relative_to(fs.FEATURE_REPO.resolve()).as_posix() for p in get_repo_files(fs.FEATURE_REPO)
    }
    # feast apply imports every .py here; anything else would run at apply time.
    assert found == {
        "common/entities.py",
        "common/sources.py",
        "ctr/views.py",
        "ctr/cross_views.py",
    }
    assert fs.feature_store_yaml("local").is_file() and fs.feature_store_yaml("cluster").is_file()


def test_definitions_keys_ttl_and_service(tmp_path: Path) -> None:
    from feast import Entity, FeatureService, FeatureView, ValueType

    settings = Settings(home=tmp_path)
    objects = fs.repo_objects("2026-01-15", settings=settings)
    entities = {o.name: o for o in objects if isinstance(o, Entity)}
    assert {n: (e.join_key, e.value_type) for n, e in entities.items()} == {
        "user": ("user_id", ValueType.INT64),
        "item": ("item_id", ValueType.INT64),
        "genre": ("genre", ValueType.STRING),
    }
    views = {o.name: o for o in objects if isinstance(o, FeatureView)}
    assert set(views) == {"user_stats", "item_stats", "user_genre_stats"}
    for view in views.values():
        assert view.online
        assert view.ttl == timedelta(0)  # Feast: never expires, so 1997 rows are served in 2026
    assert sorted(views["user_genre_stats"].entities) == ["genre", "user"]
    (service,) = [o for o in objects if isinstance(o, FeatureService)]
    assert service.name == "preranking_v1" and service.tags["version"] == "1"
    lake = Lake(settings.lake_root)
    assert views["item_stats"].batch_source.path == str(lake.ctr_features("item", "2026-01-15"))


def test_sources_follow_profile_and_newest_partition(tmp_path: Path) -> None:
    from feast import FileSource
    from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import SparkSource

    sources = fs.repo_module("common.sources")
    lake = Lake(tmp_path / "lake")
    assert sources.newest_partition(lake, "user") is None
    _touch_partitions(lake, ["2026-01-14", "2026-01-15", "2025-12-31"])
    assert sources.newest_partition(lake, "user") == "2026-01-15"
    local = sources.ctr_source("user", settings=Settings(home=tmp_path), ds="2026-01-14")
    assert isinstance(local, FileSource) and local.path.endswith("user/dt=2026-01-14")
    cluster = sources.ctr_source(
        "item", settings=Settings(home=tmp_path, profile="cluster"), ds=None
    )
    assert isinstance(cluster, SparkSource) and cluster.path == str(lake.ctr_view_root("item"))


@pytest.mark.slow
def test_feast_cli_applies_the_repo_under_cascade_home(tmp_path: Path) -> None:
    if not FEAST.exists():
        pytest.skip(f"feast CLI not found beside {sys.executable}")
    lake = Lake(tmp_path / "lake")
    _touch_partitions(lake, ["2026-01-14", "2026-01-15"])
    (tmp_path / "feast").mkdir()
    env = {**os.environ, "CASCADE_HOME": str(tmp_path)}
    env.pop("CASCADE_PROFILE", None)
    yaml_file = str(fs.feature_store_yaml("local"))
    command = [str(FEAST), "-c", str(fs.FEATURE_REPO), "-f", yaml_file, "apply"]
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    store = fs.feature_store(load_settings({"CASCADE_HOME": str(tmp_path)}))
    paths = {v.name: v.batch_source.path for v in store.list_feature_views()}
    cross = lake.root / "features" / "ctr_cross" / "generated"
    assert paths == {
        "user_stats": str(lake.ctr_features("user", "2026-01-15")),
        "item_stats": str(lake.ctr_features("item", "2026-01-15")),
        "user_genre_stats": str(lake.ctr_features("user_genre", "2026-01-15")),
        **{f"cross_{p}": str(cross / p) for p in ("user", "item", "seg_cat", "user_cat")},
        **{f"cross_{p}": str(cross / p) for p in ("seg_item", "ctx_item", "item_pos")},
    }
    assert sorted(s.name for s in store.list_feature_services()) == [
        "ctr_cross_v2",
        "preranking_v1",
    ]
