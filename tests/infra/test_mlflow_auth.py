"""The local stack's MLflow refuses requests without its admin's credentials (so nobody else on
the host can register a version or move ``champion``); the credentials are generated once into
a 0600 file of the state folder and reach the project's clients, never a log."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from cascade.config import PORT_NAMES, Settings, load_settings
from cascade.tracking_auth import (
    PASSWORD_VAR,
    USERNAME_VAR,
    auth_config_file,
    credentials_file,
    ensure_tracking_credentials,
    tracking_credentials,
    tracking_credentials_env,
    use_tracking_credentials,
)
from infra import services, stack

MODEL = "auth-probe"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("CASCADE_MLFLOW_URI", raising=False)
    for name, port in zip(PORT_NAMES, stack.free_ports(len(PORT_NAMES)), strict=True):
        monkeypatch.setenv(f"CASCADE_{name.upper()}_PORT", str(port))
    return load_settings()


def test_credentials_are_written_0600_once_and_replaced_when_exposed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = os.umask(0)  # the most permissive umask: only our own modes protect the file
    try:
        path = ensure_tracking_credentials(settings)
    finally:
        os.umask(old)
    assert path == credentials_file(settings)
    assert mode(settings.home) == 0o700 and mode(path) == 0o600
    found = tracking_credentials(settings)
    assert found is not None and found[0] == "admin" and len(found[1]) >= 24
    ensure_tracking_credentials(settings)
    assert tracking_credentials(settings) == found, "a second start keeps the password"
    config = auth_config_file(settings).read_text()
    assert "default_permission = NO_PERMISSIONS" in config and found[1] not in config
    assert path in stack.secret_files(settings)
    assert stack.world_readable_secrets(settings) == []
    path.chmod(0o644)
    assert stack.world_readable_secrets(settings) == [path]
    ensure_tracking_credentials(settings)
    renewed = tracking_credentials(settings)
    assert mode(path) == 0o600 and renewed is not None and renewed[1] != found[1]

    # Exported for the local stack's URI (replacing a value inherited from elsewhere) ...
    monkeypatch.setenv(PASSWORD_VAR, "another-stack's")
    assert use_tracking_credentials(settings)
    assert os.environ[USERNAME_VAR] == "admin" and os.environ[PASSWORD_VAR] == renewed[1]
    # ... and never for another tracking server.
    monkeypatch.setenv("CASCADE_MLFLOW_URI", "http://mlflow.cascade.svc:5000")
    assert tracking_credentials_env(load_settings()) == {}
    monkeypatch.setenv("CASCADE_MLFLOW_URI", f"sqlite:///{settings.home / 'mlflow.db'}")
    assert tracking_credentials_env(load_settings()) == {}


@pytest.fixture(scope="module")
def mlflow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    with stack.private_stack(
        tmp_path_factory.mktemp("mlflow-auth-home"), services=("mlflow",)
    ) as settings:
        yield settings


def api(settings: Settings, path: str) -> str:
    return f"{settings.tracking_uri}/api/2.0/mlflow/{path}"


def test_the_stack_mlflow_refuses_requests_without_the_admin_credentials(
    mlflow_stack: Settings,
) -> None:
    settings = mlflow_stack
    found = tracking_credentials(settings)
    assert found is not None
    path = credentials_file(settings)
    assert mode(path) == 0o600 and mode(settings.home) == 0o700
    assert stack.world_readable_secrets(settings) == []
    assert requests.get(f"{settings.tracking_uri}/health", timeout=60).status_code == 200

    create = {"name": MODEL}
    for auth in (None, ("admin", "wrong-password"), ("someone", found[1])):
        response = requests.post(
            api(settings, "registered-models/create"), json=create, auth=auth, timeout=60
        )
        assert response.status_code == 401, (auth and auth[0], response.text[:200])
    # Nobody signs themselves up either.
    response = requests.post(
        api(settings, "users/create"),
        json={"username": "intruder", "password": "a-password-of-some-length"},
        timeout=60,
    )
    assert response.status_code == 401

    response = requests.post(
        api(settings, "registered-models/create"), json=create, auth=found, timeout=60
    )
    assert response.status_code == 200, response.text[:300]
    response = requests.post(
        api(settings, "runs/create"), json={"experiment_id": "0"}, auth=found, timeout=60
    )
    assert response.status_code == 200, response.text[:300]
    run_id = response.json()["run"]["info"]["run_id"]
    response = requests.post(
        api(settings, "model-versions/create"),
        json={"name": MODEL, "source": f"runs:/{run_id}/model", "run_id": run_id},
        auth=found,
        timeout=60,
    )
    assert response.status_code == 200, response.text[:300]
    version = response.json()["model_version"]["version"]

    alias = {"name": MODEL, "alias": "champion", "version": version}
    response = requests.post(api(settings, "registered-models/alias"), json=alias, timeout=60)
    assert response.status_code == 401
    lookup = {"name": MODEL, "alias": "champion"}
    response = requests.get(api(settings, "registered-models/alias"), params=lookup, timeout=60)
    assert response.status_code == 401

    def aliases() -> list[dict]:
        response = requests.get(
            api(settings, "registered-models/get"), params={"name": MODEL}, auth=found, timeout=60
        )
        assert response.status_code == 200, response.text[:300]
        return response.json()["registered_model"].get("aliases", [])

    assert aliases() == [], "the refused alias move must not have happened"
    response = requests.post(
        api(settings, "registered-models/alias"), json=alias, auth=found, timeout=60
    )
    assert response.status_code == 200, response.text[:300]
    assert aliases() == [{"alias": "champion", "version": version}]


def test_the_project_clients_authenticate_and_no_log_holds_the_password(
    mlflow_stack: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow
    from mlflow.exceptions import MlflowException

    from cascade.registry import ensure_registered_model, registry_client, version_by_alias

    settings = mlflow_stack
    found = tracking_credentials(settings)
    assert found is not None
    # private_stack hands this process the credentials, as it hands them to each service.
    assert os.environ[USERNAME_VAR] == found[0] and os.environ[PASSWORD_VAR] == found[1]
    assert services.service_env(settings)[PASSWORD_VAR] == found[1]

    client = registry_client(settings)
    ensure_registered_model(client, "auth-client-probe", "client check")
    assert version_by_alias(client, "auth-client-probe", "champion") is None

    # Without them MLflow's own client is refused; the project's client takes them from the
    # state folder (its settings point at the stack's server).
    monkeypatch.delenv(USERNAME_VAR)
    monkeypatch.delenv(PASSWORD_VAR)
    bare = mlflow.MlflowClient(settings.tracking_uri, registry_uri=settings.tracking_uri)
    with pytest.raises(MlflowException, match="401"):
        bare.get_registered_model("auth-client-probe")
    again = registry_client(load_settings())
    assert again.get_registered_model("auth-client-probe").name == "auth-client-probe"
    assert os.environ[PASSWORD_VAR] == found[1]

    time.sleep(0.5)  # the server's log lines are flushed by line; let the last ones land
    for folder in (settings.logs_dir, settings.home / "run"):
        for path in folder.iterdir():
            assert found[1] not in path.read_text(errors="replace"), path
    status = json.dumps([s.__dict__ for s in stack.status(settings)], default=str)
    assert found[1] not in status
