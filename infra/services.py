"""The services of the local stack, one by one: what each runs (:class:`ServiceSpec`: command,
environment, port, URL, health check), the environment it runs in, and what is prepared
before its first start (PostgreSQL's data folder and databases, Redis' configuration, MLflow's
and Airflow's stores). Starting, stopping and reporting them is :mod:`infra.stack`.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import requests

from cascade.airflow_client import airflow_home, airflow_password_file
from cascade.assets import KAFKA_CONN_ID
from cascade.config import REPO_ROOT, Settings
from cascade.data_services import (
    DATABASE_ROLES,
    DATABASES,
    MLFLOW_DATABASE,
    POSTGRES_USER,
    REDIS_READER,
    ensure_postgres_password,
    ensure_postgres_role_passwords,
    ensure_redis_password,
    ensure_redis_reader_password,
    postgres_data_dir,
    postgres_password_file,
    postgres_role_password_file,
    redis_config_file,
    redis_dir,
    redis_password_file,
    redis_reader_connection,
    redis_reader_password_file,
    stack_postgres_url,
    superuser_postgres_url,
)
from cascade.serving_token import serving_token_env
from cascade.state import SERVICE_UMASK, write_secret
from cascade.tracking_auth import (
    PASSWORD_VAR,
    READER,
    USERNAME_VAR,
    WRITER,
    ensure_role_users,
    ensure_tracking_credentials,
    is_stack_tracking,
    role_env,
    tracking_server_env,
)
from infra import airflow_cluster, kafka_broker, spark_standalone

SERVICES = (
    "postgres",
    "redis",
    "spark",
    *kafka_broker.NODES,
    "mlflow",
    "airflow",
    "serving",
    "asr_serving",
)
CLUSTER_SERVICES = ("postgres", "redis", "spark", *kafka_broker.NODES[1:])
"""Started only in the ``cluster`` profile: the data services, the Spark standalone master
and workers of the distributed engines, and Kafka's second and third nodes."""


class StackError(RuntimeError):
    """A service could not be started or stopped; the message says which and what to do."""


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    port: int
    command: list[str]
    env: dict[str, str]
    url: str
    healthy: Callable[[], bool]
    start_timeout_s: float


def log_file(settings: Settings, name: str) -> Path:
    """Where service ``name`` writes its output (set-up commands included)."""
    return settings.logs_dir / f"{name}.log"


def venv_bin() -> Path:
    return Path(sys.executable).parent


def broker_healthy(settings: Settings, node: kafka_broker.Node) -> bool:
    """A Kafka node is healthy when its admin API answers and lists the node itself (in the
    ``cluster`` profile: once the quorum has a leader and the node is registered)."""
    from cascade.broker import BrokerError, describe

    try:
        found = describe(settings, bootstrap=f"{settings.host}:{node.port}", timeout_s=2.0)
    except BrokerError:
        return False
    return node.node_id in found["brokers"] and found["controller_id"] not in (None, -1)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        return sock.connect_ex((host, port)) == 0


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        return requests.get(url, timeout=timeout).status_code < 500
    except requests.RequestException:
        return False


def airflow_healthy(settings: Settings) -> bool:
    try:
        body = requests.get(f"{settings.airflow_url}/api/v2/monitor/health", timeout=3).json()
    except (requests.RequestException, ValueError):
        return False
    needed = ("metadatabase", "scheduler", "triggerer", "dag_processor")
    return all(body.get(k, {}).get("status") == "healthy" for k in needed)


SERVICE_ROLES: dict[str, str | None] = {
    "postgres": None,
    "redis": None,
    "spark": None,
    **{node: None for node in kafka_broker.NODES},
    "mlflow": None,
    "airflow": WRITER,
    "serving": READER,
    "asr_serving": READER,
}
"""The MLflow role (:data:`cascade.tracking_auth.ROLES`) whose credential each service's
environment holds: None for the data services, Spark's daemons, the broker and the tracking
server itself (it gets the admin's bootstrap password only: :func:`tracking_server_env`);
the writer for Airflow and so every task and training launch; the reader for the model
servers. No environment holds the promoter's: the promotion gate reads its file."""


