"""Where the cluster profile's data services are and how to sign in to them.

The cluster stack (``CASCADE_PROFILE=cluster``, ``infra.stack``) runs its own PostgreSQL (the
event ledger, Feast's registry, MLflow's and Airflow's metadata), Redis (Feast's online store,
Airflow's Celery queues) and Spark standalone master and
workers on loopback, each with a data folder under the state folder and a password (Spark: a
shared authentication secret) generated at the first start into a secret file (0600, like the
Airflow and MLflow passwords). Clients build their connection from the same
files; summaries, status lines and logs name the files, never a password.

A URL in the settings (``CASCADE_POSTGRES_URL``, ``CASCADE_FEAST_REGISTRY_URL``,
``CASCADE_REDIS``) points at shared services elsewhere instead, and the files are not read.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

from cascade.config import Settings
from cascade.state import narrow_secret, secure_state_folder, write_secret

log = logging.getLogger(__name__)

POSTGRES_USER = "cascade"
LEDGER_DATABASE = "cascade"
FEAST_DATABASE = "feast"
MLFLOW_DATABASE = "mlflow"
AIRFLOW_DATABASE = "airflow"
DATABASES = (LEDGER_DATABASE, FEAST_DATABASE, MLFLOW_DATABASE, AIRFLOW_DATABASE)
"""Databases the stack's PostgreSQL creates at its first start."""
DATABASE_ROLES = {
    LEDGER_DATABASE: "cascade_ledger",
    FEAST_DATABASE: "cascade_feast",
    MLFLOW_DATABASE: "cascade_mlflow",
    AIRFLOW_DATABASE: "cascade_airflow",
}
"""The login role that owns each database and has no right on the others: each client's URL
carries its own database's role; the superuser (:data:`POSTGRES_USER`) is the stack's own, for
set-up and health checks, in no service's environment."""


def postgres_dir(settings: Settings) -> Path:
    """PostgreSQL's folder under the state folder: ``data/`` (the cluster) and its password."""
    return settings.home / "postgres"


def postgres_data_dir(settings: Settings) -> Path:
    return postgres_dir(settings) / "data"


def postgres_password_file(settings: Settings) -> Path:
    """The superuser's password (0600): ``initdb`` reads it, so it is never on a command line."""
    return postgres_dir(settings) / "password"


def postgres_role_password_file(settings: Settings, database: str) -> Path:
    """The password (0600) of ``database``'s own role (:data:`DATABASE_ROLES`)."""
    if database not in DATABASE_ROLES:
        raise ValueError(
            f"no role for database {database!r}: the stack's databases are "
            f"{', '.join(DATABASE_ROLES)}"
        )
    return postgres_dir(settings) / "roles" / database


def redis_dir(settings: Settings) -> Path:
    """Redis's folder under the state folder: ``data/``, its password and its configuration."""
    return settings.home / "redis"


def redis_password_file(settings: Settings) -> Path:
    return redis_dir(settings) / "password"


REDIS_READER = "cascade-reader"
"""The Redis ACL user of the model servers: read commands only. The default user (the Feast
online-store and feedback writers, Airflow's Celery queues) needs the stack's password."""


def redis_reader_password_file(settings: Settings) -> Path:
    return redis_dir(settings) / "reader-password"


def redis_config_file(settings: Settings) -> Path:
    """``redis.conf`` (0600: it holds ``requirepass``, which a command line would show)."""
    return redis_dir(settings) / "redis.conf"


def spark_dir(settings: Settings) -> Path:
    """The standalone Spark's folder: ``conf/`` (``spark-defaults.conf``, 0600: it holds the
    authentication secret), ``events/`` (every application's event log), ``worker-N/`` (each
    worker's application folders and executor logs), ``logs/``."""
    return settings.home / "spark"


def spark_secret_file(settings: Settings) -> Path:
    return spark_dir(settings) / "secret"


def spark_event_dir(settings: Settings) -> Path:
    return spark_dir(settings) / "events"


def _read_password(path: Path) -> str | None:
    try:
        password = path.read_text().strip()
    except OSError:
        return None
    return password or None


def _ensure_password(path: Path, *, what: str) -> str:
    """The password in ``path``, generated (0600) when absent. A file others could read keeps
    its password: the service was initialized with it (the caller refuses to start instead)."""
    secure_state_folder(path.parent)
    if narrow_secret(path):
        log.warning("%s was readable by others; narrowed to 0600 (%s)", path, what)
    password = _read_password(path)
    if password is None:
        password = secrets.token_urlsafe(24)
        write_secret(path, password + "\n")
    return password


def ensure_postgres_password(settings: Settings) -> str:
    return _ensure_password(postgres_password_file(settings), what="PostgreSQL superuser")


def ensure_postgres_role_passwords(settings: Settings) -> dict[str, str]:
    """Each database role's password (generated once, 0600): database -> password."""
    return {
        database: _ensure_password(
            postgres_role_password_file(settings, database), what=f"PostgreSQL role {role}"
        )
        for database, role in DATABASE_ROLES.items()
    }


def ensure_redis_password(settings: Settings) -> str:
    return _ensure_password(redis_password_file(settings), what="Redis")


def ensure_redis_reader_password(settings: Settings) -> str:
    return _ensure_password(redis_reader_password_file(settings), what="Redis reader")


