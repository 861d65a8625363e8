"""Benchmark ``cluster``: one ``ctr_preranking`` partition on the cluster stack, then faults.

    cascade bench cluster --out bench-results/cluster.json
    cascade bench cluster --out /tmp/cluster.json --quick     # the run and the broker fault only

It starts the cluster profile's stack in a temporary state folder on free loopback ports
(PostgreSQL, Redis, a Spark standalone master with two workers, three Apache Kafka nodes, MLflow
on PostgreSQL, Airflow on PostgreSQL with two Celery workers, both model servers) and stops it by
pid at the end, so a running stack is never touched. Then:

1. **The run.** A ``cascade.data.landed`` event on Kafka (dataset ``impressions``) starts
   ``ctr_cross`` for one partition (a generated log: its cross statistics and those of the
   three days before it; with ``--quick`` the one day before it, from 100,000 impressions over
   14 days, and 5 epochs instead of 10, no checkpoint: no fault interrupts it), whose published
   partition starts ``ctr_preranking``; ``run_s`` is the event-to-finish wall time of both.
   What the run used is
   read from the engines' own records: ``spark_workers_used`` (standalone workers that hosted
   an executor of the run's Spark applications: each keeps a folder per application it ran),
   ``airflow_workers_used`` (the Celery workers Airflow's task records name),
   ``online_store`` (the Feast online store's type, with the number of keys the run wrote to
   Redis), ``ledger`` (the backend whose table holds the event's claim) and ``served`` (a
   request to the deployed server, with the bearer token, answered with scores). Then (not
   with ``--quick``) a 200,000-key cross partition is loaded into the stack's Redis by the
   Spark executors, as the ``ctr_cross`` pipeline's ``feast`` step loads it in this profile:
   ``materialize_rows_per_s``, ``materialize_workers`` (:func:`materialize_on_cluster`).
2. **Faults** (not with ``--quick``): a second event starts a run of the next partition
   (``CASCADE_PRERANKING_CHECKPOINT_EVERY`` steps between checkpoints). While its Spark
   training-set job runs, one standalone worker is killed with its executors; once its training
   has written a checkpoint, the Celery worker running ``train`` is killed with its task
   processes: both training node ranks' launchers and workers die with it (a lost host).
   Airflow fails the lost try once its heartbeat is 20 s old and retries it on the surviving
   worker, which resumes from the checkpoint. Once the retry has written a checkpoint of its
   own, training node rank 1's launcher is killed with its workers (a lost training node): node
   0 is ended with it, the try fails, and the third try resumes from what the second left
   (finished phases, the newer checkpoint). ``train_resumes`` lists each resume as
   ``phase@step``, each fault its ``after_checkpoint``. Last, ``broker_killed``: one of the
   three Kafka nodes (``kafka_brokers``; topics with replication 3, ``min.insync.replicas``
   2) is SIGKILLed in the middle of a burst of probe events that the Celery-run watchers
   consume, and restarted; it survived when every event was worked exactly once. ``faults``
   records each fault (injected, and whether the run still succeeded); ``faults_survived``
   counts the injected ones it survived. ``lost`` and ``duplicates`` are counted from the input
   rows end to end (:func:`rows_accounted`): every landed impression of the run's training
   days against the training set the run built, as multisets of :data:`ROW_KEY` (``lost``:
   landed rows with no training row, ``duplicates``: training rows beyond their landed count;
   ``rows_accounted`` holds both counts); ``tasks_not_succeeded`` counts the run's tasks that
   did not end in success and ``extra_registry_versions`` the registry versions beyond one.
3. **The peer** (not with ``--quick``): the same partition on the local profile's stack
   (``local_run_s``, ``cluster_vs_local`` = ``run_s`` / ``local_run_s``), started after the
   cluster stack has stopped, so the two never share the cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import psutil

from cascade.broker import describe
from cascade.config import Settings
from infra import airflow_cluster, spark_standalone
from infra.kafka_broker import broker_info
from infra.stack import private_stack
from infra.supervise import lose_node
from models.preranking import REGISTERED_MODEL

DAG_ID = "ctr_preranking"
DS = "2026-11-22"
FAULTS_DS = "2026-11-23"
"""The faults run's partition: new data, so its training starts afresh (a finished partition's
phases would be reused and no training would be under way to kill)."""
CHECKPOINT_EVERY = "20"
HEARTBEAT_TIMEOUT_S = "20"

BASE_ENV = {
    # Runs start from the benchmark's events only; retries seconds after a failure.
    "CASCADE_AIRFLOW_SCHEDULES": "0",
    # The partition's impressions and the three days before it that the pre-ranker trains on.
    "CASCADE_CROSS_IMPRESSIONS": "100000",
    "CASCADE_CROSS_HISTORY_DAYS": "3",
    "CASCADE_PRERANKING_TRAIN_DAYS": "3",
    # ~66 steps per training phase (10 epochs of ~8,500 rows): checkpoints inside each.
    "CASCADE_PRERANKING_EPOCHS": "10",
    # These short phases on ~8,500 impressions prune no field: no cost budget (the benchmark
    # measures the engines; the budget's refusal has its own tests).
    "CASCADE_PRERANKING_COST_BUDGET": "1",
    "CASCADE_RETRY_DELAY_S": "2",
    "CASCADE_COALESCE_WINDOW_S": "5",
    "CASCADE_PRERANKING_CHECKPOINT_EVERY": CHECKPOINT_EVERY,
}
CLUSTER_ENV = {
    **BASE_ENV,
    "CASCADE_PROFILE": "cluster",
    "CASCADE_SPARK_WORKER_MEMORY": "1g",
    # A lost worker's task is failed (and retried) once its heartbeat is this old.
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": HEARTBEAT_TIMEOUT_S,
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
}
LOCAL_ENV = {**BASE_ENV, "CASCADE_PROFILE": "local"}
QUICK_ENV = {
    # No fault interrupts the quick run: a shorter history and training do the same steps.
    # One history day: each day is one more pass of the statistics job and of the gate on the
    # standalone workers. The day before the partition holds 1/14 of a generated log spanning
    # 14 days: 100,000 impressions give it ~7,200 rows and ~130 clicks in the validation split
    # (FSCD needs 100), as 250,000 over the default 35 days did, with 40% of the rows for the
    # statistics job, the gate and the Redis load to work through (~125,000 keys, not ~310,000).
    "CASCADE_CROSS_IMPRESSIONS": "100000",
    "CASCADE_CROSS_GENERATED_DAYS": "14",
    "CASCADE_CROSS_HISTORY_DAYS": "1",
    "CASCADE_PRERANKING_TRAIN_DAYS": "1",
    "CASCADE_PRERANKING_EPOCHS": "5",
    # No fault resumes from a checkpoint here: none is written inside a phase (~45 steps).
    "CASCADE_PRERANKING_CHECKPOINT_EVERY": "1000",
}
RUN_TIMEOUT_S = 2400.0
BROKER_KILLED = "broker_2"
"""The Kafka node the broker fault kills (one of three; replication 3, min.insync.replicas 2)."""
BROKER_BURST = 200


def spark_apps(settings: Settings) -> set[str]:
    """Application ids of the stack's standalone master that wrote an event log."""
    from cascade.data_services import spark_event_dir

    folder = spark_event_dir(settings)
    if not folder.is_dir():
        return set()
    return {path.name.split("app-", 1)[1] for path in folder.iterdir() if "app-" in path.name}