def service_env(settings: Settings, role: str | None = None) -> dict[str, str]:
    """The environment a service runs in: with the local stack's tracking server, the MLflow
    credential of ``role`` and of no other (None: none at all; the environment of a process is
    its owner's only; no log prints it). A credential inherited from the caller's environment
    is dropped, so a service never holds more than its role."""
    env = {k: v for k, v in os.environ.items() if k not in (USERNAME_VAR, PASSWORD_VAR)}
    env.update(
        {
            "PATH": f"{venv_bin()}{os.pathsep}{env.get('PATH', '')}",
            "CASCADE_HOME": str(settings.home),
            "CASCADE_PROFILE": settings.profile,
            "CASCADE_BROKER_PORT": str(settings.ports.broker),
            "CASCADE_AIRFLOW_PORT": str(settings.ports.airflow),
            "CASCADE_MLFLOW_PORT": str(settings.ports.mlflow),
            "CASCADE_SERVING_PORT": str(settings.ports.serving),
            "CASCADE_ASR_SERVING_PORT": str(settings.ports.asr_serving),
            "MLFLOW_TRACKING_URI": settings.tracking_uri,
            "SPARK_LOCAL_IP": settings.host,
            "DS_ACCELERATOR": env.get("DS_ACCELERATOR", "cpu"),
            "PYTHONUNBUFFERED": "1",
            **role_env(settings, role),
            **serving_token_env(settings),
        }
    )
    if (
        role == READER
        and settings.profile == "cluster"
        and not settings.feature_store.redis
        and redis_reader_password_file(settings).exists()
    ):
        # The servers read the online store as the Redis reader, not the writers' user.
        env["CASCADE_REDIS"] = redis_reader_connection(settings)
    return env


def airflow_env(settings: Settings) -> dict[str, str]:
    home = airflow_home(settings)
    port = settings.ports.airflow
    kafka_conn = {
        "conn_type": "kafka",
        "extra": {
            **settings.kafka_client_config,
            "group.id": "cascade-airflow",
            "auto.offset.reset": "earliest",
            # The shared-stream watcher commits only after asset events are stored; it refuses
            # to start with auto-commit on (cascade/events.py explains the delivery chain).
            "enable.auto.commit": "false",
        },
    }
    env = service_env(settings, SERVICE_ROLES["airflow"])
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": str(settings.airflow_parallelism),
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(settings.airflow_parallelism),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            # The API server answers its first task-execution request only after a one-time
            # set-up that takes 25-40 s on a busy 2-core machine (either executor), answering
            # nothing else meanwhile; Airflow's 5 s would fail the first tasks' start (a wasted
            # try, or a failed run once the retries are spent) before it is done.
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "90",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{settings.host}:{port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            # Written 0600 by ensure_airflow_password before Airflow starts, so Airflow never
            # generates (and prints) one.
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(
                airflow_password_file(settings)
            ),
            "AIRFLOW__API__HOST": settings.host,
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://{settings.host}:{port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "10",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            f"AIRFLOW_CONN_{KAFKA_CONN_ID.upper()}": json.dumps(kafka_conn),
        }
    )
    if settings.profile == "cluster":
        # Metadata in PostgreSQL, tasks on the Celery workers (infra.airflow_cluster).
        env.update(airflow_cluster.cluster_env(settings))
    return env


def airflow_cluster_healthy(settings: Settings) -> bool:
    """The cluster profile's Airflow: its components healthy and every Celery worker answering
    a ping through the broker."""
    return airflow_healthy(settings) and (
        len(airflow_cluster.answering_workers(settings)) == len(airflow_cluster.worker_names())
    )


def stack_services(settings: Settings) -> tuple[str, ...]:
    """The services ``cascade up`` starts in the settings' profile."""
    names = SERVICES
    if settings.profile != "cluster":
        names = tuple(name for name in names if name not in CLUSTER_SERVICES)
    if not settings.local_broker:
        # An external Kafka (CASCADE_KAFKA_BOOTSTRAP): no local node beside it.
        names = tuple(name for name in names if name not in kafka_broker.NODES)
    return names


