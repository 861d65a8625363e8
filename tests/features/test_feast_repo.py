"""The Feast repo in features/: its definitions, and that ``feast apply`` accepts the folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cascade.config import Settings, load_settings
from cascade.lake import Lake
from domains.ctr import feature_store as fs
from features.ctr import cross_views

FEAST = Path(sys.executable).with_name("feast")
PAIRS = ("user", "item", "seg_cat", "user_cat", "seg_item", "ctx_item", "item_pos")


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The repo's module-level sources read the env settings when first imported.
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.delenv("CASCADE_PROFILE", raising=False)


def test_repo_folder_holds_only_definition_modules() -> None:
    from feast.repo_operations import get_repo_files

    found = {
        p.relative_to(fs.FEATURE_REPO.resolve()).as_posix() for p in get_repo_files(fs.FEATURE_REPO)
    }
    # feast apply imports every .py here; anything else would run at apply time.
    assert found == {"common/entities.py", "ctr/cross_views.py"}
    assert fs.feature_store_yaml("local").is_file() and fs.feature_store_yaml("cluster").is_file()


def test_entities_are_keyed_by_the_log_columns(tmp_path: Path) -> None:
    from feast import Entity, ValueType

    objects = cross_views.repo_objects(settings=Settings(home=tmp_path))
    entities = {o.name: o for o in objects if isinstance(o, Entity)}
    assert {n: (e.join_key, e.value_type) for n, e in entities.items()} == {
        "user": ("user_id", ValueType.INT64),
        "item": ("item_id", ValueType.INT64),
        "user_segment": ("user_segment", ValueType.STRING),
        "item_category": ("item_category", ValueType.STRING),
        "context": ("context", ValueType.STRING),
        "position": ("position", ValueType.INT32),
    }


def test_sources_follow_the_profile_and_read_the_pair_folder(tmp_path: Path) -> None:
    from feast import FileSource
    from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import SparkSource

    cross = cross_views
    lake = Lake(tmp_path / "lake")
    folder = str(lake.root / "features" / "ctr_cross" / "generated" / "user")
    local = cross.cross_source("user", settings=Settings(home=tmp_path))
    assert isinstance(local, FileSource) and local.path == folder
    cluster = cross.cross_source("user", settings=Settings(home=tmp_path, profile="cluster"))
    assert isinstance(cluster, SparkSource) and cluster.path == folder


@pytest.mark.slow
def test_feast_cli_applies_the_repo_under_cascade_home(tmp_path: Path) -> None:
    if not FEAST.exists():
        pytest.skip(f"feast CLI not found beside {sys.executable}")
    lake = Lake(tmp_path / "lake")
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
    assert paths == {f"cross_{p}": str(cross / p) for p in PAIRS}
    assert sorted(s.name for s in store.list_feature_services()) == ["ctr_cross_v2"]
