"""The cluster profile's Airflow, really started on loopback: metadata in the stack's PostgreSQL,
tasks on two Celery workers fed through its Redis (beside the promotion worker, which takes only
the promotion queue's). Airflow's own records say which worker ran each try; a worker killed
during a task loses nothing: the retry runs on the other worker and no side effect happens
twice."""

from __future__ import annotations

import json
import textwrap
import time
from collections import Counter
from pathlib import Path

import psycopg2
import pytest

from cascade.airflow_client import AirflowClient, airflow_home
from cascade.data_services import AIRFLOW_DATABASE, stack_postgres_url
from infra import airflow_cluster, stack
from infra.commands import status_json
from infra.supervise import lose_node

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DAG_ID = "cluster_probe"
SPREAD = 4
WORKERS = {"cascade-worker-1", "cascade-worker-2"}

PROBE_DAG = '''
"""Four independent short tasks, then one that a test interrupts by killing its worker."""

import datetime as dt
import os
import time

from airflow.sdk import dag, task

EFFECTS = {effects!r}


def effect(line):
    with open(EFFECTS, "a") as out:
        out.write(line + "\\n")
        out.flush()
        os.fsync(out.fileno())


@dag(
    dag_id="{dag_id}",
    schedule=None,
    catchup=False,
    default_args={{"retries": 1, "retry_delay": dt.timedelta(seconds=1)}},
)
def cluster_probe():
    def spread_task(i):
        @task(task_id=f"spread_{{i}}")
        def spread():
            time.sleep(3)
            effect(f"spread_{{i}}")

        return spread()

    spread = [spread_task(i) for i in range({spread})]

    @task
    def failover(**context):
        try_number = context["ti"].try_number
        effect(f"failover started try {{try_number}}")
        # The first try is the one the test interrupts; it would take a minute.
        time.sleep(60 if try_number == 1 else 1)
        effect("failover done")

    spread >> failover()


cluster_probe()
'''


def airflow_home_of(home: Path) -> Path:
    return home / "airflow"


