import json
import warnings
from pathlib import Path

import pytest

from cascade.config import (
    REPO_ROOT,
    Ports,
    Settings,
    SettingsError,
    UnknownSettingWarning,
    all_setting_fields,
    load_group,
    load_settings,
)
from cascade.config_report import (
    SETTINGS_PAGE,
    documented_table,
    render_markdown,
    settings_report,
)


def test_local_is_the_default_profile_with_loopback_services(tmp_path: Path) -> None:
    settings = load_settings({"CASCADE_HOME": str(tmp_path)})
    assert settings.profile == "local"
    assert settings.home == tmp_path.resolve()
    assert settings.lake_root == tmp_path.resolve() / "lake"
    assert settings.bootstrap_servers == "127.0.0.1:19092"
    assert settings.tracking_uri == "http://127.0.0.1:25000"


def test_environment_overrides_ports_and_services() -> None:
    settings = load_settings(
        {
            "CASCADE_BROKER_PORT": "31000",
            "CASCADE_MLFLOW_URI": "sqlite:///x.db",
        }
    )
    assert settings.ports.broker == 31000
    assert settings.bootstrap_servers == "127.0.0.1:31000"
    assert settings.tracking_uri == "sqlite:///x.db"


def test_cluster_profile_runs_its_own_stack_unless_hosts_are_named() -> None:
    settings = load_settings({"CASCADE_PROFILE": "cluster"})
    assert settings.profile == "cluster"
    # The stack on this machine: its own standalone master, three Kafka nodes and tracking server.
    assert settings.spark_master.startswith("spark://127.0.0.1:")
    ports = settings.ports
    assert settings.bootstrap_servers == (
        f"127.0.0.1:{ports.broker},127.0.0.1:{ports.broker_2},127.0.0.1:{ports.broker_3}"
    )
    assert settings.local_broker
    assert settings.serving.auth
    # Training spans two node ranks there of one process each; one node of two locally.
    assert (settings.train_nodes, settings.train_processes) == (2, 1)
    assert (load_settings({}).train_nodes, load_settings({}).train_processes) == (1, 2)
    # A real cluster names its hosts in the same variables.
    remote = load_settings(
        {"CASCADE_PROFILE": "cluster", "CASCADE_KAFKA_BOOTSTRAP": "kafka.cascade.svc:9092"}
    )
    assert remote.bootstrap_servers == "kafka.cascade.svc:9092"
    assert not remote.local_broker
    assert remote.kafka_client_config == {"bootstrap.servers": "kafka.cascade.svc:9092"}
    # SASL without its mechanism and user is a clear error, not a client that fails later.
    half = load_settings(
        {"CASCADE_KAFKA_BOOTSTRAP": "k:9093", "CASCADE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}
    )
    with pytest.raises(ValueError, match="CASCADE_KAFKA_SASL_MECHANISM"):
        _ = half.kafka_client_config


@pytest.mark.parametrize(
    "env, message",
    [
        ({"CASCADE_PROFILE": "prod"}, "CASCADE_PROFILE must be one of 'local' or 'cluster'"),
        ({"CASCADE_BROKER_PORT": "80"}, "CASCADE_BROKER_PORT must be >= 1024, got 80"),
        ({"CASCADE_BROKER_PORT": "25000"}, "ports must differ"),
        ({"CASCADE_TRAIN_PROCESSES": "0"}, "CASCADE_TRAIN_PROCESSES must be >= 1, got 0"),
    ],
)
def test_bad_configuration_names_the_setting(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_settings(env)


def test_settings_reject_unknown_profile() -> None:
    with pytest.raises(ValueError, match="'local' or 'cluster'"):
        Settings(profile="staging")
    assert Ports().serving == 28081


def test_a_bad_value_names_the_variable_and_the_fix() -> None:
    with pytest.raises(SettingsError) as err:
        load_settings({"CASCADE_SERVING_WORKERS": "0"})
    assert str(err.value) == (
        "CASCADE_SERVING_WORKERS must be >= 1, got 0; fix it or unset it for the default (1)"
    )
    with pytest.raises(SettingsError, match="CASCADE_COALESCE_WINDOW_S must be a finite number"):
        load_settings({"CASCADE_COALESCE_WINDOW_S": "soon"})
    with pytest.raises(SettingsError, match="CASCADE_SERVING_COMPILED must be 0 or 1, got yes"):
        load_settings({"CASCADE_SERVING_COMPILED": "yes"})
    with pytest.raises(SettingsError, match="CASCADE_CRASH_AT must be PHASE:STEP"):
        load_settings({"CASCADE_CRASH_AT": "train"})


def test_a_pipeline_group_validates_like_the_kernel() -> None:
    from pipelines.asr import AsrSettings

    assert load_group(AsrSettings, {"CASCADE_ASR_UTTERANCES": "40"}).utterances == 40
    assert load_group(AsrSettings, {"CASCADE_ASR_UTTERANCES": ""}).utterances is None
    with pytest.raises(SettingsError, match="^CASCADE_ASR_UTTERANCES must be >= 1, got 0;"):
        load_group(AsrSettings, {"CASCADE_ASR_UTTERANCES": "0"})


def test_values_come_from_environment_then_file_then_profile_then_default(
    tmp_path: Path,
) -> None:
    (tmp_path / "cascade.toml").write_text(
        'CASCADE_SERVING_POLL_S = 7.5\nCASCADE_SPARK_MASTER = "local[4]"\n'
        'CASCADE_PROFILE = "cluster"\n'
    )
    env = {"CASCADE_HOME": str(tmp_path), "CASCADE_SPARK_MASTER": "local[1]"}
    settings = load_settings(env)
    assert settings.serving.poll_s == 7.5
    assert settings.spark_master == "local[1]"
    assert settings.train_nodes == 2
    sources = {row["name"]: row["source"] for row in settings_report(env)}
    assert sources["CASCADE_SPARK_MASTER"] == "environment"
    assert sources["CASCADE_SERVING_POLL_S"] == "file"
    assert sources["CASCADE_TRAIN_NODES"] == "profile"
    assert sources["CASCADE_SERVING_WORKERS"] == "default"
    assert sources["CASCADE_ASR_CONFIG"] == "default"


def test_a_bad_value_in_the_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "cascade.toml").write_text("CASCADE_SERVING_WORKERS = 0\n")
    with pytest.raises(SettingsError, match=f"set in {tmp_path}/cascade.toml"):
        load_settings({"CASCADE_HOME": str(tmp_path)})


def test_an_unknown_variable_is_warned_about_once_with_the_closest_name() -> None:
    env = {"CASCADE_SERVING_WORKRES": "2", "CASCADE_ASR_CONFIG": "debug"}
    with pytest.warns(UnknownSettingWarning) as caught:
        load_settings(env)
    assert [str(w.message) for w in caught] == [
        "CASCADE_SERVING_WORKRES is not a Cascade setting; did you mean "
        "CASCADE_SERVING_WORKERS? (`cascade config` lists them)"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_settings(env)  # once per process; a pipeline's variable is known


def test_secrets_and_url_passwords_are_masked() -> None:
    env = {
        "CASCADE_PROFILE": "cluster",
        "CASCADE_REDIS": "redis.svc:6379,password=hunter2",
        "CASCADE_MLFLOW_URI": "https://ml:s3cret@mlflow.example/",
    }
    rows = {row["name"]: row for row in settings_report(env)}
    assert rows["CASCADE_REDIS"]["value"] == "********"
    assert rows["CASCADE_MLFLOW_URI"]["value"] == "https://ml:********@mlflow.example/"
    assert "hunter2" not in json.dumps(list(rows.values()))
    assert load_settings(env).feature_store.redis.endswith("hunter2")


def test_cascade_config_json_lists_every_variable_with_its_source(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cascade.cli import main

    monkeypatch.setenv("CASCADE_SERVING_WORKERS", "3")
    assert main(["config", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == {field.env for field in all_setting_fields()}
    assert rows["CASCADE_SERVING_WORKERS"] | {"group": None} == {
        "name": "CASCADE_SERVING_WORKERS",
        "group": None,
        "value": 3,
        "source": "environment",
        "default": 1,
        "secret": False,
        "hook": False,
    }
    assert rows["CASCADE_CRASH_AT"]["hook"] is True
    assert rows["CASCADE_MULTIMODAL_RECALL_TOLERANCE"]["group"] == "Pipeline multimodal"


def test_every_setting_is_documented() -> None:
    undocumented = [field.env for field in all_setting_fields() if not field.description]
    assert undocumented == []
    assert len({field.env for field in all_setting_fields()}) == len(all_setting_fields())


def test_the_settings_page_table_is_the_rendered_settings() -> None:
    page = SETTINGS_PAGE.read_text()
    assert SETTINGS_PAGE == REPO_ROOT / "docs" / "reference" / "settings.md"
    assert documented_table(page) == render_markdown(), (
        "docs/reference/settings.md's table is stale; run `cascade config --write-docs`"
    )
    for field in all_setting_fields():
        assert f"| `{field.env}` |" in page
