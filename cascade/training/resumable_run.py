"""The MLflow run of a training that a retry continues: its id is recorded in a run marker
under the run folder, so an attempt killed half-way and started again logs into the same run."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cascade.config import Settings
from cascade.results import write_result

RUN_MARKER = "mlflow_run.json"
"""File under a run folder naming the MLflow run of the unfinished run."""
START_HINT = "start the local stack with `cascade up` (or `make up`)"


class TrackingUnavailable(RuntimeError):
    """The MLflow tracking server named by the settings does not answer."""


def tracking_answers(uri: str, timeout: float = 0.5) -> bool:
    """Whether an http(s) tracking server accepts a connection (a local store always does)."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https"):
        return True
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def reachable_tracking(settings: Settings, run_dir: Path, *, fallback: bool, who: str) -> Settings:
    """``settings`` when its tracking server answers. Otherwise, with ``fallback``, the same
    settings logging to a private SQLite store in ``run_dir`` (one line says so); without it,
    :class:`TrackingUnavailable` in one line with the fix. MLflow's client would otherwise retry
    for minutes and end with "connection refused"."""
    if tracking_answers(settings.tracking_uri):
        return settings
    if not fallback:
        raise TrackingUnavailable(
            f"{who}: MLflow at {settings.tracking_uri} does not answer; {START_HINT}, or set "
            f"CASCADE_MLFLOW_URI=sqlite:///PATH/mlflow.db to log to a local store"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    private = f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
    print(
        f"[{who}] MLflow at {settings.tracking_uri} does not answer ({START_HINT} to use it); "
        f"logging to {private}",
        flush=True,
    )
    return dataclasses.replace(settings, mlflow_tracking_uri=private)


def use_experiment(settings: Settings, name: str) -> str:
    """Point MLflow at ``settings`` and return experiment ``name``'s id (created if missing).

    With a local store (sqlite/file) the experiment's artifacts go under ``settings.home``:
    MLflow's default is ``./mlruns`` of the current directory, i.e. inside the repository.
    """
    import mlflow

    from cascade.tracking_auth import use_tracking_credentials

    use_tracking_credentials(settings)
    uri = settings.tracking_uri
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    experiment = mlflow.get_experiment_by_name(name)
    if experiment is not None:
        return str(experiment.experiment_id)
    local_store = not uri.startswith(("http://", "https://", "databricks"))
    location = (settings.home / "mlflow-artifacts").as_uri() if local_store else None
    try:
        return str(mlflow.create_experiment(name, artifact_location=location))
    except mlflow.exceptions.MlflowException:
        # Another process created it between our lookup and create.
        experiment = mlflow.get_experiment_by_name(name)
        if experiment is None:
            raise
        return str(experiment.experiment_id)


AIRFLOW_CONTEXT = {
    "dag_id": "AIRFLOW_CTX_DAG_ID",
    "run_id": "AIRFLOW_CTX_DAG_RUN_ID",
    "task_id": "AIRFLOW_CTX_TASK_ID",
    "try_number": "AIRFLOW_CTX_TRY_NUMBER",
}
"""Run tags from the variables Airflow sets in a task's process (inherited by its trainers)."""


def run_context(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Where a training runs from: the step's pipeline, step and ``ds`` (set by
    :func:`cascade.step_runner.step_context`) and the Airflow DAG, run, task and try."""
    from cascade.config import load_settings

    env = os.environ if env is None else env
    runtime = load_settings(env).runtime
    step = {"pipeline": runtime.run_pipeline, "step": runtime.run_step, "ds": runtime.run_ds}
    airflow = {tag: env.get(var, "") for tag, var in AIRFLOW_CONTEXT.items()}
    return {tag: value[:250] for tag, value in {**step, **airflow}.items() if value}


def run_display_name(run_name: str, context: Mapping[str, str]) -> str:
    """``pipeline/ds/name`` when the run belongs to a pipeline's partition, else ``name``:
    every daily run of a pipeline gets its own name in the MLflow UI."""
    if context.get("pipeline") and context.get("ds"):
        return f"{context['pipeline']}/{context['ds']}/{run_name}"
    return run_name


def open_resumable_run(
    settings: Settings,
    experiment: str,
    marker: Path,
    run_name: str,
    params: Mapping[str, Any],
    *,
    resume: bool = True,
    inputs: Mapping[str, Path | str] | None = None,
) -> str:
    """Start an MLflow run in ``experiment``, record its id in ``marker`` and log ``params``
    and the datasets in ``inputs`` (name -> lake path, :mod:`cascade.training.datasets`); or
    reopen the run an interrupted attempt recorded there (all of those are already logged).

    With ``resume=False`` (the attempt left nothing to resume from) a recorded run is marked
    KILLED, so the registry never shows it as still running, and a new run starts.
    """
    import mlflow

    experiment_id = use_experiment(settings, experiment)
    context = run_context()
    previous = str(json.loads(marker.read_text())["run_id"]) if marker.exists() else None
    if resume and previous:
        mlflow.start_run(run_id=previous)
        if context:
            mlflow.set_tags(context)  # a retry: its try_number
        return previous
    if previous:
        with contextlib.suppress(Exception):
            mlflow.tracking.MlflowClient().set_terminated(previous, "KILLED")
    run = mlflow.start_run(
        experiment_id=experiment_id, run_name=run_display_name(run_name, context), tags=context
    )
    write_result(marker, {"run_id": run.info.run_id})
    if params:
        mlflow.log_params(dict(params))
    if inputs:
        from cascade.training.datasets import log_inputs

        log_inputs(inputs)
    return str(run.info.run_id)


@contextlib.contextmanager
def failed_on_error(rank: int) -> Iterator[None]:
    """Rank 0 ends its active MLflow run as FAILED when the block raises (then re-raises)."""
    import mlflow

    try:
        yield
    except BaseException:
        if rank == 0 and mlflow.active_run() is not None:
            mlflow.end_run("FAILED")
        raise
