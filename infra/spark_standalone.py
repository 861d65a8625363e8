"""Spark standalone for the ``cluster`` profile: a master and its workers, bound to loopback.

    python -m infra.spark_standalone      # started for you by `cascade up` (cluster profile)

The master listens on ``CASCADE_SPARK_PORT`` (web UI and JSON status on
``CASCADE_SPARK_UI_PORT``); ``CASCADE_SPARK_WORKERS`` workers offer ``CASCADE_SPARK_WORKER_CORES``
cores and ``CASCADE_SPARK_WORKER_MEMORY`` each, with their own folders under the state folder
(:func:`cascade.data_services.spark_dir`). Master, workers and every driver share one
authentication secret (``spark.authenticate``), read from ``spark-defaults.conf`` (0600) by the
daemons and from :func:`cascade.data_services.spark_client_conf` by the jobs: another local user
cannot submit work to the stack's master. Drivers pointed at the stack
(``CASCADE_SPARK_MASTER=stack``) write event logs under ``spark/events``.

SIGTERM stops every daemon. The master's exit stops the workers too (the stack then reports the
service down); a worker that dies is reported and the rest go on, as a cluster goes on after
losing a node: its running tasks are retried on the other workers, and the service reports
itself unhealthy (fewer workers than configured) until it is restarted.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests

from cascade.config import Settings, load_settings
from cascade.data_services import ensure_spark_secret, spark_dir, spark_event_dir
from cascade.state import secure_state_folder, write_secret
from infra.supervise import stop_children, stop_requested, topmost_process

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """The Spark distribution inside the ``pyspark`` package (its jars and ``bin/``)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed in this interpreter's environment")
    return Path(spec.origin).parent


def conf_dir(settings: Settings) -> Path:
    return spark_dir(settings) / "conf"


def worker_dir(settings: Settings, index: int) -> Path:
    return spark_dir(settings) / f"worker-{index}"


def write_defaults(settings: Settings) -> Path:
    """``spark-defaults.conf`` of the daemons (0600: the secret is in it, never on a command
    line)."""
    lines = {
        "spark.authenticate": "true",
        "spark.authenticate.secret": ensure_spark_secret(settings),
        # Finished applications' folders (executor logs) are kept; the stack's state folder is
        # the place to read them, and `cascade down` + a new state folder clears them.
        "spark.worker.cleanup.enabled": "false",
        "spark.ui.reverseProxy": "false",
    }
    path = conf_dir(settings) / "spark-defaults.conf"
    write_secret(path, "".join(f"{key} {value}\n" for key, value in lines.items()))
    return path


def daemon_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(conf_dir(settings)),
            "SPARK_LOCAL_IP": settings.host,
            "SPARK_LOG_DIR": str(spark_dir(settings) / "logs"),
            "PYSPARK_PYTHON": sys.executable,
        }
    )
    return env


def commands(settings: Settings) -> dict[str, list[str]]:
    """Daemon name -> command: the master first, then each worker."""
    spark_class = str(spark_home() / "bin" / "spark-class")
    host, ports = settings.host, settings.ports
    found = {
        "master": [
            spark_class,
            MASTER_CLASS,
            "--host",
            host,
            "--port",
            str(ports.spark),
            "--webui-port",
            str(ports.spark_ui),
        ]
    }
    for index in range(1, settings.spark_workers + 1):
        found[f"worker-{index}"] = [
            spark_class,
            WORKER_CLASS,
            "--host",
            host,
            "--cores",
            str(settings.spark_worker_cores),
            "--memory",
            settings.spark_worker_memory,
            # A free port of the worker's web UI, on SPARK_LOCAL_IP: one per worker.
            "--webui-port",
            "0",
            "--work-dir",
            str(worker_dir(settings, index)),
            settings.stack_spark_master,
        ]
    return found


def worker_process(settings: Settings, index: int) -> psutil.Process | None:
    """The running JVM of standalone worker ``index`` (found by its work folder); None if none."""
    folder = str(worker_dir(settings, index))
    return topmost_process(lambda cmdline: WORKER_CLASS in cmdline and folder in cmdline)


def master_status(settings: Settings, timeout_s: float = 2.0) -> dict | None:
    """The master's JSON status (workers, running and finished applications), or None."""
    url = f"http://{settings.host}:{settings.ports.spark_ui}/json/"
    try:
        response = requests.get(url, timeout=timeout_s)
        return response.json() if response.ok else None
    except (requests.RequestException, ValueError):
        return None


def alive_workers(status: dict | None) -> list[dict]:
    return [w for w in (status or {}).get("workers", []) if w.get("state") == "ALIVE"]


def healthy(settings: Settings) -> bool:
    """The master is up and every configured worker has registered with it."""
    status = master_status(settings)
    return (
        status is not None
        and status.get("status") == "ALIVE"
        and len(alive_workers(status)) >= settings.spark_workers
    )


def main() -> int:
    settings = load_settings()
    for folder in (spark_dir(settings), spark_event_dir(settings), spark_dir(settings) / "logs"):
        secure_state_folder(folder)
    write_defaults(settings)
    env = daemon_env(settings)
    children: dict[str, subprocess.Popen[bytes]] = {}
    requested = stop_requested()
    stopping = False
    for name, command in commands(settings).items():
        if name.startswith("worker-"):
            secure_state_folder(worker_dir(settings, int(name.split("-")[1])))
        children[name] = subprocess.Popen(command, env=env)
        print(f"spark-standalone: started {name} (pid {children[name].pid})", flush=True)
        if name == "master":
            # Workers that start before the master retry with back-off; waiting for its port
            # saves that back-off on a loaded machine.
            deadline = time.monotonic() + 60
            while master_status(settings) is None and time.monotonic() < deadline:
                if children[name].poll() is not None:
                    break
                time.sleep(0.5)
    exit_code = 0
    lost: set[str] = set()
    while not (stopping or requested()):
        for name, child in children.items():
            if child.poll() is None or name in lost:
                continue
            if name == "master":
                print(f"spark-standalone: master exited with {child.returncode}; stopping")
                exit_code, stopping = 1, True
            else:
                lost.add(name)
                left = len(children) - 1 - len(lost)
                print(
                    f"spark-standalone: {name} exited with {child.returncode}; "
                    f"{left} worker(s) left",
                    flush=True,
                )
        time.sleep(0.5)
    stop_children(reversed(list(children.values())))
    print("spark-standalone: stopped", flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
