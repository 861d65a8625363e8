"""A small client of Airflow's public REST API (v2), for the CLI, the demo and the tests."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from cascade.config import Settings, load_settings
from cascade.state import narrow_secret, secure_state_folder, write_secret

log = logging.getLogger(__name__)

TERMINAL_STATES = ("success", "failed")


def airflow_home(settings: Settings) -> Path:
    """``AIRFLOW_HOME`` of the local stack: under the state folder."""
    return settings.home / "airflow"


def airflow_password_file(settings: Settings) -> Path:
    """Where the Airflow ``admin`` password lives (0600; Airflow's simple auth manager reads
    it). Summaries and status lines name this file, never the password."""
    return airflow_home(settings) / "simple_auth_manager_passwords.json.generated"


def airflow_password(settings: Settings) -> str | None:
    """The ``admin`` password of the local Airflow, None before the first start."""
    try:
        password = json.loads(airflow_password_file(settings).read_text()).get("admin")
    except (OSError, ValueError, AttributeError):
        return None
    return password if isinstance(password, str) and password else None


def ensure_airflow_password(settings: Settings) -> Path:
    """Write the ``admin`` password file (0600) before Airflow starts.

    Left to itself, Airflow's simple auth manager generates the password into a file created
    with the default umask (world-readable) and prints it to its log. With the file already
    there it does neither. A file that others could read gets a new password: the old one may
    have been read."""
    secure_state_folder(settings.home)
    path = airflow_password_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        passwords = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        passwords = {}
    if not isinstance(passwords, dict):
        passwords = {}
    exposed = narrow_secret(path)
    if exposed:
        log.warning("%s was readable by others; it now holds a new admin password (0600)", path)
    if exposed or not isinstance(passwords.get("admin"), str) or not passwords["admin"]:
        passwords["admin"] = secrets.token_urlsafe(18)
        write_secret(path, json.dumps(passwords) + "\n")
    return path


class AirflowClient:
    def __init__(
        self,
        settings: Settings | None = None,
        *,
        username: str = "admin",
        password: str | None = None,
        timeout_s: float = 30.0,
        attempts: int = 6,
    ) -> None:
        self.settings = settings or load_settings()
        self.base = self.settings.airflow_url
        self.username = username
        self.password = password or airflow_password(self.settings)
        if not self.password:
            raise RuntimeError("no Airflow admin password yet; start the stack with `cascade up`")
        self._token: str | None = None
        self.timeout_s = timeout_s
        self.attempts = attempts

    def _request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        """One API call, retried while the server is busy or restarting.

        A 2-core machine running Spark and DeepSpeed next to Airflow makes the API server
        answer slowly at times; a slow answer is not a failure of the pipeline.
        """
        delay = 1.0
        for attempt in range(1, self.attempts + 1):
            try:
                response = requests.request(method, url, timeout=self.timeout_s, **kwargs)
            except (requests.ConnectionError, requests.Timeout):
                if attempt == self.attempts:
                    raise
            else:
                if response.status_code < 500 or attempt == self.attempts:
                    return response
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
        raise AssertionError("unreachable")

    def _headers(self) -> dict[str, str]:
        if self._token is None:
            response = self._request(
                "POST",
                f"{self.base}/auth/token",
                json={"username": self.username, "password": self.password},
            )
            response.raise_for_status()
            self._token = response.json()["access_token"]
        return {"Authorization": f"Bearer {self._token}"}

    def get(self, path: str, **params: Any) -> Any:
        response = self._request(
            "GET", f"{self.base}/api/v2{path}", headers=self._headers(), params=params
        )
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = self._request(
            "POST", f"{self.base}/api/v2{path}", headers=self._headers(), json=body
        )
        response.raise_for_status()
        return response.json()

    def clear_task(self, dag_id: str, run_id: str, task_id: str) -> list[dict[str, Any]]:
        """Clear one task of a finished run (its downstream tasks stay as they are): Airflow
        runs it again, as a new try, and the run goes back to running until it ends."""
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "task_ids": [task_id],
            "include_downstream": False,
            "include_upstream": False,
            "only_failed": False,
            "reset_dag_runs": True,
        }
        return self.post(f"/dags/{dag_id}/clearTaskInstances", body)["task_instances"]

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        response = self._request(
            "PATCH", f"{self.base}/api/v2{path}", headers=self._headers(), json=body
        )
        response.raise_for_status()
        return response.json()

    def dag_runs(self, dag_id: str, *, limit: int = 50) -> list[dict[str, Any]]:
        return self.get(f"/dags/{dag_id}/dagRuns", order_by="-run_after", limit=limit)["dag_runs"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        entry = self.get(
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
        )
        return entry.get("value")

    def wait_for_dag(self, dag_id: str, timeout_s: float = 180) -> dict[str, Any]:
        """Wait until the DAG is parsed and has no import error."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                return self.get(f"/dags/{dag_id}")
            except requests.HTTPError:
                time.sleep(2)
        errors = self.get("/importErrors").get("import_errors", [])
        raise TimeoutError(
            f"DAG {dag_id} not parsed after {timeout_s:.0f} s; import errors: {errors}"
        )

    def wait_for_run(
        self,
        dag_id: str,
        *,
        match: Callable[[dict[str, Any]], bool],
        timeout_s: float = 900,
        echo: Callable[[str], None] = print,
    ) -> dict[str, Any]:
        """Wait for a run that ``match`` accepts to finish, printing task progress."""
        deadline = time.monotonic() + timeout_s
        seen: dict[str, str] = {}
        run: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            runs = [r for r in self.dag_runs(dag_id) if match(r)]
            if runs:
                run = runs[0]
                for ti in self.task_instances(dag_id, run["dag_run_id"]):
                    state = ti.get("state") or "none"
                    if seen.get(ti["task_id"]) != state:
                        seen[ti["task_id"]] = state
                        echo(f"  {dag_id} {run['dag_run_id']}: {ti['task_id']} -> {state}")
                if run["state"] in TERMINAL_STATES:
                    return run
            time.sleep(3)
        raise TimeoutError(
            f"no finished {dag_id} run after {timeout_s:.0f} s "
            f"(last seen: {run and run['state']}); "
            f"see {self.base}/dags/{dag_id}"
        )