def postgres_bin_dir() -> Path | None:
    """The folder of the PostgreSQL server binaries (``postgres``, ``initdb``): the one on
    PATH, else the newest under ``/usr/lib/postgresql`` (Debian's layout); None if absent."""
    on_path = shutil.which("postgres")
    if on_path and (Path(on_path).resolve().parent / "initdb").exists():
        return Path(on_path).resolve().parent
    found = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/postgres")]
    found = [p for p in found if p.parent.name.isdigit() and (p / "initdb").exists()]
    return max(found, key=lambda p: int(p.parent.name)) if found else None


def as_unprivileged(command: list[str]) -> list[str]:
    """``command`` as an ordinary user. PostgreSQL refuses to run as root; under root it runs
    in a user namespace of its own where it is ``nobody`` while its files stay the owner's
    (the state folder stays 0700; nothing is handed to another system user)."""
    if os.geteuid() != 0:
        return command
    unshare = shutil.which("unshare")
    if unshare is None:
        raise StackError(
            "PostgreSQL refuses to run as root and `unshare` is missing; run as a user"
        )
    try:
        entry = pwd.getpwnam("nobody")
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        uid = gid = 65534
    return [unshare, "--user", f"--map-user={uid}", f"--map-group={gid}", *command]


def postgres_healthy(settings: Settings) -> bool:
    """The superuser signs in and runs a query."""
    import psycopg2

    try:
        conn = psycopg2.connect(superuser_postgres_url(settings), connect_timeout=2)
    except (psycopg2.Error, FileNotFoundError):
        return False
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            return cur.fetchone() == (1,)
    except psycopg2.Error:
        return False
    finally:
        conn.close()


def redis_healthy(settings: Settings) -> bool:
    """Redis answers PING to the password."""
    import redis

    try:
        password = redis_password_file(settings).read_text().strip()
        client = redis.Redis(
            host=settings.host,
            port=settings.ports.redis,
            password=password,
            socket_timeout=2,
            socket_connect_timeout=2,
        )
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (OSError, redis.RedisError):
        return False


def _run_logged(command: list[str], log_path: Path, *, stdin: str | None = None) -> None:
    """Run a set-up command with its output appended to the service's log; StackError if it
    fails (the log says why)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as log:
        log.write(f"\n=== {' '.join(command)}\n".encode())
        log.flush()
        done = subprocess.run(
            command,
            input=stdin.encode() if stdin is not None else None,
            stdout=log,
            stderr=subprocess.STDOUT,
            umask=SERVICE_UMASK,
            check=False,
        )
    if done.returncode != 0:
        raise StackError(f"{command[0]} failed (exit {done.returncode}); see {log_path}")


def prepare_postgres(settings: Settings) -> None:
    """The password file, and at the first start the database cluster: ``initdb`` (superuser
    ``cascade``, password from the file, scram-sha-256 for every connection) into a scratch
    folder, the stack's databases created in single-user mode, then moved into place, so a
    failed first start leaves no half-made cluster behind."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise StackError(
            "postgres: the PostgreSQL server binaries are not installed (Debian package "
            "postgresql); run `make venv`"
        )
    ensure_postgres_password(settings)
    ensure_postgres_role_passwords(settings)
    data = postgres_data_dir(settings)
    if (data / "PG_VERSION").exists():
        return
    scratch = data.with_name("data.init")
    shutil.rmtree(scratch, ignore_errors=True)
    log_path = log_file(settings, "postgres")
    _run_logged(
        as_unprivileged(
            [
                str(bin_dir / "initdb"),
                "--pgdata",
                str(scratch),
                "--username",
                POSTGRES_USER,
                "--pwfile",
                str(postgres_password_file(settings)),
                "--auth",
                "scram-sha-256",
                "--encoding",
                "UTF8",
                "--locale",
                "C.UTF-8",
            ]
        ),
        log_path,
    )
    statements = "".join(f'CREATE DATABASE "{name}";\n' for name in DATABASES)
    _run_logged(
        as_unprivileged(
            [str(bin_dir / "postgres"), "--single", "-D", str(scratch), "-F", "postgres"]
        ),
        log_path,
        stdin=statements,
    )
    scratch.rename(data)