def workers_of_apps(settings: Settings, apps: set[str]) -> list[int]:
    """Standalone workers (1-based) that hosted an executor of any of ``apps``: a worker keeps
    a folder per application whose executor it launched."""
    from infra.spark_standalone import worker_dir

    used = []
    for index in range(1, settings.spark_workers + 1):
        if any((worker_dir(settings, index) / f"app-{app}").is_dir() for app in apps):
            used.append(index)
    return used


def run_tasks(settings: Settings, run_id: str) -> list[dict[str, Any]]:
    from cascade.airflow_client import AirflowClient

    return AirflowClient(settings).task_instances(DAG_ID, run_id)


def ledger_backend(settings: Settings, event_id: str) -> str | None:
    """``postgresql`` or ``sqlite``: the ledger whose table holds the event's claim (by the DAG
    the event starts: ``ctr_cross``, whose published partition starts ``ctr_preranking``); None
    when no ledger holds it."""
    from cascade.event_ledger import ClaimLedger, PostgresEventLedger
    from infra.demo import STARTED_BY

    ledger = ClaimLedger.for_settings(settings)
    claimed_by = STARTED_BY[DAG_ID][0] if DAG_ID in STARTED_BY else DAG_ID
    if event_id not in ledger.claimed_at(claimed_by):
        return None
    return "postgresql" if isinstance(ledger, PostgresEventLedger) else "sqlite"


