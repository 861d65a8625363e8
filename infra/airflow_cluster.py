"""Airflow for the ``cluster`` profile: metadata in PostgreSQL, tasks on Celery workers.

    python -m infra.airflow_cluster      # started for you by `cascade up` (cluster profile)

The same four components as :mod:`infra.airflow_local` (API server, scheduler, triggerer, DAG
processor, each its own process, bound to loopback), with the ``CeleryExecutor`` instead of the
``LocalExecutor``: the scheduler queues each task in the stack's Redis (database
:data:`BROKER_DB`, apart from Feast's online store in database 0) and Celery workers, separate
processes, take them from there: :data:`WORKERS` workers named ``cascade-worker-N@HOST`` from
Airflow's default queue, and :data:`PROMOTION_WORKER` alone from
:data:`cascade.pipeline_spec.PROMOTION_QUEUE`, where the steps that act as the MLflow promoter
wait (the ``register`` steps: :attr:`cascade.pipeline_spec.Step.queue`).

Only the promotion worker can read the promoter's credential and the release signing key. The
stack's services share one OS user, so each worker runs confined (:mod:`infra.worker_confinement`)
in its own view of the state folder (:func:`worker_view`): the MLflow folder (the admin's and
the roles' credential files, the auth database, the artifact store) is an empty folder there,
but for the promotion worker's promoter file; the default workers see the signing folder empty
too, but for its public keys; and no other process of the host is visible to any of them.
Their environment holds the writer's credential, as every Airflow process's does. Where Linux
refuses the namespaces this needs, they start unconfined and the supervisor says so.

The metadata database and Celery's task results live in the stack's PostgreSQL (database
``airflow``); the connection URLs, passwords included, reach the processes through their
environment only (:func:`cluster_env`), never a command line.

Each default worker offers ``ceil(CASCADE_AIRFLOW_PARALLELISM / WORKERS)`` task slots (the
promotion worker one), so the default workers together offer what the scheduler may run at once;
with one slot a worker holds one task and the next queued task goes to another worker. A task
records the worker that ran it as its ``hostname`` (:func:`node_name`), so Airflow's own task
records say which worker ran each try.

A worker that dies is reported and the rest go on, as a cluster goes on after losing a node:
the scheduler fails the lost worker's running tasks once their heartbeats stop
(``[scheduler] task_instance_heartbeat_timeout``, Airflow's 300 s unless set) and their retries
run on the other workers; the service reports itself unhealthy (fewer workers than configured,
:func:`answering_workers`) until it is restarted. Any other component's exit stops them all.
SIGTERM stops every process.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from cascade.airflow_client import airflow_home
from cascade.config import Settings, load_settings
from cascade.data_services import (
    AIRFLOW_DATABASE,
    postgres_role_password_file,
    redis_password_file,
    stack_postgres_url,
)
from cascade.pipeline_spec import DEFAULT_QUEUE, PROMOTION_QUEUE
from cascade.signing import SIGNING_DIR, ensure_signing_key, private_key_path, public_keys_path
from cascade.tracking_auth import PROMOTER, ROLES, credentials_file, mlflow_dir, role_file
from infra import worker_confinement
from infra.airflow_local import COMPONENTS, airflow_cli
from infra.supervise import (
    process_from_pid_file,
    stop_children,
    stop_requested,
    write_pid_file,
)

WORKERS = 2
"""Celery workers the cluster stack starts on Airflow's default queue."""
PROMOTION_WORKER = "cascade-promoter"
"""The one Celery worker of the promotion queue: the only one that holds the promoter's
credential and the release signing key."""
BROKER_DB = 1
"""The Redis database of Celery's queues (Feast's online store uses database 0)."""
NODE_ENV = "AIRFLOW_CASCADE_WORKER_NODE"
"""Set by the supervisor in each worker's environment (and so in its tasks'): the name the
tasks record. Not a setting: only the supervisor writes it, for its own workers."""


def node_name() -> str:
    """Airflow's ``[core] hostname_callable`` in the cluster profile: the worker's name in a
    Celery worker's processes (``cascade-worker-N``), the machine's name elsewhere."""
    return os.environ.get(NODE_ENV) or socket.getfqdn()


def worker_name(index: int) -> str:
    return f"cascade-worker-{index}"


def worker_names() -> list[str]:
    """Every Celery worker the stack starts: the default queue's, then the promotion worker."""
    return [*(worker_name(index) for index in range(1, WORKERS + 1)), PROMOTION_WORKER]


def worker_queue(name: str) -> str:
    """The one queue worker ``name`` consumes."""
    return PROMOTION_QUEUE if name == PROMOTION_WORKER else DEFAULT_QUEUE