def prepare_redis(settings: Settings) -> None:
    """The password files, the data folder and ``redis.conf`` (0600, it holds the passwords):
    the default user is the writers', :data:`REDIS_READER` the servers' (read commands only)."""
    if shutil.which("redis-server") is None:
        raise StackError("redis: redis-server is not installed (Debian package); run `make venv`")
    password = ensure_redis_password(settings)
    reader = ensure_redis_reader_password(settings)
    data = redis_dir(settings) / "data"
    data.mkdir(parents=True, exist_ok=True, mode=0o700)
    config = "\n".join(
        [
            f"bind {settings.host}",
            f"port {settings.ports.redis}",
            "protected-mode yes",
            "daemonize no",
            'logfile ""',
            f"dir {data}",
            "dbfilename dump.rdb",
            "save 300 1",
            "appendonly no",
            # The default user: the writers (Feast's online store, feedback, Celery's queues).
            f"requirepass {password}",
            # The model servers' user: read commands only, no channel.
            f"user {REDIS_READER} on >{reader} ~* resetchannels -@all +@read +@connection",
            "",
        ]
    )
    write_secret(redis_config_file(settings), config)


def ensure_databases(settings: Settings) -> list[str]:
    """Give each of the stack's databases its own login role (:data:`DATABASE_ROLES`, password
    from its 0600 file) as owner, with no right on the others, creating what is missing; a
    database made before roles existed is handed over with its tables. Idempotent; returns the
    databases created."""
    import psycopg2
    from psycopg2 import sql

    passwords = ensure_postgres_role_passwords(settings)
    try:
        conn = psycopg2.connect(superuser_postgres_url(settings), connect_timeout=5)
    except (psycopg2.Error, FileNotFoundError) as exc:
        raise StackError(
            "postgres is not running: the cluster profile keeps MLflow's runs and registry and "
            "Airflow's metadata in it; start it first (`cascade up` starts it before mlflow and "
            f"airflow) ({exc})"
        ) from exc
    conn.autocommit = True  # CREATE DATABASE cannot run inside a transaction
    created = []
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT datname FROM pg_database")
            present = {row[0] for row in cur.fetchall()}
            for name, role in DATABASE_ROLES.items():
                cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
                verb = "ALTER" if cur.fetchone() else "CREATE"
                cur.execute(
                    sql.SQL(verb + " ROLE {} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                            "PASSWORD %s").format(sql.Identifier(role)),
                    (passwords[name],),
                )  # fmt: skip
                if name not in present:
                    cur.execute(
                        sql.SQL("CREATE DATABASE {} OWNER {}").format(
                            sql.Identifier(name), sql.Identifier(role)
                        )
                    )
                    created.append(name)
                else:
                    cur.execute(
                        sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                            sql.Identifier(name), sql.Identifier(role)
                        )
                    )
                cur.execute(
                    sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(name))
                )
    finally:
        conn.close()
    for name, role in DATABASE_ROLES.items():
        _hand_over_objects(settings, name, role)
    return created


_OWNED_KINDS = {"r": "TABLE", "p": "TABLE", "f": "FOREIGN TABLE", "v": "VIEW",
                "m": "MATERIALIZED VIEW", "S": "SEQUENCE"}  # fmt: skip


