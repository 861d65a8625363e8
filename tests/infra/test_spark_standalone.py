"""The cluster stack's Spark standalone master and two workers, really started on loopback: a
job's executors run on both workers, a worker killed mid-job loses nothing, the daemons and
the drivers share a secret that is never on a command line."""

from __future__ import annotations

import json
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cascade.config import Settings
from cascade.data_services import spark_event_dir
from infra import spark_standalone
from infra.stack import private_stack
from infra.supervise import lose_node

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.slow]

CLUSTER_ENV = {
    "CASCADE_PROFILE": "cluster",
    "CASCADE_SPARK_MASTER": "stack",
    "CASCADE_SPARK_WORKER_MEMORY": "1g",
}


def worker_process(settings: Settings, index: int) -> psutil.Process:
    proc = spark_standalone.worker_process(settings, index)
    assert proc is not None, f"no worker process {index}"
    return proc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """The standalone master, two workers and Redis (the online store), for the module: the
    test that kills a worker runs last."""
    home = tmp_path_factory.mktemp("standalone") / "home"
    with private_stack(home, services=("spark", "redis"), env=CLUSTER_ENV) as settings:
        yield settings


def stop_active_session() -> None:
    """A local session left active in this process by earlier tests (the Spark jobs' unit)
    would be returned by the builder instead of one on the standalone master."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


def test_executors_on_both_workers_write_the_online_store(stack: Settings) -> None:
    from jobs import ctr_cross_features as cf
    from jobs.ctr_cross_stats import build_session
    from jobs.online_materialize import SparkViewLoader
    from tests.domains.ctr.test_online_bulk import DS1
    from tests.jobs.test_online_materialize import CHOSEN, cluster_home, stack_client

    # A state folder of its own (lake, registry) with the stack's Redis password file.
    settings = cluster_home(stack, stack.home / "online")
    stop_active_session()
    spark = build_session(stack, app="cascade.test.standalone.online")
    try:
        tracker = spark.sparkContext.statusTracker()
        deadline = time.monotonic() + 120
        # The driver is listed too: wait for an executor on each worker before the tasks go out.
        while len(tracker.getExecutorInfos()) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        loader = SparkViewLoader(spark, settings, partitions=4)
        run = cf.materialize_cross(DS1, settings=settings, pairs=list(CHOSEN), loader=loader)
    finally:
        spark.stop()
    assert run["engine"] == "spark" and run["rows"] == 2 * 60
    workers = {Path(d).parent.parent.name for d in run["writer_dirs"]}
    assert workers == {"worker-1", "worker-2"}, run["writer_dirs"]
    client = stack_client(stack)
    try:
        assert sum(1 for _ in client.scan_iter(count=1000)) == 2 * 60
    finally:
        client.flushdb()
        client.close()


def test_jobs_use_both_workers_and_survive_a_lost_worker(stack: Settings) -> None:
    from jobs.ctr_cross_stats import build_session

    home = stack.home
    settings = stack
    assert settings.spark_master == f"spark://127.0.0.1:{settings.ports.spark}"
    status = spark_standalone.master_status(settings)
    assert status is not None and status["status"] == "ALIVE"
    assert len(spark_standalone.alive_workers(status)) == 2

    # The secret is in a 0600 file, never on a daemon's command line.
    defaults = home / "spark" / "conf" / "spark-defaults.conf"
    assert stat.S_IMODE(defaults.stat().st_mode) == 0o600
    secret = (home / "spark" / "secret").read_text().strip()
    assert secret and secret in defaults.read_text()
    for index in (1, 2):
        assert secret not in " ".join(worker_process(settings, index).cmdline())

    stop_active_session()
    spark = build_session(settings, app="cascade.test.standalone")
    assert spark.sparkContext.master == settings.spark_master
    try:
        app_id = spark.sparkContext.applicationId
        # Every task runs long enough for the kill below to land while tasks are running.
        outcome: dict[str, object] = {}

        def run() -> None:
            try:
                rdd = spark.sparkContext.parallelize(range(12), 12)
                outcome["sum"] = rdd.map(lambda x: (time.sleep(2.0), x * x)[1]).sum()
            except Exception as exc:  # reported below, in the test's thread
                outcome["error"] = exc

        job = threading.Thread(target=run)
        job.start()
        # Wait until both workers' executors run tasks of this job (one core each).
        tracker = spark.sparkContext.statusTracker()

        def running_tasks() -> int:
            stages = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
            return sum(stage.numActiveTasks for stage in stages if stage is not None)

        deadline = time.monotonic() + 240
        while running_tasks() < 2 and time.monotonic() < deadline and job.is_alive():
            time.sleep(0.2)
        assert running_tasks() >= 2, "a task under way on each worker"
        app_dirs = [home / "spark" / f"worker-{i}" / app_id for i in (1, 2)]
        assert all(d.is_dir() for d in app_dirs), "an executor on each worker"
        lose_node(worker_process(settings, 1))
        job.join(timeout=300)
        assert not job.is_alive(), "the job finished after losing a worker"
        assert "error" not in outcome, outcome.get("error")
        assert outcome["sum"] == sum(x * x for x in range(12))

        # The master saw the worker go; the other one is still alive.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            alive = spark_standalone.alive_workers(spark_standalone.master_status(settings))
            if len(alive) == 1:
                break
            time.sleep(1.0)
        assert len(alive) == 1
        assert not spark_standalone.healthy(settings)
    finally:
        spark.stop()

    # The event log: tasks ran on two executors, and the lost one's tasks were run again.
    (log,) = spark_event_dir(settings).glob(f"*{app_id}*")
    # Spark 4 writes a folder of rolled files (eventlog_v2_APP/events_N_APP) by default.
    files = sorted(log.iterdir()) if log.is_dir() else [log]
    lines = [
        line
        for f in files
        if f.name.startswith("events") or f == log
        for line in f.read_text().splitlines()
    ]
    events = [json.loads(line) for line in lines if line.strip()]
    ended = [e for e in events if e.get("Event") == "SparkListenerTaskEnd"]
    assert len({e["Task Info"]["Executor ID"] for e in ended}) >= 2
    removed = [e for e in events if e.get("Event") == "SparkListenerExecutorRemoved"]
    assert removed and "worker lost" in removed[0]["Removed Reason"]
    succeeded = {
        e["Task Info"]["Index"] for e in ended if e["Task End Reason"]["Reason"] == "Success"
    }
    assert succeeded == set(range(12))
