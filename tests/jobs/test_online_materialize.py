"""The ``spark`` materialization engine (``jobs.online_materialize``) on the jobs' local Spark
session and the cluster stack's own Redis in a private state folder: the executors leave the
bulk engine's hashes byte for byte, Feast reads the parquet's values back, and a wrong password
stops the load with a message that names the file, not the password."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import redis

from benchmarks.online_materialize import settings_over_stack
from cascade.config import FeatureStoreSettings, Settings
from cascade.data_services import redis_connection, redis_password_file
from cascade.lake import Lake
from domains.ctr import feature_store as fs
from features.ctr import cross_views
from jobs import ctr_cross_features as cf
from jobs import ctr_cross_stats as job
from jobs import online_materialize as om
from tests.domains.ctr import test_online_bulk_redis
from tests.domains.ctr.test_online_bulk import DS1, PAIRS, write_partition

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

stack_redis = test_online_bulk_redis.stack_redis
"""One private Redis for the module (cluster profile, free port, generated password)."""

CHOSEN = ("item_pos", "seg_cat")
"""An int64 + int32 keyed pair and a string keyed one."""


def cluster_home(stack: Settings, home: Path, password: str | None = None) -> Settings:
    """The cluster profile in ``home`` over the stack's Redis: its password file copied there
    (or ``password`` written instead), a file registry, one pair partition per chosen pair."""
    settings = settings_over_stack(stack, home, password)
    lake = Lake(settings.lake_root)
    for i, name in enumerate(CHOSEN):
        write_partition(lake, PAIRS[name], DS1, np.arange(0, 60), seed=i)
    return settings


def stack_client(stack: Settings) -> redis.Redis:
    password = redis_connection(stack).split("password=", 1)[1]
    return redis.Redis(
        host=stack.host, port=stack.ports.redis, password=password, socket_timeout=10
    )


def hashes(client: redis.Redis) -> dict[bytes, dict[bytes, bytes]]:
    return {key: client.hgetall(key) for key in client.scan_iter(count=1000)}


def test_executors_write_what_feast_reads_back_and_what_the_bulk_engine_writes(
    spark, stack_redis: Settings, tmp_path: Path
) -> None:
    settings = cluster_home(stack_redis, tmp_path / "home")
    client = stack_client(stack_redis)
    client.flushdb()
    try:
        loader = om.SparkViewLoader(spark, settings, partitions=2)
        assert loader.target.password_file and "password=" not in loader.target.connection
        run = cf.materialize_cross(DS1, settings=settings, pairs=list(CHOSEN), loader=loader)
        assert run["engine"] == "spark" and run["rows"] == 2 * 60
        by_spark = hashes(client)
        assert len(by_spark) == 2 * 60

        # Through Feast: each key's values are the parquet's (NaN and null: missing).
        store = fs.feature_store(settings)
        rng = np.random.default_rng(0)
        for pair in CHOSEN:
            view = store.get_feature_view(f"cross_{pair}")
            names = [f.name for f in view.features]
            folder = job.CrossLake(Lake(settings.lake_root), "generated").pair(PAIRS[pair], DS1)
            table = pq.read_table(folder).to_pylist()
            sample = [table[i] for i in sorted(rng.choice(len(table), 12, replace=False))]
            keys = [{k: row[k] for k in view.join_keys} for row in sample]
            answer = store.get_online_features(
                features=[f"{view.name}:{n}" for n in names], entity_rows=keys
            ).to_dict()
            for i, row in enumerate(sample):
                for name in names:
                    want = row[name]
                    if want is None or (isinstance(want, float) and math.isnan(want)):
                        want = None
                    assert answer[name][i] == want, (pair, name, row)

        # The same partition by the single-process bulk engine: the same bytes.
        client.flushdb()
        bulk = cf.materialize_cross(DS1, settings=settings, pairs=list(CHOSEN), engine="bulk")
        assert bulk["rows"] == run["rows"]
        assert hashes(client) == by_spark
    finally:
        client.flushdb()
        client.close()


def test_a_wrong_password_stops_the_load_naming_the_file(
    spark, stack_redis: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = cluster_home(stack_redis, tmp_path / "good")
    store = fs.feature_store(good)
    store.apply(cross_views.repo_objects(settings=good))
    view = store.get_feature_view("cross_seg_cat")
    folder = job.CrossLake(Lake(good.lake_root), "generated").pair(PAIRS["seg_cat"], DS1)
    bad = cluster_home(stack_redis, tmp_path / "bad", password="not-the-password")
    loader = om.SparkViewLoader(spark, bad, partitions=2)
    moment = job.ds_midnight(DS1)
    with pytest.raises(om.RedisPasswordRejected) as caught:
        loader(store, view, folder, moment, moment)
    message = str(caught.value)
    assert str(redis_password_file(bad)) in message and "refused the password" in message
    assert "not-the-password" not in message
    # On the executors too (the driver's own check skipped): the same message, not a trace.
    monkeypatch.setattr(om, "check_password", lambda target: None)
    with pytest.raises(om.RedisPasswordRejected, match="refused the password"):
        loader(store, view, folder, moment, moment)
    client = stack_client(stack_redis)
    try:
        assert hashes(client) == {}
    finally:
        client.close()


def test_a_password_only_in_the_settings_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(om.REDIS_ENV, raising=False)
    settings = Settings(
        home=tmp_path,
        profile="cluster",
        feature_store=FeatureStoreSettings(redis="127.0.0.1:1,password=hunter2"),
    )
    with pytest.raises(om.RedisPasswordRejected, match="CASCADE_REDIS") as caught:
        om.redis_target(settings)
    assert "hunter2" not in str(caught.value)
    monkeypatch.setenv(om.REDIS_ENV, "127.0.0.1:1,password=hunter2")
    target = om.redis_target(settings)
    assert (target.connection, target.password_env) == ("127.0.0.1:1", om.REDIS_ENV)
    assert target.connection_string() == "127.0.0.1:1,password=hunter2"