def _hand_over_objects(settings: Settings, database: str, role: str) -> None:
    """Make ``role`` the owner of ``database``'s public schema and of every table, view,
    sequence and type in it (those the superuser made before the roles existed)."""
    import psycopg2
    from psycopg2 import sql

    conn = psycopg2.connect(superuser_postgres_url(settings, database), connect_timeout=5)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(sql.Identifier(role)))
            # Tables first: a sequence a table's column owns follows its table (and refuses
            # to be handed over on its own), so sequences are read again afterwards.
            for kinds in ([k for k in _OWNED_KINDS if k != "S"], ["S"]):
                cur.execute(
                    "SELECT c.relname, c.relkind FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'public' AND c.relkind = ANY(%s) "
                    "AND pg_get_userbyid(c.relowner) <> %s",
                    (kinds, role),
                )
                for relname, relkind in cur.fetchall():
                    statement = "ALTER " + _OWNED_KINDS[relkind] + " public.{} OWNER TO {}"
                    cur.execute(
                        sql.SQL(statement).format(sql.Identifier(relname), sql.Identifier(role))
                    )
            cur.execute(
                "SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
                "WHERE n.nspname = 'public' AND t.typtype IN ('e', 'd') "
                "AND pg_get_userbyid(t.typowner) <> %s",
                (role,),
            )
            for (typname,) in cur.fetchall():
                cur.execute(
                    sql.SQL("ALTER TYPE public.{} OWNER TO {}").format(
                        sql.Identifier(typname), sql.Identifier(role)
                    )
                )
    finally:
        conn.close()


def mlflow_uses_postgres(settings: Settings) -> bool:
    """The cluster profile's own tracking server keeps runs and the registry in the stack's
    PostgreSQL (database ``mlflow``); the local profile's, in SQLite under the state folder."""
    return settings.profile == "cluster"


def mlflow_store_env(settings: Settings) -> dict[str, str]:
    """The backend store of the tracking server, as ``MLFLOW_BACKEND_STORE_URI`` (an
    environment variable: a command line would show the password)."""
    if mlflow_uses_postgres(settings):
        if not postgres_role_password_file(settings, MLFLOW_DATABASE).exists():
            return {}  # prepare_mlflow refuses to start before PostgreSQL has a password
        # SQLAlchemy names the driver: the psycopg2 the lock installs.
        url = stack_postgres_url(settings, MLFLOW_DATABASE).replace(
            "postgresql://", "postgresql+psycopg2://", 1
        )
    else:
        url = f"sqlite:///{settings.home / 'mlflow' / 'mlflow.db'}"
    return {"MLFLOW_BACKEND_STORE_URI": url}


def prepare_mlflow(settings: Settings) -> None:
    """The tracking server's store (PostgreSQL in the cluster profile) and, with its basic-auth
    app, one user per role with its grants (:func:`cascade.tracking_auth.ensure_role_users`)."""
    if mlflow_uses_postgres(settings):
        ensure_databases(settings)
    if is_stack_tracking(settings):
        ensure_tracking_credentials(settings)
        ensure_role_users(settings)


def prepare_airflow(settings: Settings) -> None:
    """The cluster profile's Airflow needs the stack's PostgreSQL (its metadata database) and
    Redis (the Celery broker) running first."""
    if settings.profile != "cluster":
        return
    ensure_databases(settings)
    if not redis_healthy(settings):
        raise StackError(
            "redis is not running: the cluster profile's Airflow queues its tasks in it; start "
            "it first (`cascade up` starts it before airflow)"
        )


PREPARE: dict[str, Callable[[Settings], None]] = {
    "postgres": prepare_postgres,
    "redis": prepare_redis,
    "mlflow": prepare_mlflow,
    "airflow": prepare_airflow,
}
"""What must exist before a service starts (beyond the state folder)."""

AFTER_START: dict[str, Callable[[Settings], object]] = {"postgres": ensure_databases}
"""What is set up once a service is healthy: PostgreSQL's databases, each owned by its own
role (a start is the moment a new role or a rotated password takes effect)."""


