"""Airflow for the ``local`` profile: what ``airflow standalone`` runs, bound to loopback only.

    python -m infra.airflow_local      # started for you by `cascade up`

``airflow standalone`` also starts the scheduler's and triggerer's log servers, which listen on
every interface with no setting to change it. Here the same four components run with
``--skip-serve-logs`` (task logs are local files the API server reads directly), the API server
binds to ``AIRFLOW__API__HOST``, and SIGTERM stops them all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for name, args in COMPONENTS.items():
        children[name] = subprocess.Popen([airflow_cli(), *args], env=env)
        print(f"airflow-local: started {name} (pid {children[name].pid})", flush=True)
    exit_code = 0
    while not stopping:
        for name, child in children.items():
            if child.poll() is not None:
                print(f"airflow-local: {name} exited with {child.returncode}; stopping", flush=True)
                exit_code, stopping = 1, True
        time.sleep(0.5)
    for child in children.values():
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + 20
    for child in children.values():
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
    print("airflow-local: stopped", flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