def ensure_spark_secret(settings: Settings) -> str:
    return _ensure_password(spark_secret_file(settings), what="Spark authentication secret")


def _stack_password(path: Path, service: str) -> str:
    password = _read_password(path)
    if password is None:
        raise FileNotFoundError(
            f"{path} is missing: the cluster stack's {service} has not been started in this "
            "state folder (`CASCADE_PROFILE=cluster cascade up`), or set its URL setting"
        )
    return password


def stack_postgres_url(settings: Settings, database: str = LEDGER_DATABASE) -> str:
    """``postgresql://`` URL of ``database`` on the stack's own PostgreSQL, as that database's
    own role (:data:`DATABASE_ROLES`): it can use no other database."""
    role = DATABASE_ROLES.get(database)
    if role is None:
        raise ValueError(
            f"no role for database {database!r}: the stack's databases are "
            f"{', '.join(DATABASE_ROLES)}; the superuser's URL is superuser_postgres_url"
        )
    password = _stack_password(postgres_role_password_file(settings, database), "PostgreSQL")
    host, port = settings.host, settings.ports.postgres
    return f"postgresql://{role}:{password}@{host}:{port}/{database}"


def superuser_postgres_url(settings: Settings, database: str = "postgres") -> str:
    """The superuser's URL: for the stack's set-up and health checks only."""
    password = _stack_password(postgres_password_file(settings), "PostgreSQL")
    host, port = settings.host, settings.ports.postgres
    return f"postgresql://{POSTGRES_USER}:{password}@{host}:{port}/{database}"


def postgres_url(settings: Settings) -> str:
    """The event ledger's database: ``CASCADE_POSTGRES_URL``, else the stack's ``cascade``."""
    return settings.postgres_url or stack_postgres_url(settings, LEDGER_DATABASE)


def feast_registry_url(settings: Settings) -> str:
    """Feast's SQL registry: ``CASCADE_FEAST_REGISTRY_URL``, else the stack's ``feast``
    database (a SQLAlchemy URL with the psycopg2 driver)."""
    if settings.feature_store.feast_registry_url:
        return settings.feature_store.feast_registry_url
    url = stack_postgres_url(settings, FEAST_DATABASE)
    return url.replace("postgresql://", "postgresql+psycopg2://", 1)


def redis_connection(settings: Settings) -> str:
    """Feast's Redis ``connection_string``: ``CASCADE_REDIS``, else the stack's Redis."""
    if settings.feature_store.redis:
        return settings.feature_store.redis
    password = _stack_password(redis_password_file(settings), "Redis")
    return f"{settings.host}:{settings.ports.redis},password={password}"


SPARK_CONF_DIR_VAR = "SPARK_CONF_DIR"


def spark_client_conf_dir(settings: Settings) -> Path:
    """The drivers' Spark configuration folder: its ``spark-defaults.conf`` (0600) holds the
    stack's authentication secret, which Spark's launcher reads from the file, so it never
    becomes a ``--conf`` argument on the JVM's command line."""
    return spark_dir(settings) / "client-conf"


def redis_reader_connection(settings: Settings) -> str:
    """Feast's Redis ``connection_string`` for the stack's Redis as :data:`REDIS_READER`."""
    password = _stack_password(redis_reader_password_file(settings), "Redis")
    return f"{settings.host}:{settings.ports.redis},username={REDIS_READER},password={password}"


def spark_client_conf(settings: Settings) -> dict[str, str]:
    """What a driver adds to its session to use the stack's standalone master: authentication
    and the event log (so the master's history shows each job's executors). Empty for any
    other master (``local[N]``, a cluster's own).

    The secret itself is not among them: it is written to :func:`spark_client_conf_dir`'s
    ``spark-defaults.conf`` (0600) and this process's ``SPARK_CONF_DIR`` points there, so the
    JVM that PySpark launches next reads it from the file (the standalone master requires
    ``spark.authenticate.secret`` in the configuration, and builder settings would reach the
    JVM as command-line ``--conf`` arguments that ``ps`` shows)."""
    import os

    if settings.spark_master != settings.stack_spark_master:
        return {}
    secret = _stack_password(spark_secret_file(settings), "Spark")
    folder = spark_client_conf_dir(settings)
    secure_state_folder(folder)
    write_secret(
        folder / "spark-defaults.conf",
        f"spark.authenticate true\nspark.authenticate.secret {secret}\n",
    )
    os.environ[SPARK_CONF_DIR_VAR] = str(folder)
    events = spark_event_dir(settings)
    events.mkdir(parents=True, exist_ok=True)
    return {
        "spark.authenticate": "true",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        # Plain JSON lines: readable without Spark (Spark 4 compresses them by default).
        "spark.eventLog.compress": "false",
        "spark.executor.cores": str(settings.spark_worker_cores),
        "spark.executor.memory": settings.spark_worker_memory,
        # A JVM this process launched earlier (a local session before) read its defaults then:
        # to it the secret goes over PySpark's gateway, never a command line.
        **({"spark.authenticate.secret": secret} if _spark_gateway_running() else {}),
    }


def _spark_gateway_running() -> bool:
    """Whether PySpark's JVM is already up in this process (it reads SPARK_CONF_DIR once)."""
    import sys

    pyspark = sys.modules.get("pyspark")
    return pyspark is not None and getattr(pyspark.SparkContext, "_gateway", None) is not None
