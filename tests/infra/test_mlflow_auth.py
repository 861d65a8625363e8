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

from cascade.config import PORT_NAMES, Settings, load_settings, scoped_environ
from cascade.tracking_auth import (
    PASSWORD_VAR,
    PROMOTER,
    READER,
    ROLES,
    USERNAME_VAR,
    WRITER,
    acting_as,
    auth_config_file,
    credentials_file,
    ensure_tracking_credentials,
    role_credentials,
    role_file,
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
    # A service gets its own role's credential, never the admin's.
    assert PASSWORD_VAR not in services.service_env(settings)
    reader = role_credentials(settings, READER)
    assert services.service_env(settings, READER)[PASSWORD_VAR] == reader[1]  # type: ignore[index]

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
    passwords = [found[1], *(role_credentials(settings, role)[1] for role in ROLES)]  # type: ignore[index]
    status = json.dumps([s.__dict__ for s in stack.status(settings)], default=str)
    for password in passwords:
        for folder in (settings.logs_dir, settings.home / "run"):
            for path in folder.iterdir():
                assert password not in path.read_text(errors="replace"), path
        assert password not in status


def test_each_service_environment_holds_only_its_own_role(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_tracking_credentials(settings)
    admin = tracking_credentials(settings)
    creds = {role: role_credentials(settings, role) for role in ROLES}
    assert admin is not None and all(creds.values())
    assert len({admin[1], *(c[1] for c in creds.values() if c)}) == 4, "one password per user"
    for role in ROLES:
        assert mode(role_file(settings, role)) == 0o600
        assert role_file(settings, role) in stack.secret_files(settings)
    # An admin credential in the caller's environment reaches no service.
    monkeypatch.setenv(USERNAME_VAR, admin[0])
    monkeypatch.setenv(PASSWORD_VAR, admin[1])
    specs = services.service_specs(settings)
    held = {name: spec.env.get(USERNAME_VAR) for name, spec in specs.items()}
    reader, writer = creds[READER], creds[WRITER]
    assert reader is not None and writer is not None
    assert held == {
        name: {READER: reader[0], WRITER: writer[0], None: None}[services.SERVICE_ROLES[name]]
        for name in specs
    }
    assert held["airflow"] == writer[0] and held["serving"] == held["asr_serving"] == reader[0]
    promoter = creds[PROMOTER]
    assert promoter is not None
    for name, spec in specs.items():
        secrets_held = {v for k, v in spec.env.items() if k != "MLFLOW_AUTH_ADMIN_PASSWORD"}
        assert promoter[1] not in secrets_held, name
        assert admin[1] not in secrets_held, name
    assert specs["mlflow"].env["MLFLOW_AUTH_ADMIN_PASSWORD"] == admin[1]

    # The promotion gate's code takes the promoter's from its file for the block only.
    monkeypatch.setenv(USERNAME_VAR, writer[0])
    monkeypatch.setenv(PASSWORD_VAR, writer[1])
    with acting_as(settings, PROMOTER) as found:
        assert found and os.environ[PASSWORD_VAR] == promoter[1]
    assert os.environ[PASSWORD_VAR] == writer[1]
    # A process that holds a role of this stack keeps it; a server asks for the reader.
    assert use_tracking_credentials(settings) and os.environ[PASSWORD_VAR] == writer[1]
    assert use_tracking_credentials(settings, READER) and os.environ[PASSWORD_VAR] == reader[1]
    with pytest.raises(ValueError, match="unknown MLflow role"):
        role_file(settings, "superuser")


def test_roles_are_enforced_by_the_stack_mlflow(mlflow_stack: Settings, tmp_path: Path) -> None:
    """The reader and the writer are refused (403) an alias move and a new version; the
    promoter registers and moves ``champion``; the writer writes runs, the reader reads."""
    import mlflow
    from mlflow.exceptions import MlflowException

    settings = mlflow_stack
    admin = tracking_credentials(settings)
    reader, writer, promoter = (role_credentials(settings, r) for r in (READER, WRITER, PROMOTER))
    assert admin and reader and writer and promoter
    name = "roles-probe"

    def post(path: str, body: dict, auth: tuple[str, str]) -> requests.Response:
        return requests.post(api(settings, path), json=body, auth=auth, timeout=60)

    response = post("registered-models/create", {"name": name}, promoter)
    assert response.status_code == 200, response.text[:300]
    response = post("runs/create", {"experiment_id": "0"}, writer)
    assert response.status_code == 200, response.text[:300]
    run_id = response.json()["run"]["info"]["run_id"]
    # The writer uploads the run's files through the server, the reader (a model server)
    # downloads them; the reader uploads nothing.
    client = mlflow.MlflowClient(settings.tracking_uri, registry_uri=settings.tracking_uri)
    with scoped_environ({USERNAME_VAR: writer[0], PASSWORD_VAR: writer[1]}):
        client.log_text(run_id, "weights", "model/weights.txt")
    with scoped_environ({USERNAME_VAR: reader[0], PASSWORD_VAR: reader[1]}):
        folder = client.download_artifacts(run_id, "model", str(tmp_path))
        assert (Path(folder) / "weights.txt").read_text() == "weights"
        with pytest.raises((MlflowException, requests.HTTPError), match="403"):
            client.log_text(run_id, "planted", "model/planted.txt")
    assert post("runs/create", {"experiment_id": "0"}, reader).status_code == 403
    version_body = {"name": name, "source": f"runs:/{run_id}/model", "run_id": run_id}
    for refused in (reader, writer):
        response = post("model-versions/create", version_body, refused)
        assert response.status_code == 403, (refused[0], response.text[:300])
    response = post("model-versions/create", version_body, promoter)
    assert response.status_code == 200, response.text[:300]
    version = response.json()["model_version"]["version"]

    alias = {"name": name, "alias": "champion", "version": version}
    for refused in (reader, writer):
        response = post("registered-models/alias", alias, refused)
        assert response.status_code == 403, (refused[0], response.text[:300])
    response = requests.get(
        api(settings, "registered-models/get"), params={"name": name}, auth=reader, timeout=60
    )
    assert response.status_code == 200 and not response.json()["registered_model"].get("aliases")
    assert post("registered-models/alias", alias, promoter).status_code == 200
    response = requests.get(
        api(settings, "registered-models/alias"),
        params={"name": name, "alias": "champion"},
        auth=reader,
        timeout=60,
    )
    assert response.status_code == 200, response.text[:300]
    assert response.json()["model_version"]["version"] == version
