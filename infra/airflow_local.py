"""Airflow for the ``local`` profile: what ``airflow standalone`` runs, bound to loopback only.

    python -m infra.airflow_local      # started for you by `cascade up`

``airflow standalone`` also starts the scheduler's and triggerer's log servers, which listen on
every interface with no setting to change it. Here the same four components run with
``--skip-serve-logs`` (task logs are local files the API server reads directly), the API server
binds to ``AIRFLOW__API__HOST``, and SIGTERM stops them all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from infra.supervise import stop_children, stop_requested

COMPONENTS: dict[str, list[str]] = {
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "triggerer": ["triggerer", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    "api-server": ["api-server"],
}


def airflow_cli() -> str:
    return str(Path(sys.executable).parent / "airflow")


def main() -> int:
    env = dict(os.environ)
    env["AIRFLOW__API__HOST"] = env.get("AIRFLOW__API__HOST", "127.0.0.1")
    print("airflow-local: migrating the metadata database", flush=True)
    subprocess.run([airflow_cli(), "db", "migrate"], env=env, check=True)
    children: dict[str, subprocess.Popen[bytes]] = {}
    requested = stop_requested()
    stopping = False
    for name, args in COMPONENTS.items():
        children[name] = subprocess.Popen([airflow_cli(), *args], env=env)
        print(f"airflow-local: started {name} (pid {children[name].pid})", flush=True)
    exit_code = 0
    while not (stopping or requested()):
        for name, child in children.items():
            if child.poll() is not None:
                print(f"airflow-local: {name} exited with {child.returncode}; stopping", flush=True)
                exit_code, stopping = 1, True
        time.sleep(0.5)
    stop_children(children.values())
    print("airflow-local: stopped", flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
