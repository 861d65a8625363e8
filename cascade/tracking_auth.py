"""The credentials of the local stack's MLflow tracking server.

The local stack runs MLflow with its basic-auth app: a request without a valid user is refused
(401), so nobody else on the host can create a registry version or move ``champion``. The
``admin`` user's password and the app's signing key are generated at the first ``cascade up``
into one secret file of the state folder (0600, like the Airflow password); the server's auth
configuration and its user database sit beside it.

Besides the admin (the operator: ``cascade release``/``rollback``, the stack's own set-up) the
server has one user per role (:data:`ROLES`), each with its own password in its own 0600 file
under ``mlflow/roles/``, created and granted at every start of the server
(:func:`ensure_role_users`, idempotent):

- ``reader`` (the model servers, the monitor): READ on every experiment and registered model;
- ``writer`` (Airflow tasks, training launches): EDIT on experiments (runs, metrics,
  artifacts), READ on registered models: it creates no version and moves no alias;
- ``promoter`` (the promotion gate only): MANAGE on registered models (registers versions,
  moves ``challenger`` and ``champion``), READ on experiments. No service's environment holds
  it: the gate's code reads its file when it registers (:func:`acting_as`).

MLflow's own permission model decides: setting an alias needs EDIT on the registered model,
and so does creating a version, so registration and promotion are one role.

MLflow's clients read ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` from the
environment on every request. The stack hands each service its own role's (:func:`role_env`);
:func:`use_tracking_credentials` exports a role's (or, in an operator's process, the admin's)
when its tracking URI is the local stack's. Summaries, status lines and logs name the file,
never the password.

Another tracking URI (the cluster profile's shared server, a SQLite store) is left alone:
whatever credentials its environment carries are MLflow's to use.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from cascade.config import Settings, scoped_environ
from cascade.state import narrow_secret, secure_state_folder, write_secret

log = logging.getLogger(__name__)

ADMIN_USER = "admin"
USERNAME_VAR = "MLFLOW_TRACKING_USERNAME"
PASSWORD_VAR = "MLFLOW_TRACKING_PASSWORD"
READER, WRITER, PROMOTER = "reader", "writer", "promoter"
ROLES: dict[str, dict[str, str]] = {
    READER: {"experiment": "READ", "registered_model": "READ"},
    WRITER: {"experiment": "EDIT", "registered_model": "READ"},
    PROMOTER: {"experiment": "READ", "registered_model": "MANAGE"},
}
"""Each role's grants, on every resource of a type (MLflow's ``*`` pattern)."""
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


def role_file(settings: Settings, role: str) -> Path:
    """The secret file (0600) of one role's MLflow user: its name and password."""
    if role not in ROLES:
        raise ValueError(f"unknown MLflow role {role!r}: choose one of {', '.join(ROLES)}")
    return mlflow_dir(settings) / "roles" / f"{role}.json"


def role_username(role: str) -> str:
    return f"cascade-{role}"


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


def role_credentials(settings: Settings, role: str) -> tuple[str, str] | None:
    """(username, password) of one role's user; None before the first start."""
    stored = _read(role_file(settings, role))
    password = stored.get("password")
    return (stored.get("username", role_username(role)), password) if password else None


def role_env(settings: Settings, role: str | None) -> dict[str, str]:
    """The variables a service of ``role`` authenticates with (None: no MLflow access at all;
    empty for another tracking URI or before the first start)."""
    if role is None or not is_stack_tracking(settings):
        return {}
    found = role_credentials(settings, role)
    if found is None:
        return {}
    return {USERNAME_VAR: found[0], PASSWORD_VAR: found[1]}


def _holds_stack_credential(settings: Settings) -> bool:
    """Whether this process's environment already carries a user of this stack (one the stack
    handed it), so that an operator's admin does not replace a service's narrower role."""
    held = (os.environ.get(USERNAME_VAR), os.environ.get(PASSWORD_VAR))
    return any(role_credentials(settings, role) == held for role in ROLES)


def use_tracking_credentials(settings: Settings, role: str | None = None) -> bool:
    """Export the local stack's MLflow credentials into this process's environment when the
    settings point at it; True if they were set.

    With ``role``, that role's user (a model server: :data:`READER`). Without, a credential of
    this stack the process already holds is kept (a task keeps the writer the stack gave it);
    otherwise the admin's is exported (an operator's process: the CLI). The files are the truth
    for that server: a value inherited from elsewhere (another state folder) is replaced."""
    if role is None and is_stack_tracking(settings) and _holds_stack_credential(settings):
        return True
    found = tracking_credentials_env(settings) if role is None else role_env(settings, role)
    os.environ.update(found)
    return bool(found)


@contextlib.contextmanager
def acting_as(settings: Settings, role: str) -> Iterator[bool]:
    """Run the block with ``role``'s credential (read from its file, never from the
    environment), then restore the process's own; yields whether the credential was found.

    MLflow's clients read the variables on every request, so a client made before the block
    authenticates as ``role`` inside it. The file is the role's wherever it is: the local
    stack writes it; a cluster mounts the promoter's Secret there only on the promotion step's
    workers. Without the file the block runs with the process's own credential."""
    creds = role_credentials(settings, role)
    found = {} if creds is None else {USERNAME_VAR: creds[0], PASSWORD_VAR: creds[1]}
    with scoped_environ(found):
        yield bool(found)


def ensure_role_passwords(settings: Settings) -> None:
    """Write each role's secret file (0600) once; a file others could read gets a new password
    (the old one may have been read)."""
    for role in ROLES:
        path = role_file(settings, role)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        stored = _read(path)
        exposed = narrow_secret(path)
        if exposed or "password" not in stored:
            fresh = {"username": role_username(role), "password": secrets.token_urlsafe(24)}
            write_secret(path, json.dumps(fresh) + "\n")
            if exposed:
                log.warning("%s was readable by others; the %s role has a new password", path, role)


def ensure_role_users(settings: Settings) -> list[str]:
    """Create (or bring up to date) each role's user and grants in the auth database, with
    MLflow's own permission store; idempotent. Returns the usernames. Run before the server
    starts: a password changed here reaches a running server once its cache of the old one
    expires (:data:`AUTH_CACHE_TTL_S`)."""
    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

    ensure_role_passwords(settings)
    store = SqlAlchemyStore()
    store.init_db(f"sqlite:///{auth_database(settings)}")
    names = []
    for role, grants in ROLES.items():
        found = role_credentials(settings, role)
        assert found is not None  # written just above
        username, password = found
        if not store.has_user(username):
            store.create_user(username, password)
        elif not store.authenticate_user(username, password):
            store.update_user(username, password=password)
        for resource_type, permission in grants.items():
            store.grant_user_permission(username, resource_type, "*", permission)
        names.append(username)
    return names


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
    ensure_role_passwords(settings)
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