def wait_for(what: str, check, timeout_s: float = 90.0, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.mark.timeout(420)
def test_tasks_spread_over_two_workers_and_survive_a_lost_worker(tmp_path: Path) -> None:
    home, dags, effects = tmp_path / "home", tmp_path / "dags", tmp_path / "effects.txt"
    dags.mkdir()
    (dags / "cluster_probe.py").write_text(
        textwrap.dedent(PROBE_DAG).format(effects=str(effects), dag_id=DAG_ID, spread=SPREAD)
    )
    env = {
        "CASCADE_PROFILE": "cluster",
        # Only the probe DAG: the stack's own DAG files are not needed here.
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(
            [
                {
                    "name": "dags-folder",
                    "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                    "kwargs": {"path": str(dags)},
                }
            ]
        ),
        # A lost worker's task is failed (and retried) once its heartbeat is this old.
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
    }
    services = ("postgres", "redis", "airflow")
    with stack.private_stack(home, services=services, env=env) as settings:
        assert airflow_home(settings) == airflow_home_of(home)
        # Both workers and the promotion worker answer through the broker, and the status
        # says so.
        expected = sorted(
            airflow_cluster.celery_hostname(settings, name)
            for name in airflow_cluster.worker_names()
        )
        wait_for(
            "every worker to answer",
            lambda: airflow_cluster.answering_workers(settings, timeout_s=3.0) == expected,
            timeout_s=60,
        )
        shown = status_json(settings)
        assert shown["airflow_workers"] == expected
        assert {s["name"]: s["healthy"] for s in shown["services"]}["airflow"]

        client = AirflowClient(settings)
        client.wait_for_dag(DAG_ID, timeout_s=120)
        run_id = client.post(f"/dags/{DAG_ID}/dagRuns", {"logical_date": None})["dag_run_id"]

        # The failover task runs: kill the worker that runs it, with its task processes.
        def failover_running() -> str | None:
            if "failover started try 1" not in (effects.read_text() if effects.exists() else ""):
                return None
            ti = client.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/failover")
            return ti["hostname"] if ti["state"] == "running" and ti["hostname"] else None

        lost = wait_for("the failover task to run", failover_running, timeout_s=150)
        assert lost in WORKERS
        lost_worker = airflow_cluster.worker_process(settings, lost)
        assert lost_worker is not None, f"no Celery worker {lost}"
        lose_node(lost_worker)
        assert airflow_cluster.worker_process(settings, lost) is None
        (survivor,) = WORKERS - {lost}
        # Pings get a few seconds each: on a loaded machine the survivor may take more than the
        # status line's one second to answer.
        answers: list[list[str]] = []

        def only_the_survivor_answers() -> bool:
            answers.append(airflow_cluster.answering_workers(settings, timeout_s=3.0))
            return answers[-1] == sorted(
                f"{name}@{settings.host}" for name in (survivor, airflow_cluster.PROMOTION_WORKER)
            )

        try:
            wait_for(
                "the killed worker to stop answering and the survivor to answer",
                only_the_survivor_answers,
                timeout_s=90,
            )
        except AssertionError as error:
            log = (home / "logs" / "airflow.log").read_text(errors="replace").splitlines()
            # The supervisor's own lines (workers started and lost) and the log's last lines.
            shown_lines = [line for line in log if line.startswith("airflow-cluster:")]
            raise AssertionError(
                f"{error}; killed {lost} (pid {lost_worker.pid}), last answers {answers[-3:]}; "
                "airflow.log:\n" + "\n".join([*shown_lines, "...", *log[-15:]])
            ) from None
        assert not stack.state(settings, "airflow").healthy  # one worker short

        run = client.wait_for_run(DAG_ID, match=lambda r: r["dag_run_id"] == run_id, timeout_s=150)
        assert run["state"] == "success"

        # Airflow's records: the spread tasks ran on both workers, the failover's retry on the
        # worker that survived.
        tis = {ti["task_id"]: ti for ti in client.task_instances(DAG_ID, run_id)}
        spread = [tis[f"spread_{i}"] for i in range(SPREAD)]
        assert all(ti["state"] == "success" and ti["try_number"] == 1 for ti in spread)
        assert {ti["hostname"] for ti in spread} == WORKERS
        tries = client.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/failover/tries")
        by_try = {t["try_number"]: t for t in tries["task_instances"]}
        assert sorted(by_try) == [1, 2]
        assert by_try[1]["hostname"] == lost and by_try[1]["state"] != "success"
        assert by_try[2]["hostname"] == survivor and by_try[2]["state"] == "success"

        # The same records are rows of the stack's PostgreSQL, and so are Celery's results.
        def query(sql: str, *args: str) -> list[tuple]:
            url = stack_postgres_url(settings, AIRFLOW_DATABASE)
            with psycopg2.connect(url, connect_timeout=10) as conn, conn.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall()

        rows = {
            task_id: (host, n, state)
            for task_id, host, n, state in query(
                "SELECT task_id, hostname, try_number, state FROM task_instance "
                "WHERE dag_id = %s AND run_id = %s",
                DAG_ID,
                run_id,
            )
        }
        assert rows["failover"] == (survivor, 2, "success")
        assert {rows[f"spread_{i}"][0] for i in range(SPREAD)} == WORKERS
        # A worker stores its Celery result once the task's process has exited, a moment after
        # the task reported success.
        wait_for(
            "Celery's results of the five finished tasks",
            lambda: (
                query("SELECT count(*) FROM celery_taskmeta WHERE status = 'SUCCESS'")[0][0]
                == SPREAD + 1
            ),
            timeout_s=60,
        )
        assert not (airflow_home(settings) / "airflow.db").exists()

        # Nothing done twice: every task's effect once; the interrupted try did not finish.
        done = Counter(effects.read_text().splitlines())
        assert done == Counter(
            {
                **{f"spread_{i}": 1 for i in range(SPREAD)},
                "failover started try 1": 1,
                "failover started try 2": 1,
                "failover done": 1,
            }
        )
