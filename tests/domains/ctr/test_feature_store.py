"""domains.ctr.feature_store's settings plumbing: every path under ``CASCADE_HOME``, the profiles'
Feast configs, the materialization engine of each profile. Importing feast alone takes ~15 s
here, so one materialized store is shared by the module.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cascade.config import Settings, load_settings
from cascade.lake import Lake
from domains.ctr import feature_store as fs
from jobs import ctr_cross_features as cf
from jobs import ctr_cross_stats as job

DS = "2026-01-15"


def write_user_partition(lake: Lake, ds: str) -> None:
    """Partition ``ds`` of the engine's ``user`` pair: users 1 and 2, every feature column."""
    users = [1, 2]
    columns: dict[str, pa.Array] = {
        "user_id": pa.array(users, pa.int64()),
        job.TIMESTAMP: pa.array([job.ds_midnight(ds)] * 2, pa.timestamp("us", tz="UTC")),
    }
    for column in job.feature_columns(job.USER, (1, 7, 30)):
        is_count = "_imp_" in column or "_clk_" in column
        columns[column] = pa.array(
            [10 * u for u in users] if is_count else [u / 10 for u in users],
            pa.int64() if is_count else pa.float64(),
        )
    where = job.CrossLake(lake, "generated").pair(job.USER, ds)
    where.mkdir(parents=True)
    pq.write_table(pa.table(columns), where / "part-00000.parquet")


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    home = tmp_path_factory.mktemp("cascade_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CASCADE_HOME", str(home))
        mp.delenv("CASCADE_PROFILE", raising=False)
        settings = load_settings()
        write_user_partition(Lake(settings.lake_root), DS)
        yield settings


@pytest.fixture(scope="module")
def materialized(settings: Settings) -> dict:
    return cf.materialize_cross(DS, settings=settings, pairs=["user"])


def test_everything_lives_under_cascade_home(settings: Settings, materialized: dict) -> None:
    store = fs.feature_store(settings)
    home = settings.home
    assert materialized["feature_views"] == ["cross_user"] and materialized["rows"] == 2
    assert (home / "feast" / "registry.db").is_file()
    assert (home / "feast" / "online_store.db").is_file()
    assert str(home) in store.config.registry.path
    lake = Lake(settings.lake_root)
    paths = {v.name: v.batch_source.path for v in store.list_feature_views()}
    assert paths["cross_user"] == str(job.CrossLake(lake, "generated").pair_root(job.USER))
    assert all(path.startswith(str(settings.lake_root)) for path in paths.values())
    # The rows are where the server reads them.
    (column,) = [c for c in job.feature_columns(job.USER, (7,)) if c.endswith("_ctr_7d")]
    found = fs.online_cross_features(store, "user", [{"user_id": 2}, {"user_id": 9}])
    assert found[column].iloc[0] == pytest.approx(0.2) and math.isnan(found[column].iloc[1])


def test_cluster_profile_names_unset_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CASCADE_REDIS", "CASCADE_FEAST_REGISTRY_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="CASCADE_FEAST_REGISTRY_URL.*CASCADE_REDIS"):
        fs.repo_config(Settings(profile="cluster"))
    monkeypatch.setenv("CASCADE_PROFILE", "cluster")
    monkeypatch.setenv("CASCADE_REDIS", "redis.cascade.svc:6379")
    monkeypatch.setenv("CASCADE_FEAST_REGISTRY_URL", "postgresql://feast@pg/feast")
    config = fs.repo_config(load_settings())
    assert config.offline_store.type == "spark"
    assert config.online_store.connection_string == "redis.cascade.svc:6379"


def test_cluster_offline_store_authenticates_to_the_stack_master(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cascade import data_services
    from cascade.data_services import spark_client_conf_dir, spark_secret_file
    from cascade.state import write_secret

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setenv("CASCADE_PROFILE", "cluster")
    monkeypatch.setenv("CASCADE_REDIS", "127.0.0.1:6379")
    monkeypatch.setenv("CASCADE_FEAST_REGISTRY_URL", "postgresql://feast@127.0.0.1/feast")
    settings = load_settings()
    assert settings.spark_master == settings.stack_spark_master
    write_secret(spark_secret_file(settings), "sesame")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "elsewhere"))  # restored after the test
    # A process with no PySpark JVM yet: the JVM it starts reads the secret from its defaults.
    monkeypatch.setattr(data_services, "_spark_gateway_running", lambda: False)
    conf = fs.repo_config(settings).offline_store.spark_conf
    assert conf["spark.master"] == settings.stack_spark_master
    # The secret reaches the JVM through its configuration file, never as a --conf argument.
    assert conf["spark.authenticate"] == "true" and "sesame" not in conf.values()
    defaults = spark_client_conf_dir(settings) / "spark-defaults.conf"
    assert os.environ["SPARK_CONF_DIR"] == str(defaults.parent)
    assert "spark.authenticate.secret sesame" in defaults.read_text()
    assert stat.S_IMODE(defaults.stat().st_mode) == 0o600
    assert conf["spark.eventLog.enabled"] == "true"
    assert "sesame" not in fs.feature_store_yaml("cluster").read_text()
    # A JVM already up read its defaults before: the secret goes over PySpark's gateway.
    monkeypatch.setattr(data_services, "_spark_gateway_running", lambda: True)
    conf = fs.repo_config(settings).offline_store.spark_conf
    assert conf["spark.authenticate.secret"] == "sesame"


def test_the_cluster_profile_materializes_from_spark_executors(tmp_path: Path) -> None:
    assert cf.default_materialize_engine(Settings(home=tmp_path)) == "bulk"
    cluster = Settings(home=tmp_path, profile="cluster")
    assert cf.default_materialize_engine(cluster) == "spark"
    # The kernel starts no Spark: without the executors' loader the call says what to pass.
    with pytest.raises(ValueError, match="loader=jobs.online_materialize.SparkViewLoader"):
        cf.materialize_cross(DS, settings=cluster)
    with pytest.raises(ValueError, match="engine must be one of"):
        cf.materialize_cross(DS, settings=cluster, engine="dask")