def celery_hostname(settings: Settings, worker: int | str) -> str:
    """The worker's Celery node name, as ``celery inspect`` and ``ping`` show it (``worker``:
    a default worker's number, or a worker's name)."""
    name = worker_name(worker) if isinstance(worker, int) else worker
    return f"{name}@{settings.host}"


def worker_concurrency(settings: Settings) -> int:
    """Task slots of each default worker; the promotion worker has one (registrations are
    short, and one at a time keeps alias moves in order)."""
    return max(1, math.ceil(settings.airflow_parallelism / WORKERS))


def worker_view(settings: Settings, name: str) -> tuple[list[Path], list[Path]]:
    """(folders worker ``name`` sees empty, files inside them bound back read-only). Every
    worker loses the MLflow folder (the admin's and every role's credential, the auth
    database, the artifact store the server writes: its environment holds the writer's); the
    promotion worker gets the promoter's file back, the others lose the signing folder too but
    its public keys."""
    if name == PROMOTION_WORKER:
        return [mlflow_dir(settings)], [role_file(settings, PROMOTER)]
    return [mlflow_dir(settings), settings.home / SIGNING_DIR], [public_keys_path(settings.home)]


def broker_url(settings: Settings) -> str:
    password = redis_password_file(settings).read_text().strip()
    return f"redis://:{password}@{settings.host}:{settings.ports.redis}/{BROKER_DB}"


def metadata_url(settings: Settings) -> str:
    """SQLAlchemy URL of the metadata database (psycopg2, the driver the lock installs)."""
    return stack_postgres_url(settings, AIRFLOW_DATABASE).replace(
        "postgresql://", "postgresql+psycopg2://", 1
    )


def cluster_env(settings: Settings) -> dict[str, str]:
    """What the cluster profile changes in Airflow's environment
    (:func:`infra.services.airflow_env`): empty until PostgreSQL and Redis have their passwords
    (the stack prepares them first)."""
    metadata_password = postgres_role_password_file(settings, AIRFLOW_DATABASE)
    if not (metadata_password.exists() and redis_password_file(settings).exists()):
        return {}
    metadata = metadata_url(settings)
    return {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata,
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": f"{__name__}.node_name",
        "AIRFLOW__CELERY__BROKER_URL": broker_url(settings),
        "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{metadata}",
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(worker_concurrency(settings)),
        # A task's message goes back to the queue if no worker acknowledged it in this time (a
        # worker lost mid-task); by then the try has been failed and retried, and Airflow
        # refuses to start a task instance that is no longer queued.
        "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "86400",
    }


def worker_commands(settings: Settings, *, confine: bool = True) -> dict[str, list[str]]:
    """Worker name -> command: ``airflow celery worker`` on its one queue, own node name and
    pid file, no log server (task logs are files under the Airflow home, which the API server
    reads); with ``confine``, run by :mod:`infra.worker_confinement` in its own view of the
    state folder (:func:`worker_view`)."""
    commands = {}
    for name in worker_names():
        command = [
            airflow_cli(),
            "celery",
            "worker",
            "--celery-hostname",
            celery_hostname(settings, name),
            "--queues",
            worker_queue(name),
            "--concurrency",
            "1" if name == PROMOTION_WORKER else str(worker_concurrency(settings)),
            "--pid",
            # A confined worker's pid is its namespace's: Celery's file is not the host's pid.
            str(celery_pid_file(settings, name) if confine else worker_pid_file(settings, name)),
            "--skip-serve-logs",
            "--without-mingle",
            "--without-gossip",
        ]
        if confine:
            command = worker_confinement.confined_command(*worker_view(settings, name), command)
        commands[name] = command
    return commands


def celery_pid_file(settings: Settings, name: str) -> Path:
    """The pid file a confined worker's Celery writes (its pid inside its namespace); removed
    before each start, since a stale one may name a pid that exists there."""
    return airflow_home(settings) / f"{name}.celery.pid"


