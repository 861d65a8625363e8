from pathlib import Path

import pytest

from cascade.config import Ports, Settings, load_settings


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
            "CASCADE_PROMOTION_TOLERANCE": "0.01",
        }
    )
    assert settings.ports.broker == 31000
    assert settings.bootstrap_servers == "127.0.0.1:31000"
    assert settings.tracking_uri == "sqlite:///x.db"
    assert settings.promotion_tolerance == 0.01


def test_cluster_profile_points_at_shared_services() -> None:
    settings = load_settings({"CASCADE_PROFILE": "cluster"})
    assert settings.profile == "cluster"
    assert "127.0.0.1" not in settings.bootstrap_servers
    assert settings.spark_master.startswith("k8s://")


@pytest.mark.parametrize(
    "env, message",
    [
        ({"CASCADE_PROFILE": "prod"}, "not a profile"),
        ({"CASCADE_BROKER_PORT": "80"}, "CASCADE_BROKER_PORT"),
        ({"CASCADE_BROKER_PORT": "25000"}, "ports must differ"),
        ({"CASCADE_PROMOTION_TOLERANCE": "2"}, "promotion_tolerance"),
    ],
)
def test_bad_configuration_names_the_setting(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_settings(env)


def test_settings_reject_unknown_profile() -> None:
    with pytest.raises(ValueError, match="unknown profile"):
        Settings(profile="staging")
    assert Ports().serving == 28081


def test_preranking_model_is_fscd_unless_the_environment_says_mlp() -> None:
    assert load_settings({}).preranking_model == "fscd"
    assert load_settings({"CASCADE_PRERANKING_MODEL": "mlp"}).preranking_model == "mlp"
    with pytest.raises(ValueError, match="CASCADE_PRERANKING_MODEL"):
        load_settings({"CASCADE_PRERANKING_MODEL": "dcn"})
