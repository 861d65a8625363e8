"""The credentials of the local stack's MLflow tracking server.

The local stack runs MLflow with its basic-auth app: a request without a valid user is refused
(401), so nobody else on the host can create a registry version or move ``champion``. The
``admin`` user's password and the app's signing key are generated at the first ``cascade up``
into one secret file of the state folder (0600, like the Airflow password); the server's auth
configuration and its user database sit beside it.

MLflow's clients read ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` from the
environment on every request. The stack hands them to each service it starts (and so to every
Airflow task and training launch); :func:`use_tracking_credentials` exports them in a process
of its own (the CLI, a model server started by hand) when its tracking URI is the local
stack's. Summaries, status lines and logs name the file, never the password.

Another tracking URI (the cluster profile's shared server, a SQLite store) is left alone:
whatever credentials its environment carries are MLflow's to use.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path

from cascade.config import Settings
from cascade.state import narrow_secret, secure_state_folder, write_secret

log = logging.getLogger(__name__)

ADMIN_USER = "admin"
USERNAME_VAR = "MLFLOW_TRACKING_USERNAME"
PASSWORD_VAR = "MLFLOW_TRACKING_PASSWORD"
DEFAULT_PERMISSION = "NO_PERMISSIONS"
"""What a signed-in user other than the admin may do on a resource nobody granted them."""
AUTH_CACHE_TTL_S = 120
"""How long the server trusts a password it checked. Each check is a deliberately slow hash
(a second of CPU on a loaded 2-core machine), paid by every registry call otherwise; the one
server process drops the entry when a password changes through its API."""


def mlflow_dir(settings: Settings) -> Path:
    """The tracking server's folder under the state folder (its stores, its auth files)."""
    return settings.home / "mlflow"


def credentials_file(settings: Settings) -> Path:
    """The secret file (0600): the admin's password and the auth app's signing key."""
    return mlflow_dir(settings) / "credentials.json"


def auth_config_file(settings: Settings) -> Path:
    """The basic-auth app's configuration (``MLFLOW_AUTH_CONFIG_PATH``); holds no secret."""
    return mlflow_dir(settings) / "basic_auth.ini"


def auth_database(settings: Settings) -> Path:
    """The basic-auth app's user and permission store."""
    return mlflow_dir(settings) / "basic_auth.db"


def stack_tracking_uri(settings: Settings) -> str:
    """The URI of the local stack's tracking server under these settings."""
    return f"http://{settings.host}:{settings.ports.mlflow}"


def is_stack_tracking(settings: Settings) -> bool:
    """Whether the settings' tracking URI is the local stack's server (whose credentials live
    in the state folder)."""
    return settings.tracking_uri.rstrip("/") == stack_tracking_uri(settings)


def _read(path: Path) -> dict[str, str]:
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(stored, dict):
        return {}
    return {k: v for k, v in stored.items() if isinstance(v, str) and v}


def tracking_credentials(settings: Settings) -> tuple[str, str] | None:
    """(username, password) of the local stack's MLflow; None before the first start."""
    stored = _read(credentials_file(settings))
    password = stored.get("password")
    return (stored.get("username", ADMIN_USER), password) if password else None


def tracking_credentials_env(settings: Settings) -> dict[str, str]:
    """The variables MLflow's clients authenticate with, for the local stack's tracking URI
    (empty for another URI, or before the first start)."""
    if not is_stack_tracking(settings):
        return {}
    found = tracking_credentials(settings)
    if found is None:
        return {}
    return {USERNAME_VAR: found[0], PASSWORD_VAR: found[1]}


def use_tracking_credentials(settings: Settings) -> bool:
    """Export the local stack's MLflow credentials into this process's environment when the
    settings point at it; True if they were set. The file is the truth for that server: a value
    inherited from elsewhere (another state folder) is replaced."""
    found = tracking_credentials_env(settings)
    os.environ.update(found)
    return bool(found)


def _rotate_admin_password(settings: Settings, password: str) -> None:
    """Give the existing admin user of the auth database ``password`` (a running server reads
    the store again once its cached check of the old one expires, :data:`AUTH_CACHE_TTL_S`)."""
    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore()
    store.init_db(f"sqlite:///{auth_database(settings)}")
    if store.has_user(ADMIN_USER):
        store.update_user(ADMIN_USER, password=password)


def ensure_tracking_credentials(settings: Settings) -> Path:
    """Write the credentials file (0600) and the auth configuration before MLflow starts.

    The password is generated once and kept. A credentials file that others could read gets a
    new password (the old one may have been read), which also replaces the admin's password in
    an existing auth database; services started before keep the old one until restarted."""
    secure_state_folder(settings.home)
    folder = mlflow_dir(settings)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = credentials_file(settings)
    stored = _read(path)
    exposed = narrow_secret(path)
    fresh = dict(stored)
    fresh.setdefault("username", ADMIN_USER)
    if exposed or "password" not in stored:
        fresh["password"] = secrets.token_urlsafe(24)
    if exposed or "flask_secret_key" not in stored:
        fresh["flask_secret_key"] = secrets.token_urlsafe(32)
    if fresh != stored:
        write_secret(path, json.dumps(fresh) + "\n")
    if exposed:
        log.warning(
            "%s was readable by others; it now holds a new MLflow admin password (0600); "
            "restart the stack's services (`cascade down && cascade up`)",
            path,
        )
        if auth_database(settings).exists():
            _rotate_admin_password(settings, fresh["password"])
    write_secret(
        auth_config_file(settings),
        "[mlflow]\n"
        f"default_permission = {DEFAULT_PERMISSION}\n"
        f"database_uri = sqlite:///{auth_database(settings)}\n"
        f"admin_username = {fresh['username']}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        f"auth_cache_ttl_seconds = {AUTH_CACHE_TTL_S}\n",
    )
    return path


def tracking_server_env(settings: Settings) -> dict[str, str]:
    """What the tracking server's process needs beyond the stack's environment: its auth
    configuration, the admin's password (used only to create the admin on the first start) and
    the app's signing key. Empty before :func:`ensure_tracking_credentials` wrote them (a
    server started so refuses to start, for want of its signing key)."""
    stored = _read(credentials_file(settings))
    if "password" not in stored or "flask_secret_key" not in stored:
        return {}
    return {
        "MLFLOW_AUTH_CONFIG_PATH": str(auth_config_file(settings)),
        "MLFLOW_AUTH_ADMIN_USERNAME": stored.get("username", ADMIN_USER),
        "MLFLOW_AUTH_ADMIN_PASSWORD": stored["password"],
        "MLFLOW_FLASK_SERVER_SECRET_KEY": stored["flask_secret_key"],
        "MLFLOW_BASIC_AUTH_FAIL_CLOSED": "true",
    }
