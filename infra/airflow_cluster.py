"""Airflow for the ``cluster`` profile: metadata in PostgreSQL, tasks on Celery workers.

    python -m infra.airflow_cluster      # started for you by `cascade up` (cluster profile)

The same four components as :mod:`infra.airflow_local` (API server, scheduler, triggerer, DAG
processor, each its own process, bound to loopback), with the ``CeleryExecutor`` instead of the
``LocalExecutor``: the scheduler queues each task in the stack's Redis (database
:data:`BROKER_DB`, apart from Feast's online store in database 0) and :data:`WORKERS` Celery
workers, separate processes named ``cascade-worker-N@HOST``, take them from there. The metadata
database and Celery's task results live in the stack's PostgreSQL (database ``airflow``); the
connection URLs, passwords included, reach the processes through their environment only
(:func:`cluster_env`), never a command line.

Each worker offers ``ceil(CASCADE_AIRFLOW_PARALLELISM / WORKERS)`` task slots, so the workers
together offer what the scheduler may run at once; with one slot a worker holds one task and the
next queued task goes to another worker. A task records the worker that ran it as its
``hostname`` (:func:`node_name`), so Airflow's own task records say which worker ran each try.

A worker that dies is reported and the rest go on, as a cluster goes on after losing a node:
the scheduler fails the lost worker's running tasks once their heartbeats stop
(``[scheduler] task_instance_heartbeat_timeout``, Airflow's 300 s unless set) and their retries
run on the other workers; the service reports itself unhealthy (fewer workers than configured,
:func:`answering_workers`) until it is restarted. Any other component's exit stops them all.
SIGTERM stops every process.
"""

from __future__ import annotations

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
from infra.airflow_local import COMPONENTS, airflow_cli
from infra.supervise import (
    process_from_pid_file,
    stop_children,
    stop_requested,
    write_pid_file,
)

WORKERS = 2
"""Celery workers the cluster stack starts."""
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


def celery_hostname(settings: Settings, index: int) -> str:
    """The worker's Celery node name, as ``celery inspect`` and ``ping`` show it."""
    return f"{worker_name(index)}@{settings.host}"


def worker_concurrency(settings: Settings) -> int:
    return max(1, math.ceil(settings.airflow_parallelism / WORKERS))


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


def worker_commands(settings: Settings) -> dict[str, list[str]]:
    """Worker name -> ``airflow celery worker`` command: own node name and pid file, no log
    server (task logs are files under the Airflow home, which the API server reads)."""
    return {
        worker_name(index): [
            airflow_cli(),
            "celery",
            "worker",
            "--celery-hostname",
            celery_hostname(settings, index),
            "--concurrency",
            str(worker_concurrency(settings)),
            "--pid",
            str(worker_pid_file(settings, worker_name(index))),
            "--skip-serve-logs",
            "--without-mingle",
            "--without-gossip",
        ]
        for index in range(1, WORKERS + 1)
    }


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
    expected = {celery_hostname(settings, i) for i in range(1, WORKERS + 1)}
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
    workers = worker_commands(settings)
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
