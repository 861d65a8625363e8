"""Least privilege, attacked: what each service's own credential can write in the registry, and
which secrets a process listing shows.

* ``services_with_registry_write`` (0): a private stack's MLflow tracking server with its
  basic-auth app and the stack's role users (:func:`infra.stack.private_stack`). For each
  service of both profiles (:data:`infra.services.SERVICE_ROLES`), plus a training launch
  (:func:`cascade.training.launch` hands it the writer's), the MLflow credential its
  environment holds (as :func:`infra.services.service_specs` builds it) tries the registry's
  writes on a model the promotion gate registered: create a version, move ``champion``, delete
  the alias, tag the version. A service is counted when any of them succeeds. The promotion
  gate's own credential (read from its file, :func:`cascade.tracking_auth.acting_as`) does the
  same as the control: ``promotion_gate_can_promote`` must be true, or the attempts prove
  nothing. The cluster profile's default Celery workers are services too (every task but the
  promotion gate runs there): each holds its environment's credential and every MLflow
  credential file that a process started the way that worker is (confined, where the host
  allows it: :func:`infra.airflow_cluster.readable_by_worker_tasks`) can read from the state
  folder; each is tried. The promotion worker, the gate's only home, is reported apart
  (``promotion_worker``), and so is whether its key stays out of the default workers' reach
  (``default_workers_reading_signing_key``) and whether a local-profile task, which shares one
  user and state folder with the gate, reads the promoter's file
  (``local_tasks_read_promoter_file``: the local profile does not separate them).
* ``secrets_on_command_lines`` (0): every process's command line (``/proc/*/cmdline``, what
  ``ps`` shows to any user of the host) scanned for every secret the state folder holds (the
  MLflow admin's and the roles' passwords and the app's signing key, the serving token, the
  Spark authentication secret, the PostgreSQL and Redis passwords), while the tracking server
  and the cluster profile's Spark standalone master and worker run and a Spark step (a driver
  authenticated to that master) runs a job.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from cascade.config import Settings, scoped_environ
from cascade.tracking_auth import (
    PASSWORD_VAR,
    PROMOTER,
    USERNAME_VAR,
    WRITER,
    acting_as,
    role_file,
)

MODEL = "privilege-probe"
TRAINING_LAUNCH = "training launch"


def _writes(settings: Settings, version: str) -> tuple[dict[str, bool], dict[str, str]]:
    """Each registry write tried with the credential in this process's environment: whether
    the server let it through, and why each refused one was refused (the error's start)."""
    from mlflow import MlflowClient

    client = MlflowClient(settings.tracking_uri, registry_uri=settings.tracking_uri)
    probe = client.get_model_version(MODEL, version)
    source, run_id = probe.source, probe.run_id
    attempts = {
        "create_version": lambda: client.create_model_version(MODEL, source, run_id=run_id),
        "move_champion": lambda: client.set_registered_model_alias(MODEL, "champion", version),
        "delete_alias": lambda: client.delete_registered_model_alias(MODEL, "champion"),
        "tag_version": lambda: client.set_model_version_tag(MODEL, version, "planted", "yes"),
    }
    done, refused = {}, {}
    for name, attempt in attempts.items():
        try:
            attempt()
        except Exception as exc:  # noqa: BLE001 - refused (403) or failed: not written either way
            done[name] = False
            refused[name] = str(exc)[:160]
        else:
            done[name] = True
    return done, refused


def _held_credentials(settings: Settings) -> dict[str, dict[str, str]]:
    """Service -> the MLflow variables its environment holds (empty: none), for every service
    of both profiles and a training launch."""
    from dataclasses import replace

    from cascade.tracking_auth import role_env
    from infra.services import service_specs

    held: dict[str, dict[str, str]] = {}
    for profile in ("local", "cluster"):
        specs = service_specs(replace(settings, profile=profile))
        for name, spec in specs.items():
            held[name] = {k: spec.env[k] for k in (USERNAME_VAR, PASSWORD_VAR) if k in spec.env}
    held[TRAINING_LAUNCH] = role_env(settings, WRITER)
    return held


def _credentials_in(text: str) -> dict[str, str]:
    """The MLflow variables of a credential file's content (empty: not one)."""
    try:
        stored = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(stored, dict) or not stored.get("password"):
        return {}
    return {USERNAME_VAR: str(stored.get("username", "")), PASSWORD_VAR: str(stored["password"])}


def _worker_credentials(settings: Settings) -> dict[str, Any]:
    """Celery worker of the cluster profile -> what a task there holds: the MLflow credentials
    (its environment's, then each credential file it reads) and the secret files it reads."""
    from dataclasses import replace

    from cascade.signing import private_key_path
    from infra import airflow_cluster
    from infra.services import airflow_env

    cluster = replace(settings, profile="cluster")
    env = airflow_env(cluster)
    confined = airflow_cluster.confinement_works(cluster) is None
    workers: dict[str, Any] = {}
    for name in airflow_cluster.worker_names():
        readable = airflow_cluster.readable_by_worker_tasks(cluster, name, confine=confined)
        found = [{k: env[k] for k in (USERNAME_VAR, PASSWORD_VAR) if k in env}]
        found += [_credentials_in(text) for text in readable.values()]
        unique = {tuple(sorted(c.items())): c for c in found if c}
        workers[name] = {
            "confined": confined,
            "credentials": list(unique.values()),
            "files_read": sorted(str(Path(path).relative_to(settings.home)) for path in readable),
            "reads_signing_key": str(private_key_path(settings.home)) in readable,
        }
    return workers


def _tried(settings: Settings, version: str, credentials: list[dict[str, str]]) -> dict[str, Any]:
    """Each credential's registry writes (:func:`_writes`); a write counts if any achieved it."""
    if not credentials:
        return {"credential": None, "writes": {}}
    writes: dict[str, bool] = {}
    refused: dict[str, str] = {}
    for variables in credentials:
        with scoped_environ(variables):
            done, why = _writes(settings, version)
        writes = {k: writes.get(k, False) or v for k, v in done.items()}
        refused.update({k: v for k, v in why.items() if k not in refused})
    names = [c[USERNAME_VAR] for c in credentials]
    return {
        "credential": names[0] if len(names) == 1 else names,
        "writes": writes,
        "refused_with": refused,
    }


def registry_writes(settings: Settings, folder: Path) -> dict[str, Any]:
    """The registry writes each service's credential achieves (module docstring); ``folder``
    is logged by the writer as the probe's run, which the promoter registers."""
    from mlflow import MlflowClient

    client = MlflowClient(settings.tracking_uri, registry_uri=settings.tracking_uri)
    with acting_as(settings, WRITER):
        experiment = client.get_experiment_by_name(MODEL)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(MODEL)
        run = client.create_run(experiment_id)
        client.log_artifacts(run.info.run_id, str(folder), artifact_path="model")
    model_source = f"{run.info.artifact_uri}/model"
    with acting_as(settings, PROMOTER) as found:
        if not found:
            raise RuntimeError("the stack has no promoter credential: start it with `cascade up`")
        client = MlflowClient(settings.tracking_uri, registry_uri=settings.tracking_uri)
        if not client.search_registered_models(f"name = '{MODEL}'"):
            client.create_registered_model(MODEL)
        version = str(
            client.create_model_version(MODEL, source=model_source, run_id=run.info.run_id).version
        )
        gate, gate_refused = _writes(settings, version)
    by_service: dict[str, Any] = {}
    for name, variables in _held_credentials(settings).items():
        by_service[name] = _tried(settings, version, [variables] if variables else [])
    from infra.airflow_cluster import PROMOTION_WORKER, readable_by_worker_tasks

    workers = _worker_credentials(settings)
    promotion_worker = workers.pop(PROMOTION_WORKER)
    for name, held in workers.items():
        by_service[f"airflow worker {name}"] = {
            **_tried(settings, version, held["credentials"]),
            "confined": held["confined"],
            "files_read": held["files_read"],
        }
    promotion_worker.update(_tried(settings, version, promotion_worker.pop("credentials")))
    writers = sorted(name for name, found in by_service.items() if any(found["writes"].values()))
    # A local-profile task runs as the gate's user on the gate's state folder, unconfined.
    local_reads = readable_by_worker_tasks(settings, "airflow", confine=False)
    return {
        "services_with_registry_write": len(writers),
        "services_that_wrote": writers,
        "services_tried": len(by_service),
        "by_service": by_service,
        "promotion_gate_writes": gate,
        "promotion_gate_refused_with": gate_refused,
        "promotion_gate_can_promote": gate["move_champion"] and gate["create_version"],
        "promotion_worker": promotion_worker,
        "default_workers_reading_signing_key": sum(
            w["reads_signing_key"] for w in workers.values()
        ),
        "local_tasks_read_promoter_file": str(role_file(settings, PROMOTER)) in local_reads,
    }


def stack_secrets(settings: Settings) -> dict[str, str]:
    """Every secret value the state folder's secret files hold: name -> value."""
    from cascade.data_services import spark_secret_file
    from infra.stack import secret_files

    found: dict[str, str] = {}
    for path in [*secret_files(settings), spark_secret_file(settings)]:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        name = str(path.relative_to(settings.home))
        try:
            stored = json.loads(text)
        except ValueError:
            stored = None
        if isinstance(stored, dict):
            for key in ("password", "flask_secret_key"):
                if isinstance(stored.get(key), str) and stored[key]:
                    found[f"{name}:{key}"] = stored[key]
        elif text and "\n" not in text:
            found[name] = text
    return found


def command_lines() -> dict[int, str]:
    """Every process's command line, as any user of the host reads it."""
    lines = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        lines[int(entry.name)] = raw.replace(b"\0", b" ").decode(errors="replace")
    return lines


def scan_command_lines(secrets: dict[str, str], seen: dict[str, list[int]]) -> int:
    """Add each secret found on a command line to ``seen`` (secret name -> pids); returns how
    many processes were read."""
    lines = command_lines()
    for pid, line in lines.items():
        for name, value in secrets.items():
            if len(value) >= 8 and value in line and pid not in seen.setdefault(name, []):
                seen[name].append(pid)
    return len(lines)


def spark_step(settings: Settings, stop: threading.Event) -> dict[str, Any]:
    """A driver on the stack's standalone master, authenticated as every Spark step is
    (:func:`jobs.spark_sessions.stack_conf`), running a job until the scan is done."""
    from jobs.spark_sessions import build_session, stack_conf

    session = build_session(
        "privilege-scan",
        master=settings.stack_spark_master,
        conf={**stack_conf(settings), "spark.driver.host": settings.host},
        local_ip=settings.host,
    )
    try:
        rows = session.range(0, 1000).selectExpr("sum(id) AS total").collect()[0]["total"]
        stop.wait(timeout=30)
        return {"spark_job_rows_summed": int(rows)}
    finally:
        session.stop()


def command_line_secrets(settings: Settings, *, spark: bool = True) -> dict[str, Any]:
    """Scan every process's command line while the stack's services run and, with ``spark``,
    while a Spark step runs on the stack's standalone master (module docstring)."""
    secrets = stack_secrets(settings)
    seen: dict[str, list[int]] = {}
    processes = scan_command_lines(secrets, seen)
    step: dict[str, Any] = {}
    if spark:
        stop = threading.Event()
        result: dict[str, Any] = {}

        def driver() -> None:
            try:
                result.update(spark_step(settings, stop))
            except Exception as exc:  # noqa: BLE001 - reported in the result
                result["error"] = f"{type(exc).__name__}: {exc}"[:500]

        thread = threading.Thread(target=driver, daemon=True)
        thread.start()
        deadline = time.monotonic() + 180
        while thread.is_alive() and time.monotonic() < deadline and not result:
            processes += scan_command_lines(secrets, seen)
            time.sleep(0.5)
        processes += scan_command_lines(secrets, seen)  # the driver's JVM, its job done
        stop.set()
        thread.join(timeout=60)
        step = result
    return {
        "secrets_on_command_lines": sum(len(pids) for pids in seen.values()),
        "secrets_seen_on_command_lines": {k: len(v) for k, v in seen.items() if v},
        "secrets_scanned_for": sorted(secrets),
        "command_lines_read": processes,
        "spark_step": step,
    }


def run(workdir: Path, *, spark: bool = True) -> dict[str, Any]:
    """A private stack in ``workdir`` (its MLflow, and with ``spark`` the standalone Spark),
    attacked as the module's docstring says."""
    from infra.stack import private_stack

    folder = workdir / "model"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.txt").write_text("weights")
    services = ("mlflow", "spark") if spark else ("mlflow",)
    env = {"CASCADE_SPARK_MASTER": "stack", "CASCADE_SPARK_WORKERS": "1"}
    with private_stack(workdir / "privilege-state", services=services, env=env) as settings:
        writes = registry_writes(settings, folder)
        lines = command_line_secrets(settings, spark=spark)
    return {**writes, **lines}