def online_store_keys(settings: Settings) -> tuple[str, int | None]:
    """The Feast online store's type and, for Redis, the keys its database holds."""
    from domains.ctr.feature_store import repo_config

    config = repo_config(settings).online_store
    if config.type != "redis":
        return config.type, None
    import redis

    host_port, *options = config.connection_string.split(",")
    host, port = host_port.rsplit(":", 1)
    fields = dict(option.split("=", 1) for option in options if "=" in option)
    client = redis.Redis(host=host, port=int(port), password=fields.get("password"))
    try:
        return "redis", int(client.dbsize())
    finally:
        client.close()


MATERIALIZE_DS = "2026-10-01"
"""The partition the materialization figure loads: not one the pipeline runs build (:data:`DS`,
:data:`FAULTS_DS` and their history), whose ``user_cat`` partitions the first run has written."""
MATERIALIZE_ROWS = 200_000
MATERIALIZE_FILES = 4


def materialize_on_cluster(
    settings: Settings, rows: int = MATERIALIZE_ROWS, files: int = MATERIALIZE_FILES
) -> dict[str, Any]:
    """A ``user_cat`` cross partition of ``rows`` keys (``files`` parquet files) loaded into the
    stack's Redis as the ``ctr_cross`` pipeline's ``feast`` step loads it in the cluster profile:
    by the ``spark`` engine on the standalone master's executors. ``materialize_rows_per_s`` is
    feature rows per second of the Spark job (scan included, Feast's apply excluded);
    ``materialize_workers`` the standalone workers whose executors wrote rows."""
    from benchmarks.online_materialize import PAIR, write_pair_partition
    from cascade.lake import Lake
    from infra.spark_standalone import worker_dir
    from jobs import ctr_cross_stats as job
    from jobs.ctr_cross_features import materialize_cross
    from jobs.online_materialize import SparkViewLoader

    write_pair_partition(Lake(settings.lake_root), rows, files, ds=MATERIALIZE_DS)
    spark = job.build_session(settings, app="cascade.bench.cluster.materialize")
    try:
        loaded = materialize_cross(
            MATERIALIZE_DS,
            settings=settings,
            source="generated",
            pairs=[PAIR],
            engine="spark",
            loader=SparkViewLoader(spark, settings),
        )
    finally:
        spark.stop()
    writers = loaded.get("writer_dirs", [])
    workers = [
        index
        for index in range(1, settings.spark_workers + 1)
        if any(str(w).startswith(str(worker_dir(settings, index))) for w in writers)
    ]
    return {
        "materialize_rows": loaded["rows"],
        "materialize_s": loaded["write_s"],
        "materialize_rows_per_s": loaded["rows_per_s"],
        "materialize_engine": loaded["engine"],
        "materialize_workers": len(workers),
    }