def confinement_works(settings: Settings) -> str | None:
    """None when a confined command runs here; otherwise why not (the launcher's message)."""
    done = subprocess.run(
        worker_confinement.confined_command(*worker_view(settings, worker_name(1)), ["true"]),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


_READ_FILES = """
import json, sys
found = {}
for path in sys.argv[1:]:
    try:
        with open(path, encoding="utf-8") as handle:
            found[path] = handle.read()
    except (OSError, ValueError):
        pass
print(json.dumps(found))
"""


def registry_secret_files(settings: Settings) -> list[Path]:
    """The files whose content grants registry writes or release signatures: the MLflow
    admin's and every role's credential, and the release signing key."""
    return [
        credentials_file(settings),
        *(role_file(settings, role) for role in ROLES),
        private_key_path(settings.home),
    ]


def readable_by_worker_tasks(
    settings: Settings, name: str, *, confine: bool = True
) -> dict[str, str]:
    """Path -> content of each of :func:`registry_secret_files` that a task of worker ``name``
    reads: a process started the way that worker is (confined or not) reads them and sends
    what it could read back through a pipe (paths only on its command line)."""
    command = [sys.executable, "-c", _READ_FILES, *map(str, registry_secret_files(settings))]
    if confine:
        command = worker_confinement.confined_command(*worker_view(settings, name), command)
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"reading as worker {name} failed: {done.stderr.strip()[-300:]}")
    found = json.loads(done.stdout)
    return {path: text for path, text in found.items() if text.strip()}


def worker_pid_file(settings: Settings, name: str) -> Path:
    """Where the supervisor records the pid of worker ``name`` (the ``--pid`` it passes, so
    ``airflow celery stop --pid`` finds the worker too)."""
    return airflow_home(settings) / f"{name}.pid"


def worker_process(settings: Settings, name: str) -> psutil.Process | None:
    """The running Celery worker ``name`` (``cascade-worker-N``), by the pid its supervisor
    recorded; None if none. Its command line is no guide: Celery retitles the worker and its pool
    processes, and helpers forked before that keep the original command line."""
    return process_from_pid_file(worker_pid_file(settings, name))


def answering_workers(settings: Settings, timeout_s: float = 2.0) -> list[str]:
    """Node names of the stack's Celery workers that answer a ping through the broker, sorted;
    empty when the broker cannot be reached."""
    from celery import Celery

    try:
        url = broker_url(settings)
        # Celery would retry a closed port for seconds: a status line has no time for that.
        socket.create_connection((settings.host, settings.ports.redis), timeout=timeout_s).close()
    except OSError:
        return []
    app = Celery("cascade-status", broker=url, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = False
    app.conf.broker_connection_max_retries = 0
    try:
        replies = app.control.ping(timeout=timeout_s)
    except Exception:  # the broker is down or refuses the password: no worker answers
        return []
    finally:
        app.close()
    expected = {celery_hostname(settings, name) for name in worker_names()}
    return sorted(name for reply in replies for name in reply if name in expected)


def main() -> int:
    settings = load_settings()
    env = dict(os.environ)
    env["AIRFLOW__API__HOST"] = env.get("AIRFLOW__API__HOST", settings.host)
    if env.get("AIRFLOW__CORE__EXECUTOR") != "CeleryExecutor":
        print("airflow-cluster: the environment names no Celery executor; stopping", flush=True)
        return 2
    print("airflow-cluster: migrating the metadata database (PostgreSQL)", flush=True)
    subprocess.run([airflow_cli(), "db", "migrate"], env=env, check=True)
    commands = {name: [airflow_cli(), *args] for name, args in COMPONENTS.items()}
    # The public half the default workers keep seeing must exist before they start.
    ensure_signing_key(settings.home)
    refused = confinement_works(settings)
    if refused is not None:
        print(
            "airflow-cluster: WARNING the workers start unconfined, so every task can read the "
            f"promoter's credential and the signing key ({refused})",
            flush=True,
        )
    workers = worker_commands(settings, confine=refused is None)
    for name in workers:
        celery_pid_file(settings, name).unlink(missing_ok=True)
    children: dict[str, subprocess.Popen[bytes]] = {}
    requested = stop_requested()
    for name, command in {**commands, **workers}.items():
        child_env = {**env, NODE_ENV: name} if name in workers else env
        children[name] = subprocess.Popen(command, env=child_env)
        if name in workers:
            write_pid_file(worker_pid_file(settings, name), children[name].pid)
        print(f"airflow-cluster: started {name} (pid {children[name].pid})", flush=True)
    exit_code = 0
    stopping = False
    lost: set[str] = set()
    while not (stopping or requested()):
        for name, child in children.items():
            if child.poll() is None or name in lost:
                continue
            if name in workers:
                lost.add(name)
                print(
                    f"airflow-cluster: {name} exited with {child.returncode}; "
                    f"{len(workers) - len(lost)} worker(s) left",
                    flush=True,
                )
            else:
                print(f"airflow-cluster: {name} exited with {child.returncode}; stopping")
                exit_code, stopping = 1, True
        time.sleep(0.5)
    # Workers first: they finish or hand back their tasks while the API server still answers.
    stop_children([children[name] for name in workers] + [children[name] for name in commands])
    print("airflow-cluster: stopped", flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
