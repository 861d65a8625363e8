"""cascade.feature_store's MovieLens-shaped views on a hand-built lake: materialization and the
online lookups a server of a version registered before the engine makes (microsecond UTC
timestamps, one ``dt=`` partition per view). Importing feast alone takes ~15 s here, so one
applied store is shared by the module.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cascade import feature_store as fs
from cascade.config import Settings, load_settings
from cascade.lake import Lake

DS = "2026-01-15"
TS = pa.timestamp("us", tz="UTC")


def _t(value: str) -> pd.Timestamp:
    return pd.Timestamp(value, tz="UTC")


def _write(folder: Path, rows: dict[str, list], schema: pa.Schema) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows, schema=schema), folder / "part-00000.parquet")


def write_ctr_lake(lake: Lake, ds: str) -> None:
    """Weekly snapshots on 1997-09-22 and 09-29, and one after ds that must never be served."""
    _write(
        lake.ctr_features("user", ds),
        {
            "user_id": [1, 1, 2, 1],
            "event_timestamp": [
                _t("1997-09-22"), _t("1997-09-29"), _t("1997-09-29"), _t("2026-02-01"),
            ],
            "user_impressions": [5, 9, 3, 999],
            "user_clicks": [1, 4, 2, 999],
            "user_ctr": [0.2, 0.44, 0.66, 0.99],
            "user_age": [30, 30, 40, 30],
        },
        pa.schema(
            [("user_id", pa.int64()), ("event_timestamp", TS), ("user_impressions", pa.int64()),
             ("user_clicks", pa.int64()), ("user_ctr", pa.float64()), ("user_age", pa.int64())]
        ),
    )  # fmt: skip
    _write(
        lake.ctr_features("item", ds),
        {
            "item_id": [10, 10, 11],
            "event_timestamp": [_t("1997-09-22"), _t("1997-09-29"), _t("1997-09-22")],
            "item_impressions": [7, 8, 2],
            "item_clicks": [3, 3, 0],
            "item_ctr": [0.4, 0.375, 0.0],
            "item_release_year": [1995, 1995, None],
            "item_genre": ["Drama", "Drama", "Comedy"],
        },
        pa.schema(
            [("item_id", pa.int64()), ("event_timestamp", TS), ("item_impressions", pa.int64()),
             ("item_clicks", pa.int64()), ("item_ctr", pa.float64()),
             ("item_release_year", pa.int64()), ("item_genre", pa.string())]
        ),
    )  # fmt: skip
    _write(
        lake.ctr_features("user_genre", ds),
        {
            "user_id": [1, 1],
            "genre": ["Drama", "Drama"],
            "event_timestamp": [_t("1997-09-22"), _t("1997-09-29")],
            "ug_impressions": [2, 5],
            "ug_clicks": [1, 2],
            "ug_ctr": [0.5, 0.4],
        },
        pa.schema(
            [("user_id", pa.int64()), ("genre", pa.string()), ("event_timestamp", TS),
             ("ug_impressions", pa.int64()), ("ug_clicks", pa.int64()), ("ug_ctr", pa.float64())]
        ),
    )  # fmt: skip


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    home = tmp_path_factory.mktemp("cascade_home")
    with pytest.MonkeyPatch.context() as mp:
        # The repo's module-level sources read the env settings on first import.
        mp.setenv("CASCADE_HOME", str(home))
        mp.delenv("CASCADE_PROFILE", raising=False)
        settings = load_settings()
        write_ctr_lake(Lake(settings.lake_root), DS)
        yield settings


@pytest.fixture(scope="module")
def applied(settings: Settings) -> dict:
    return fs.apply_and_materialize(DS, settings=settings)


def test_online_lookups_return_latest_values_until_ds(settings: Settings, applied: dict) -> None:
    store = fs.feature_store(settings)
    user, per_genre = fs.online_user_features(store, 1, ["Drama", "Comedy"])
    # 09-29 is the newest snapshot before ds midnight; the 2026-02-01 row is after ds.
    assert user == {"user_impressions": 9.0, "user_clicks": 4.0, "user_ctr": 0.44, "user_age": 30.0}
    assert per_genre["Drama"] == {"ug_impressions": 5.0, "ug_clicks": 2.0, "ug_ctr": 0.4}
    assert all(math.isnan(v) for v in per_genre["Comedy"].values())
    unknown_user, _ = fs.online_user_features(store, 12345, [])
    assert all(math.isnan(v) for v in unknown_user.values())

    items = fs.online_item_features(store, [10, 11, 99])
    assert items.index.tolist() == [10, 11, 99]
    assert items.loc[10, "item_impressions"] == 8.0
    assert items.loc[10, "item_ctr"] == pytest.approx(0.375)
    assert items.loc[11, "item_genre"] == "Comedy"
    assert math.isnan(items.loc[11, "item_release_year"])
    assert items.loc[99].drop("item_genre").isna().all() and items.loc[99, "item_genre"] is None


def test_online_user_reader_answers_like_get_online_features(
    settings: Settings, applied: dict
) -> None:
    store = fs.feature_store(settings)
    reader = fs.OnlineUserReader(store)
    generic = fs.OnlineUserReader(store, fast_path=False)
    assert reader.sqlite is not None and generic.sqlite is None  # the local profile's SQLite
    for user_id, genres in ((1, ["Drama", "Comedy", "Drama"]), (2, ["Drama"]), (12345, ["Drama"])):
        expected = fs.online_user_features(store, user_id, genres)
        for answer in (reader, reader, generic):  # twice: the second from decoded values
            got = answer.user_features(user_id, genres)
            assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert reader.sqlite.keys_match_feast()
    user, per_genre = reader.user_features(1, ["Drama", "Comedy"])
    assert user["user_impressions"] == 9.0 and per_genre["Drama"]["ug_ctr"] == pytest.approx(0.4)
    assert all(math.isnan(v) for v in per_genre["Comedy"].values())
    assert reader.user_features(1, []) == (user, {})


def test_apply_and_materialize_result_and_idempotence(settings: Settings, applied: dict) -> None:
    assert applied == {
        "ds": DS,
        "feature_views": ["user_stats", "item_stats", "user_genre_stats"],
        "feature_service": "preranking_v1",
        "materialized_until": "2026-01-15T00:00:00+00:00",
    }
    store = fs.feature_store(settings)
    before = fs.online_item_features(store, [10, 11])
    again = fs.apply_and_materialize(DS, settings=settings)
    assert again == applied
    store = fs.feature_store(settings)
    pd.testing.assert_frame_equal(fs.online_item_features(store, [10, 11]), before)
    assert sorted(v.name for v in store.list_feature_views()) == [
        "item_stats", "user_genre_stats", "user_stats"
    ]  # fmt: skip
    assert [s.name for s in store.list_feature_services()] == ["preranking_v1"]


def test_feature_service_is_versioned_and_holds_the_three_views(
    settings: Settings, applied: dict
) -> None:
    service = fs.feature_store(settings).get_feature_service("preranking_v1")
    assert service.tags["version"] == "1"
    by_view = {p.name: [f.name for f in p.features] for p in service.feature_view_projections}
    assert by_view == {
        "user_stats": ["user_impressions", "user_clicks", "user_ctr", "user_age"],
        "item_stats": [
            "item_impressions", "item_clicks", "item_ctr", "item_release_year", "item_genre"
        ],
        "user_genre_stats": ["ug_impressions", "ug_clicks", "ug_ctr"],
    }  # fmt: skip
    ug = fs.feature_store(settings).get_feature_view("user_genre_stats")
    assert sorted(ug.entities) == ["genre", "user"]


def test_everything_lives_under_cascade_home(settings: Settings, applied: dict) -> None:
    store = fs.feature_store(settings)
    home = settings.home
    assert (home / "feast" / "registry.db").is_file()
    assert (home / "feast" / "online_store.db").is_file()
    assert str(home) in store.config.registry.path
    lake = Lake(settings.lake_root)
    paths = {v.name: v.batch_source.path for v in store.list_feature_views()}
    assert paths == {
        "user_stats": str(lake.ctr_features("user", DS)),
        "item_stats": str(lake.ctr_features("item", DS)),
        "user_genre_stats": str(lake.ctr_features("user_genre", DS)),
    }


def test_cli_materialize_prints_the_result(
    settings: Settings, applied: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CASCADE_HOME", str(settings.home))
        fs.main(["materialize", "--ds", DS])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == applied


def test_missing_partition_names_the_path_and_the_fix(tmp_path: Path) -> None:
    empty = Settings(home=tmp_path)
    with pytest.raises(FileNotFoundError, match="no job writes them any more") as err:
        fs.apply_and_materialize("2026-01-16", settings=empty)
    assert str(tmp_path) in str(err.value)
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        fs.apply_and_materialize("2026/01/16", settings=empty)


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
    from cascade.data_services import spark_secret_file
    from cascade.state import write_secret

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setenv("CASCADE_PROFILE", "cluster")
    monkeypatch.setenv("CASCADE_REDIS", "127.0.0.1:6379")
    monkeypatch.setenv("CASCADE_FEAST_REGISTRY_URL", "postgresql://feast@127.0.0.1/feast")
    settings = load_settings()
    assert settings.spark_master == settings.stack_spark_master
    write_secret(spark_secret_file(settings), "sesame")
    conf = fs.repo_config(settings).offline_store.spark_conf
    assert conf["spark.master"] == settings.stack_spark_master
    assert conf["spark.authenticate"] == "true" and conf["spark.authenticate.secret"] == "sesame"
    assert conf["spark.eventLog.enabled"] == "true"
    assert "sesame" not in fs.feature_store_yaml("cluster").read_text()


def test_the_cluster_profile_materializes_from_spark_executors(tmp_path: Path) -> None:
    assert fs.default_materialize_engine(Settings(home=tmp_path)) == "bulk"
    cluster = Settings(home=tmp_path, profile="cluster")
    assert fs.default_materialize_engine(cluster) == "spark"
    # The kernel starts no Spark: without the executors' loader the call says what to pass.
    with pytest.raises(ValueError, match="loader=jobs.online_materialize.SparkViewLoader"):
        fs.materialize_cross(DS, settings=cluster)
    with pytest.raises(ValueError, match="engine must be one of"):
        fs.materialize_cross(DS, settings=cluster, engine="dask")