def served(settings: Settings) -> dict[str, Any]:
    """One request to the deployed pre-ranker, as a client with the stack's token sends it."""
    from serving.preranking_client import score

    answer = score(1, [10, 20, 30], settings=settings)
    return {"model_version": answer.get("model_version"), "scores": len(answer["scores"])}


def registry_versions(settings: Settings) -> int:
    import mlflow

    client = mlflow.MlflowClient(
        tracking_uri=settings.tracking_uri, registry_uri=settings.tracking_uri
    )
    return len(client.search_model_versions(f"name = '{REGISTERED_MODEL}'"))


def _trigger_and_wait(
    settings: Settings, echo: Callable[[str], None], ds: str = DS
) -> dict[str, Any]:
    from infra.demo import land_demo_data, trigger, wait_for_triggered

    started = time.monotonic()
    land_demo_data(ds, settings=settings, echo=echo)  # generated impressions, by name
    triggered = trigger(ds, settings=settings, echo=echo)
    result = wait_for_triggered(
        triggered, settings=settings, timeout_s=RUN_TIMEOUT_S, echo=echo, result_tasks=("train",)
    )
    result["run_s"] = round(time.monotonic() - started, 1)
    return result


def _running_task(settings: Settings, run_id_holder: dict[str, str], task_id: str) -> dict | None:
    run_id = run_id_holder.get("run_id")
    if not run_id:
        return None
    with contextlib.suppress(Exception):
        for ti in run_tasks(settings, run_id):
            if ti["task_id"] == task_id and ti["state"] == "running" and ti["hostname"]:
                return ti
    return None


def _train_dir(settings: Settings, ds: str) -> Path:
    """The partition's training run folder (its log, finished phases and checkpoints)."""
    from cascade.lake import Lake

    return Lake(settings.lake_root).reports("train", ds)


def _train_log(settings: Settings, ds: str) -> str:
    log = _train_dir(settings, ds) / "train.log"
    return log.read_text(errors="replace") if log.is_file() else ""


def _checkpointed_since_resume(settings: Settings, ds: str) -> bool:
    """The partition's training, resumed, has written a checkpoint since its last resume."""
    text = _train_log(settings, ds)
    resumed = list(re.finditer(r"\[cascade\] \S+: resumed at step", text))
    return bool(resumed) and "checkpoint at step" in text[resumed[-1].end() :]


def _phase_steps(settings: Settings, ds: str, event: str) -> list[str]:
    """``phase@step`` of each ``[cascade] PHASE: EVENT at step N`` line of the partition's
    training log, in order."""
    pattern = rf"\[cascade\] (\S+): {event} at step (\d+)"
    return [f"{phase}@{step}" for phase, step in re.findall(pattern, _train_log(settings, ds))]


def resumes(settings: Settings, ds: str) -> list[str]:
    """Where the partition's training resumed, in order: ``phase@step``."""
    return _phase_steps(settings, ds, "resumed")


def phase_finished(settings: Settings, ds: str, phase: str) -> bool:
    """The partition's training phase ``phase`` has saved its final weights."""
    return (_train_dir(settings, ds) / "phases" / phase / "model.pt").exists()


def last_checkpoint(settings: Settings, ds: str) -> str | None:
    """The partition's training's last checkpoint so far: ``phase@step``, or None."""
    written = _phase_steps(settings, ds, "checkpoint")
    return written[-1] if written else None


def node_launcher(worker: psutil.Process, rank: int) -> psutil.Process | None:
    """The ``torch.distributed.run`` launcher of node rank ``rank`` among ``worker``'s
    descendants (the train task's processes); None if none."""
    with contextlib.suppress(psutil.Error):
        for proc in worker.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                cmdline = proc.cmdline()
                if "torch.distributed.run" in cmdline and "--node_rank" in cmdline:
                    if cmdline[cmdline.index("--node_rank") + 1] == str(rank):
                        return proc
    return None


