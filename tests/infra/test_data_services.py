"""The cluster profile's data services without starting them: which profile starts them, how
they are started (loopback, no socket file, never as root), and where clients find them."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from cascade import data_services
from cascade.config import FeatureStoreSettings, Ports, Settings
from domains.ctr.feature_store import repo_config
from infra import services, stack


def test_only_the_cluster_profile_starts_postgres_and_redis_and_starts_them_first(
    tmp_path: Path,
) -> None:
    local = services.stack_services(Settings(home=tmp_path))
    assert not set(services.CLUSTER_SERVICES) & set(local)
    assert local == ("broker", "mlflow", "airflow", "serving", "asr_serving")
    cluster = services.stack_services(Settings(home=tmp_path, profile="cluster"))
    assert cluster[:2] == ("postgres", "redis") and set(local) < set(cluster)


def test_the_services_listen_on_loopback_only_and_postgres_never_runs_as_root(
    tmp_path: Path,
) -> None:
    settings = Settings(home=tmp_path, profile="cluster", ports=Ports(postgres=25999))
    specs = services.service_specs(settings)
    command = specs["postgres"].command
    assert "listen_addresses=127.0.0.1" in command and "unix_socket_directories=" in command
    assert "port=25999" in command
    if os.geteuid() == 0:
        assert Path(command[0]).name == "unshare" and "--map-user=0" not in command
    services.prepare_redis(settings)
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
    superuser = data_services.ensure_postgres_password(settings)
    assert data_services.ensure_postgres_password(settings) == superuser  # kept, not rotated
    roles = data_services.ensure_postgres_role_passwords(settings)
    assert data_services.ensure_postgres_role_passwords(settings) == roles
    assert len({superuser, *roles.values()}) == 1 + len(data_services.DATABASES)
    # Each client signs in as its own database's role, never as the superuser.
    assert data_services.postgres_url(settings) == (
        f"postgresql://cascade_ledger:{roles['cascade']}@127.0.0.1:25999/cascade"
    )
    redis_password = data_services.ensure_redis_password(settings)
    config = repo_config(settings)
    assert config.online_store.connection_string == f"127.0.0.1:26999,password={redis_password}"
    assert config.registry.path == (
        f"postgresql+psycopg2://cascade_feast:{roles['feast']}@127.0.0.1:25999/feast"
    )
    assert superuser not in config.registry.path
    assert data_services.superuser_postgres_url(settings).startswith("postgresql://cascade:")
    with pytest.raises(ValueError, match="no role for database 'postgres'"):
        data_services.stack_postgres_url(settings, "postgres")
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


def test_the_cluster_airflow_keeps_its_metadata_in_postgres_and_its_tasks_on_celery_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra import airflow_cluster

    local = Settings(home=tmp_path / "local")
    env = services.airflow_env(local)
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("sqlite:///")
    assert not any(key.startswith("AIRFLOW__CELERY") for key in env)
    assert services.service_specs(local)["airflow"].command[-1] == "infra.airflow_local"

    cluster = Settings(
        home=tmp_path / "cluster", profile="cluster", ports=Ports(postgres=25999, redis=26999)
    )
    assert airflow_cluster.cluster_env(cluster) == {}  # no passwords yet: nothing to point at
    superuser = data_services.ensure_postgres_password(cluster)
    password = data_services.ensure_postgres_role_passwords(cluster)["airflow"]
    redis_password = data_services.ensure_redis_password(cluster)
    env = services.airflow_env(cluster)
    metadata = f"postgresql+psycopg2://cascade_airflow:{password}@127.0.0.1:25999/airflow"
    # The superuser's password is in no Airflow or Celery environment.
    assert not any(superuser in value for value in env.values())
    assert "airflow" in data_services.DATABASES
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == metadata
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"] == f"redis://:{redis_password}@127.0.0.1:26999/1"
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == f"db+{metadata}"
    # Two workers with one slot each make the default parallelism of 2.
    assert env["AIRFLOW__CELERY__WORKER_CONCURRENCY"] == "1"
    spec = services.service_specs(cluster)["airflow"]
    assert spec.command[-1] == "infra.airflow_cluster"
    workers = airflow_cluster.worker_commands(cluster)
    assert list(workers) == ["cascade-worker-1", "cascade-worker-2", "cascade-promoter"]
    for name, command in workers.items():
        assert command[command.index("--celery-hostname") + 1] == f"{name}@127.0.0.1"
        assert command[command.index("--pid") + 1].endswith(f"{name}.celery.pid")
        assert "--skip-serve-logs" in command
    # Passwords reach the processes through their environment only.
    for command in [spec.command, *workers.values()]:
        assert not any(password in part or redis_password in part for part in command)
    # The tasks of a worker record its name as their host.
    monkeypatch.setenv(airflow_cluster.NODE_ENV, "cascade-worker-2")
    assert airflow_cluster.node_name() == "cascade-worker-2"
    monkeypatch.delenv(airflow_cluster.NODE_ENV)
    assert airflow_cluster.node_name() == socket.getfqdn()
