"""The cluster profile's data services without starting them: which profile starts them, how
they are started (loopback, no socket file, never as root), and where clients find them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cascade import data_services
from cascade.config import FeatureStoreSettings, Ports, Settings
from cascade.feature_store import repo_config
from infra import stack


def test_only_the_cluster_profile_starts_postgres_and_redis_and_starts_them_first(
    tmp_path: Path,
) -> None:
    local = stack.stack_services(Settings(home=tmp_path))
    assert not set(stack.CLUSTER_SERVICES) & set(local)
    assert local == ("broker", "mlflow", "airflow", "serving", "asr_serving")
    cluster = stack.stack_services(Settings(home=tmp_path, profile="cluster"))
    assert cluster[:2] == ("postgres", "redis") and set(local) < set(cluster)


def test_the_services_listen_on_loopback_only_and_postgres_never_runs_as_root(
    tmp_path: Path,
) -> None:
    settings = Settings(home=tmp_path, profile="cluster", ports=Ports(postgres=25999))
    specs = stack.service_specs(settings)
    command = specs["postgres"].command
    assert "listen_addresses=127.0.0.1" in command and "unix_socket_directories=" in command
    assert "port=25999" in command
    if os.geteuid() == 0:
        assert Path(command[0]).name == "unshare" and "--map-user=0" not in command
    stack.prepare_redis(settings)
    config = data_services.redis_config_file(settings)
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    lines = config.read_text().splitlines()
    assert "bind 127.0.0.1" in lines and f"port {settings.ports.redis}" in lines
    password = data_services.redis_password_file(settings).read_text().strip()
    assert f"requirepass {password}" in lines
    # The password is in the 0600 files only, never on a command line.
    assert not any(password in part for spec in specs.values() for part in spec.command)
    assert config in stack.secret_files(settings)
    assert stack.world_readable_secrets(settings) == []


def test_clients_find_the_stack_services_or_the_configured_ones(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, profile="cluster", ports=Ports(postgres=25999, redis=26999))
    with pytest.raises(FileNotFoundError, match="has not been started"):
        data_services.postgres_url(settings)
    password = data_services.ensure_postgres_password(settings)
    assert data_services.ensure_postgres_password(settings) == password  # kept, not rotated
    assert data_services.postgres_url(settings) == (
        f"postgresql://cascade:{password}@127.0.0.1:25999/cascade"
    )
    redis_password = data_services.ensure_redis_password(settings)
    config = repo_config(settings)
    assert config.online_store.connection_string == f"127.0.0.1:26999,password={redis_password}"
    assert config.registry.path == (
        f"postgresql+psycopg2://cascade:{password}@127.0.0.1:25999/feast"
    )
    elsewhere = Settings(
        home=tmp_path,
        profile="cluster",
        postgres_url="postgresql://ledger@db.example/cascade",
        feature_store=FeatureStoreSettings(
            redis="redis.example:6379", feast_registry_url="sqlite:///r.db"
        ),
    )
    assert data_services.postgres_url(elsewhere) == "postgresql://ledger@db.example/cascade"
    assert repo_config(elsewhere).online_store.connection_string == "redis.example:6379"