def inject_faults(
    settings: Settings, holder: dict[str, str], faults: list[dict[str, Any]], stop: threading.Event
) -> None:
    """Kill a Spark worker during ``training_set``, the Celery worker running ``train`` once it
    checkpointed, then, in the retry, training node rank 1 once it checkpointed again; each
    fault is recorded in ``faults`` as it is injected."""
    spark = {"fault": "spark_worker_killed_during_training_set", "injected": False}
    airflow = {"fault": "airflow_worker_and_training_nodes_killed", "injected": False}
    node = {"fault": "training_node_killed", "injected": False}
    faults.extend([spark, airflow, node])
    before = set(holder.get("apps_before", "").split(",")) - {""}
    while not stop.is_set() and not spark["injected"]:
        if _running_task(settings, holder, "training_set"):
            new = spark_apps(settings) - before
            if new and len(workers_of_apps(settings, new)) == settings.spark_workers:
                proc = spark_standalone.worker_process(settings, 2)
                if proc is not None:
                    lose_node(proc)
                    spark.update(injected=True, worker=2, app=sorted(new))
        elif holder.get("training_set_done"):
            break
        time.sleep(0.2)
    while not stop.is_set() and not airflow["injected"]:
        ti = _running_task(settings, holder, "train")
        checkpoint = last_checkpoint(settings, FAULTS_DS) if ti else None
        if checkpoint is not None:
            proc = airflow_cluster.worker_process(settings, ti["hostname"])
            if proc is not None:
                lose_node(proc)
                airflow.update(
                    injected=True,
                    worker=ti["hostname"],
                    try_number=ti["try_number"],
                    after_checkpoint=checkpoint,
                )
        time.sleep(0.5)
    while not stop.is_set() and not node["injected"]:
        ti = _running_task(settings, holder, "train")
        checkpoint = last_checkpoint(settings, FAULTS_DS)
        phase = checkpoint.split("@")[0] if checkpoint else ""
        # Mid-phase: a checkpoint of a phase that has not finished (one that ends right after
        # its last checkpoint would be reused whole, and nothing would resume from a step).
        if (
            ti
            and ti["try_number"] > airflow["try_number"]
            and checkpoint is not None
            and _checkpointed_since_resume(settings, FAULTS_DS)
            and not phase_finished(settings, FAULTS_DS, phase)
        ):
            worker = airflow_cluster.worker_process(settings, ti["hostname"])
            launcher = node_launcher(worker, 1) if worker is not None else None
            if launcher is not None:
                lose_node(launcher)
                node.update(
                    injected=True,
                    node_rank=1,
                    after_checkpoint=checkpoint,
                    phase_finished_at_kill=phase_finished(settings, FAULTS_DS, phase),
                    worker=ti["hostname"],
                    try_number=ti["try_number"],
                )
        time.sleep(0.5)


def _watch_run_id(settings: Settings, holder: dict[str, str], before: set[str], stop) -> None:
    from cascade.airflow_client import AirflowClient

    client = AirflowClient(settings)
    while not stop.is_set() and "run_id" not in holder:
        with contextlib.suppress(Exception):
            for run in client.dag_runs(DAG_ID, limit=20):
                if run["dag_run_id"] not in before and run["run_type"] == "asset_triggered":
                    holder["run_id"] = run["dag_run_id"]
        time.sleep(0.5)
    while not stop.is_set():
        with contextlib.suppress(Exception):
            states = {ti["task_id"]: ti["state"] for ti in run_tasks(settings, holder["run_id"])}
            if states.get("training_set") == "success":
                holder["training_set_done"] = "1"
        time.sleep(1.0)


