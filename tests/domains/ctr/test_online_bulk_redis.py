"""Bulk materialization into Feast's Redis online store (the cluster profile's), on the
stack's own Redis in a private state folder: ``materialize_cross`` with the cluster profile
leaves the same hashes, byte for byte, as Feast's ``materialize`` into Redis, and both answer
``get_online_features`` alike."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import feast
import numpy as np
import pyarrow as pa
import pytest
import redis
import yaml
from feast.repo_config import RepoConfig

from cascade.config import FeatureStoreSettings, Settings
from cascade.data_services import redis_connection
from cascade.lake import Lake
from domains.ctr import feature_store as fs
from domains.ctr import online_bulk, online_encoding
from features.ctr import cross_views
from jobs import ctr_cross_features as cf
from tests.domains.ctr.test_online_bulk import DS1, DS2, PAIRS, key_rows, same, write_partition

pytestmark = pytest.mark.cluster

CHOSEN = ("item_pos", "seg_cat")
"""An int64 + int32 keyed pair and a string keyed one: small, so the test is quick."""


@pytest.fixture(scope="module")
def stack_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """One private Redis for the module (cluster profile, free port, generated password)."""
    from infra.stack import private_stack

    home = tmp_path_factory.mktemp("redis-home")
    with private_stack(home, services=("redis",), env={"CASCADE_PROFILE": "cluster"}) as s:
        yield s


def write_days(home: Path) -> None:
    """Two days of the chosen pairs: day 2 drops a third of day 1's keys and adds new ones."""
    lake = Lake(Settings(home=home).lake_root)
    for i, name in enumerate(CHOSEN):
        first = np.arange(0, 45)
        write_partition(lake, PAIRS[name], DS1, first, seed=i)
        write_partition(lake, PAIRS[name], DS2, first[15:] + 20, seed=100 + i)


def feast_redis_store(home: Path, connection: str) -> feast.FeatureStore:
    """The local profile's repo (file offline store, SQLite registry) over a Redis online
    store: what Feast's own ``materialize`` writes into Redis."""
    (home / "feast").mkdir(parents=True, exist_ok=True)
    text = fs.feature_store_yaml("local").read_text().replace("${CASCADE_HOME}", str(home))
    data = yaml.safe_load(text)
    data["online_store"] = {"type": "redis", "connection_string": connection}
    config = RepoConfig(**data)
    config.repo_path = fs.FEATURE_REPO
    return feast.FeatureStore(repo_path=str(fs.FEATURE_REPO), config=config)


def cluster_settings(stack: Settings, home: Path, db: int) -> Settings:
    """The cluster profile over the stack's Redis (database ``db``), with a file registry."""
    (home / "feast").mkdir(parents=True, exist_ok=True)
    return Settings(
        home=home,
        profile="cluster",
        ports=stack.ports,
        feature_store=FeatureStoreSettings(
            redis=f"{redis_connection(stack)},db={db}",
            feast_registry_url=f"sqlite:///{home / 'feast' / 'registry.db'}",
        ),
    )


def hashes(stack: Settings, db: int) -> dict[bytes, dict[bytes, bytes]]:
    password = redis_connection(stack).split("password=", 1)[1]
    client = redis.Redis(
        host=stack.host, port=stack.ports.redis, password=password, db=db, socket_timeout=10
    )
    try:
        return {key: client.hgetall(key) for key in client.scan_iter(count=1000)}
    finally:
        client.close()


def moment(ds: str) -> dt.datetime:
    return dt.datetime.combine(dt.date.fromisoformat(ds), dt.time(), tzinfo=dt.UTC)


def test_cluster_materialize_writes_redis_in_bulk_exactly_as_feast_does(
    stack_redis: Settings, tmp_path: Path
) -> None:
    feast_home, bulk_home = tmp_path / "feast-path", tmp_path / "bulk-path"
    write_days(feast_home)
    write_days(bulk_home)
    feast_store = feast_redis_store(feast_home, f"{redis_connection(stack_redis)},db=1")
    feast_store.apply(cross_views.repo_objects(settings=Settings(home=feast_home)))
    views = [f"cross_{pair}" for pair in CHOSEN]
    cluster = cluster_settings(stack_redis, bulk_home, db=2)
    for ds in (DS1, DS2):
        feast_store.materialize(start_date=moment(ds), end_date=moment(ds), feature_views=views)
    # Day 1, day 2, then day 1 again: the older partition must not overwrite a newer key.
    for ds, rows in ((DS1, 45), (DS2, 30), (DS1, 45)):
        run = cf.materialize_cross(ds, settings=cluster, pairs=list(CHOSEN), engine="bulk")
        assert run["engine"] == "bulk" and run["rows"] == 2 * rows

    # Same keys, same fields, same bytes (values, missing values, timestamps).
    feast_hashes, bulk_hashes = hashes(stack_redis, 1), hashes(stack_redis, 2)
    assert len(bulk_hashes) == 2 * (45 + 20)
    assert bulk_hashes == feast_hashes
    # ... so every key of either day (and one never written) reads the same through Feast.
    bulk_store = fs.feature_store(cluster)
    assert bulk_store.config.online_store.type == "redis"
    for pair in CHOSEN:
        view = f"cross_{pair}"
        features = [f"{view}:{f.name}" for f in bulk_store.get_feature_view(view).features]
        rows = key_rows(feast_home, pair)
        answers = [
            store.get_online_features(features=features, entity_rows=rows).to_dict(
                include_event_timestamps=True
            )
            for store in (bulk_store, feast_store)
        ]
        assert same(*answers)
        # Day-1-only keys keep day 1 (the rerun of day 1 did not win over day 2), day-2 keys
        # carry day 2, the unknown key none.
        stamps = set(answers[0][f"{pair}_ctr_7d__ts"])
        assert stamps == {0, moment(DS1).timestamp(), moment(DS2).timestamp()}


def test_a_batch_that_differs_from_feast_is_refused_before_anything_is_written(
    stack_redis: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    write_days(home)
    cluster = cluster_settings(stack_redis, home, db=3)
    store = fs.feature_store(cluster)
    store.apply(cross_views.repo_objects(settings=cluster))
    view = store.get_feature_view("cross_seg_cat")
    folder = Lake(cluster.lake_root).root / "features/ctr_cross/generated/seg_cat" / f"dt={DS1}"
    real = online_bulk.encode_values

    def one_more_byte(column: pa.Array, value_type):  # type: ignore[no-untyped-def]
        encoded = real(column, value_type)
        if value_type.name == "DOUBLE":
            encoded.blobs = pa.array([b + b"\0" if b else b for b in encoded.blobs.to_pylist()])
        return encoded

    monkeypatch.setattr(online_bulk, "encode_values", one_more_byte)
    with pytest.raises(online_encoding.BulkEncodingMismatch, match="seg_cat_ctr_1d"):
        online_bulk.write_path(store, view, folder, moment(DS1), moment(DS1))
    assert hashes(stack_redis, 3) == {}
    monkeypatch.setattr(online_bulk, "encode_values", real)
    result = online_bulk.write_path(store, view, folder, moment(DS1), moment(DS1))
    assert (result.rows, result.kept_newer) == (45, 0)
    again = online_bulk.write_path(store, view, folder, moment(DS1), moment(DS1))
    assert (again.rows, again.kept_newer) == (45, 45)  # not newer: Feast's rule, left alone
    assert len(hashes(stack_redis, 3)) == 45