def service_specs(settings: Settings) -> dict[str, ServiceSpec]:
    host, ports, home = settings.host, settings.ports, settings.home
    py = sys.executable
    mlflow_dir = home / "mlflow"
    pg_bin = postgres_bin_dir() or Path("/usr/lib/postgresql/15/bin")
    return {
        "postgres": ServiceSpec(
            name="postgres",
            port=ports.postgres,
            command=as_unprivileged(
                [
                    str(pg_bin / "postgres"),
                    "-D",
                    str(postgres_data_dir(settings)),
                    "-c",
                    f"listen_addresses={host}",
                    "-c",
                    f"port={ports.postgres}",
                    "-c",
                    "unix_socket_directories=",
                ]
            ),
            env=service_env(settings),
            url=f"postgresql://{POSTGRES_USER}@{host}:{ports.postgres}",
            healthy=lambda: postgres_healthy(settings),
            start_timeout_s=60,
        ),
        "redis": ServiceSpec(
            name="redis",
            port=ports.redis,
            command=[
                shutil.which("redis-server") or "redis-server",
                str(redis_config_file(settings)),
            ],
            env=service_env(settings),
            url=f"redis://{host}:{ports.redis}",
            healthy=lambda: redis_healthy(settings),
            start_timeout_s=30,
        ),
        "spark": ServiceSpec(
            name="spark",
            port=ports.spark,
            command=[py, "-m", "infra.spark_standalone"],
            env=service_env(settings),
            url=settings.stack_spark_master,
            healthy=lambda: spark_standalone.healthy(settings),
            start_timeout_s=120,
        ),
        **{
            node.name: ServiceSpec(
                name=node.name,
                port=node.port,
                command=[py, "-m", "infra.kafka_broker", "run", node.name],
                env=service_env(settings),
                url=f"kafka://{host}:{node.port}",
                healthy=lambda node=node: broker_healthy(settings, node),  # type: ignore[misc]
                # Formatting the storage (first start) and the JVM's start: ~10 s here.
                start_timeout_s=120,
            )
            for node in kafka_broker.nodes(settings, every=True)
        },
        "mlflow": ServiceSpec(
            name="mlflow",
            port=ports.mlflow,
            command=[
                py,
                "-m",
                "mlflow",
                "server",
                # The backend store is MLFLOW_BACKEND_STORE_URI (mlflow_store_env).
                "--artifacts-destination",
                str(mlflow_dir / "artifacts"),
                "--host",
                host,
                "--port",
                str(ports.mlflow),
                "--workers",
                "1",
                # Every request but /health needs a user (401 without one); the configuration,
                # user store and admin password live under the state folder (cascade.tracking_auth).
                "--app-name",
                "basic-auth",
            ],
            env={
                **service_env(settings),
                **tracking_server_env(settings),
                **mlflow_store_env(settings),
                # MLflow's server-side job runner (GenAI evaluation and trace jobs, unused
                # here) is on by default: a runner and nine Huey consumers, ~2 GB of memory and
                # a steady trickle of CPU for nothing the platform asks of it.
                "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            },
            url=settings.tracking_uri,
            healthy=lambda: http_ok(f"{settings.tracking_uri}/health"),
            # Two interpreters (the CLI, then uvicorn's worker) import MLflow and its auth app:
            # past 120 s on a 2-core machine under a full test run.
            start_timeout_s=240,
        ),
        "airflow": ServiceSpec(
            name="airflow",
            port=ports.airflow,
            command=[
                py,
                "-m",
                "infra.airflow_cluster" if settings.profile == "cluster" else "infra.airflow_local",
            ],
            env=airflow_env(settings),
            url=settings.airflow_url,
            healthy=(
                (lambda: airflow_cluster_healthy(settings))
                if settings.profile == "cluster"
                else (lambda: airflow_healthy(settings))
            ),
            # The cluster profile starts seven Airflow processes (three of them Celery workers).
            start_timeout_s=420 if settings.profile == "cluster" else 240,
        ),
        "serving": ServiceSpec(
            name="serving",
            port=ports.serving,
            command=[py, "-m", "serving.server"],
            env=service_env(settings, SERVICE_ROLES["serving"]),
            url=settings.serving_url,
            healthy=lambda: http_ok(f"{settings.serving_url}/v2/health/live"),
            start_timeout_s=120,
        ),
        # Follows the registry's asr champion; live (not ready) until one exists.
        "asr_serving": ServiceSpec(
            name="asr_serving",
            port=ports.asr_serving,
            command=[py, "-m", "serving.asr"],
            env=service_env(settings, SERVICE_ROLES["asr_serving"]),
            url=settings.asr_serving_url,
            healthy=lambda: http_ok(f"{settings.asr_serving_url}/v2/health/live"),
            start_timeout_s=120,
        ),
    }
