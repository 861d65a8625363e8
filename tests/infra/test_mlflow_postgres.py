"""The cluster stack's tracking server keeps runs and the registry in the stack's PostgreSQL,
behind the same authentication as the local one; the database password is on no command line."""

from __future__ import annotations

from pathlib import Path

import psutil
import psycopg2
import pytest
import requests
from mlflow.tracking import MlflowClient

from cascade.data_services import (
    MLFLOW_DATABASE,
    postgres_role_password_file,
    stack_postgres_url,
    superuser_postgres_url,
)
from infra import services, stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_runs_and_registry_live_in_postgres(tmp_path: Path) -> None:
    env = {"CASCADE_PROFILE": "cluster", "CASCADE_MLFLOW_URI": ""}
    with stack.private_stack(tmp_path / "home", services=("postgres", "mlflow"), env=env) as s:
        assert services.mlflow_store_env(s)["MLFLOW_BACKEND_STORE_URI"].startswith(
            "postgresql+psycopg2://"
        )
        # Authentication as in the local profile: nothing without the admin's credentials.
        response = requests.get(
            f"{s.tracking_uri}/api/2.0/mlflow/experiments/search?max_results=5", timeout=60
        )
        assert response.status_code == 401

        client = MlflowClient(tracking_uri=s.tracking_uri, registry_uri=s.tracking_uri)
        experiment = client.create_experiment("cluster-store")
        run = client.create_run(experiment)
        client.log_metric(run.info.run_id, "auc", 0.75)
        client.set_terminated(run.info.run_id)
        client.create_registered_model("cluster-model")

        url = stack_postgres_url(s, MLFLOW_DATABASE)
        with psycopg2.connect(url, connect_timeout=10) as conn, conn.cursor() as cur:
            cur.execute("SELECT name FROM experiments WHERE name = %s", ("cluster-store",))
            assert cur.fetchall() == [("cluster-store",)]
            cur.execute("SELECT key, value FROM metrics WHERE run_uuid = %s", (run.info.run_id,))
            assert cur.fetchall() == [("auc", 0.75)]
            cur.execute("SELECT name FROM registered_models")
            assert ("cluster-model",) in cur.fetchall()
        assert not (s.home / "mlflow" / "mlflow.db").exists()

        # The server signs in as the mlflow database's own role: its password is in the
        # server's environment only, never its command line; the superuser's is in neither.
        superuser = (s.home / "postgres" / "password").read_text().strip()
        password = postgres_role_password_file(s, MLFLOW_DATABASE).read_text().strip()
        assert url.startswith("postgresql://cascade_mlflow:")
        recorded = stack._recorded(s, "mlflow")
        assert recorded is not None
        group = [psutil.Process(recorded["pid"])]
        group += group[0].children(recursive=True)
        for proc in group:
            assert password not in " ".join(proc.cmdline())
            assert superuser not in " ".join(proc.cmdline())
            assert superuser not in "".join(proc.environ().values())

        # A cluster made before a database joined the list gets it at the next start.
        assert services.ensure_databases(s) == []
        conn = psycopg2.connect(superuser_postgres_url(s), connect_timeout=10)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute('DROP DATABASE "feast"')
        finally:
            conn.close()
        assert services.ensure_databases(s) == ["feast"]