def cluster_phase(home: Path, quick: bool, echo: Callable[[str], None]) -> dict[str, Any]:
    from cascade.airflow_client import AirflowClient
    from infra.demo import land_demo_data

    out: dict[str, Any] = {}
    started = time.monotonic()
    env = {**CLUSTER_ENV, **QUICK_ENV} if quick else CLUSTER_ENV
    with private_stack(home, env=env) as settings:
        out["stack_start_s"] = round(time.monotonic() - started, 1)
        kafka = describe(settings)
        out["kafka_brokers"] = len(kafka["brokers"])
        out["kafka"] = {**broker_info(), "brokers": kafka["brokers"]}
        first = _trigger_and_wait(settings, echo)
        out["run_s"] = first["run_s"]
        out["run_state"] = first["dag_run_state"]
        tasks = run_tasks(settings, first["dag_run_id"])
        out["airflow_workers_used"] = len({ti["hostname"] for ti in tasks if ti["hostname"]})
        out["airflow_workers"] = sorted({ti["hostname"] for ti in tasks if ti["hostname"]})
        apps = spark_apps(settings)
        out["spark_workers_used"] = len(workers_of_apps(settings, apps))
        out["spark_applications"] = len(apps)
        out["online_store"], out["online_store_keys"] = online_store_keys(settings)
        out["ledger"] = ledger_backend(settings, first["event_id"])
        out["served"] = served(settings)
        out["auc"] = (first.get("train") or {}).get("test_auc")
        if quick:
            # The broker fault alone (a minute): the training faults need the full run.
            broker = broker_fault(settings, echo)
            out["faults"] = [broker]
            out["faults_survived"] = int(broker["survived"])
            return out
        out |= materialize_on_cluster(settings)

        # Faults, on a second run of the same partition.
        client = AirflowClient(settings)
        land_demo_data(FAULTS_DS, settings=settings, echo=echo)  # its Spark app is not the fault's
        holder: dict[str, str] = {"apps_before": ",".join(spark_apps(settings))}
        before = {r["dag_run_id"] for r in client.dag_runs(DAG_ID, limit=100)}
        versions_before = registry_versions(settings)
        faults: list[dict[str, Any]] = []
        stop = threading.Event()
        watchers = [
            threading.Thread(target=_watch_run_id, args=(settings, holder, before, stop)),
            threading.Thread(target=inject_faults, args=(settings, holder, faults, stop)),
        ]
        for thread in watchers:
            thread.daemon = True
            thread.start()
        try:
            second = _trigger_and_wait(settings, echo, FAULTS_DS)
        finally:
            stop.set()
            for thread in watchers:
                thread.join(timeout=10)
        succeeded = second["dag_run_state"] == "success"
        for fault in faults:
            fault["survived"] = bool(fault["injected"] and succeeded)
        tasks = run_tasks(settings, second["dag_run_id"])
        out["faults"] = faults
        out["faults_survived"] = sum(1 for f in faults if f["survived"])
        out["faults_run_s"] = second["run_s"]
        rows = faults_run_rows(settings, FAULTS_DS)
        out["rows_accounted"] = rows
        out["lost"], out["duplicates"] = rows["lost"], rows["duplicates"]
        out["tasks_not_succeeded"] = sum(1 for ti in tasks if ti["state"] != "success")
        out["extra_registry_versions"] = max(0, registry_versions(settings) - versions_before - 1)
        out["train_tries"] = next(ti["try_number"] for ti in tasks if ti["task_id"] == "train")
        out["train_resumes"] = resumes(settings, FAULTS_DS)
        broker = broker_fault(settings, echo)
        faults.append(broker)
        out["faults_survived"] += int(broker["survived"])
    return out


ROW_KEY = ("user_id", "item_id", "event_timestamp", "click")
"""What identifies an impression from the landed log to the training set (no log carries an
impression id; an exact repeat of all four is counted as many times as it occurs)."""


def rows_accounted(landed: pd.DataFrame, trained: pd.DataFrame) -> dict[str, int]:
    """``landed`` (input) against ``trained`` (output) rows as multisets of :data:`ROW_KEY`:
    ``lost`` input rows with no output row, ``duplicates`` output rows beyond their input's
    count, with both sizes."""

    def counts(frame: pd.DataFrame) -> pd.Series:
        keys = frame[list(ROW_KEY)].copy()
        keys["event_timestamp"] = pd.to_datetime(keys["event_timestamp"], utc=True)
        keys["click"] = keys["click"].astype("int64")
        return keys.value_counts()

    given, made = counts(landed), counts(trained)
    both = pd.concat([given.rename("landed"), made.rename("trained")], axis=1).fillna(0)
    return {
        "landed_rows": int(given.sum()),
        "training_rows": int(made.sum()),
        "lost": int((both["landed"] - both["trained"]).clip(lower=0).sum()),
        "duplicates": int((both["trained"] - both["landed"]).clip(lower=0).sum()),
    }


def landed_rows_of_days(landed: pd.DataFrame, days: list[str]) -> pd.DataFrame:
    """The landed impressions whose UTC day is one of ``days`` (a training set's days)."""
    from jobs.ctr_training_set import impression_days

    return landed[impression_days(landed["event_timestamp"]).isin(days).to_numpy()]


def faults_run_rows(settings: Settings, ds: str) -> dict[str, int]:
    """:func:`rows_accounted` for the training set the ``ctr_preranking`` run of ``ds`` built:
    the impressions landed for ``ds`` on its training days (its ``training.json`` names them)
    against the set's rows."""
    from cascade.lake import TRAINING_PROVENANCE, Lake
    from cascade.landing import landing_dir
    from jobs.ctr_training_set import DATA_FILE

    lake = Lake(settings.lake_root)
    built = lake.training_set("preranking", ds)
    days = json.loads((built / TRAINING_PROVENANCE).read_text())["days"]
    landed = pd.read_parquet(landing_dir(lake, "impressions", ds))
    trained = pd.read_parquet(built / DATA_FILE, columns=list(ROW_KEY))
    return rows_accounted(landed_rows_of_days(landed, days), trained)


def broker_fault(settings: Settings, echo: Callable[[str], None]) -> dict[str, Any]:
    """A Kafka node SIGKILLed in the middle of a burst of probe events that the Celery-run
    watchers consume (``event_probe``): survived when every event was worked exactly once."""
    from benchmarks.event_delivery import broker_kill_burst, wait_for_probe_dag

    wait_for_probe_dag(settings)
    echo(f"fault: SIGKILL Kafka node {BROKER_KILLED} mid-burst ({BROKER_BURST} events)")
    burst = broker_kill_burst(
        settings, events=BROKER_BURST, window_s=5.0, node=BROKER_KILLED, settle_s=10.0
    )
    return {
        "fault": "broker_killed",
        "node": BROKER_KILLED,
        "injected": True,
        "survived": burst["lost"] == 0 and burst["duplicates"] == 0,
        **{k: burst[k] for k in ("published", "lost", "duplicates", "restarted_after_s")},
        "seconds_until_all_accounted": burst["seconds_until_all_accounted"],
    }


def local_phase(home: Path, echo: Callable[[str], None]) -> dict[str, Any]:
    with private_stack(home, env=LOCAL_ENV) as settings:
        run = _trigger_and_wait(settings, echo)
        return {"local_run_s": run["run_s"], "local_run_state": run["dag_run_state"]}


def run(out: Path, quick: bool) -> dict[str, Any]:
    def echo(line: str) -> None:
        print(f"[bench cluster] {line}", flush=True)

    with tempfile.TemporaryDirectory(prefix="cascade-bench-cluster-") as tmp:
        result: dict[str, Any] = {"ds": DS, "dag_id": DAG_ID, "quick": quick}
        result |= cluster_phase(Path(tmp) / "cluster", quick, echo)
        if not quick:
            result |= local_phase(Path(tmp) / "local", echo)
            result["cluster_vs_local"] = round(result["run_s"] / result["local_run_s"], 2)
    result["cores"] = os.cpu_count()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    return result
