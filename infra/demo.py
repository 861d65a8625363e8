"""The first end-to-end path, against the real local stack.

    cascade demo            # or: make demo

Starts the stack, lands the partition's generated impressions by name (``cascade land
impressions --source generated``), publishes ``cascade.data.landed`` to Kafka, waits for the
asset-triggered ``ctr_preranking`` run its cross statistics start (impressions event ->
``ctr_cross``: Spark -> GX -> Feast; the published partition -> ``ctr_preranking``: training set
-> DeepSpeed -> compile -> MLflow registry -> serving), scores a request against the served
champion, and prints where to look.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cascade.config import Settings, load_settings
from models.preranking import REGISTERED_MODEL

DAG_ID = "ctr_preranking"

STARTED_BY = {DAG_ID: ("ctr_cross", "impressions")}
"""A DAG chained by data, the upstream DAG that new data starts and the dataset of its event:
``ctr_preranking`` runs when ``ctr_cross`` publishes the partition's cross statistics."""


@dataclass
class Triggered:
    """A published data-landed event and what is needed to find the run it starts."""

    dag_id: str
    event_id: str
    runs_before: set[str]
    published_at: float
    upstream: dict[str, set[str]] = field(default_factory=dict)
    """Runs that existed before the event of each DAG the event starts on the way (its
    upstream DAGs, :data:`STARTED_BY`)."""

    def of(self, dag_id: str) -> Triggered:
        """The same event, followed to the run it starts of ``dag_id`` (an upstream DAG)."""
        if dag_id == self.dag_id:
            return self
        return Triggered(dag_id, self.event_id, self.upstream[dag_id], self.published_at)


def trigger(
    ds: str,
    *,
    settings: Settings,
    echo: Callable[[str], None] = print,
    dag_id: str = DAG_ID,
    dataset: str | None = None,
) -> Triggered:
    """Unpause ``dag_id`` and publish a data-landed event for ``dataset`` and partition ``ds``.

    A DAG chained by data (:data:`STARTED_BY`) is started through its upstream DAG: that one is
    unpaused too and the event is its dataset's (``dataset`` defaults to it)."""
    from cascade.airflow_client import AirflowClient
    from cascade.broker import publish
    from cascade.events import make_event

    client = AirflowClient(settings)
    chain = [dag_id]
    while chain[-1] in STARTED_BY:
        chain.append(STARTED_BY[chain[-1]][0])
    if dataset is None:
        dataset = STARTED_BY[chain[-2]][1] if len(chain) > 1 else "impressions"
    before: dict[str, set[str]] = {}
    for name in chain:
        client.wait_for_dag(name)
        client.patch(f"/dags/{name}", {"is_paused": False})
        before[name] = {r["dag_run_id"] for r in client.dag_runs(name, limit=100)}
    event = make_event(
        "cascade.data.landed", {"dataset": dataset, "partition": ds}, source="cascade-demo"
    )
    where = publish(event, settings=settings)
    via = f" (via {' -> '.join(reversed(chain))})" if len(chain) > 1 else ""
    echo(f"published cascade.data.landed {event.id} ({dataset}, partition {ds}) -> {where}{via}")
    upstream = {name: runs for name, runs in before.items() if name != dag_id}
    return Triggered(dag_id, event.id, before[dag_id], time.monotonic(), upstream)


def wait_for_triggered(
    triggered: Triggered,
    *,
    settings: Settings,
    timeout_s: float,
    echo: Callable[[str], None] = print,
    result_tasks: tuple[str, ...] = ("train", "register", "deploy"),
) -> dict[str, Any]:
    """Wait for the asset-triggered run the event started; the return values of
    ``result_tasks`` come back with the run."""
    from cascade.airflow_client import AirflowClient

    client = AirflowClient(settings)
    dag_id = triggered.dag_id
    run = client.wait_for_run(
        dag_id,
        match=lambda r: (
            r["run_type"] == "asset_triggered" and r["dag_run_id"] not in triggered.runs_before
        ),
        timeout_s=timeout_s,
        echo=echo,
    )
    results: dict[str, Any] = {}
    for task_id in result_tasks:
        try:
            results[task_id] = client.xcom(dag_id, run["dag_run_id"], task_id)
        except Exception:  # a failed run has no xcom for later tasks
            results[task_id] = None
    return {
        "event_id": triggered.event_id,
        "dag_run_id": run["dag_run_id"],
        "dag_run_state": run["state"],
        "run_type": run["run_type"],
        "event_to_finish_s": round(time.monotonic() - triggered.published_at, 1),
        **results,
    }


def trigger_and_wait(
    ds: str,
    *,
    settings: Settings,
    timeout_s: float,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Publish a data-landed event and wait for the ``ctr_preranking`` run it starts: first
    for each upstream run on the way (a failed one is the outcome, with its DAG named)."""
    triggered = trigger(ds, settings=settings, echo=echo)
    for name in reversed(list(triggered.upstream)):
        upstream = wait_for_triggered(
            triggered.of(name), settings=settings, timeout_s=timeout_s, echo=echo, result_tasks=()
        )
        echo(f"== {name} run {upstream['dag_run_id']}: {upstream['dag_run_state']}")
        if upstream["dag_run_state"] != "success":
            return {**upstream, "failed_dag": name}
    return wait_for_triggered(triggered, settings=settings, timeout_s=timeout_s, echo=echo)


def land_demo_data(ds: str, *, settings: Settings, echo: Callable[[str], None] = print) -> None:
    """Land the demo's impressions by name (``cascade land impressions --source generated``):
    the demo chooses generated data explicitly; a partition landed before is kept."""
    from cascade.lake import Lake
    from cascade.landing import get_dataset, is_landed, land, landing_dir

    lake = Lake(settings.lake_root)
    if is_landed(landing_dir(lake, "impressions", ds)):
        echo(f"== impressions of {ds} already landed; kept")
        return
    echo(f"== landing generated impressions for {ds} (cascade land impressions --source generated)")
    land(lake, get_dataset("impressions"), ds, source="generated")


def run_demo(
    *, ds: str, timeout_s: float = 1500, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    from cascade.airflow_client import airflow_password_file
    from cascade.state import secure_state_folder
    from cascade.tracking_auth import credentials_file, use_tracking_credentials
    from infra.stack import up

    settings = load_settings()
    echo("== starting the local stack")
    up(settings, echo=echo)
    use_tracking_credentials(settings)  # written by the first `up`, maybe just now
    land_demo_data(ds, settings=settings, echo=echo)
    echo(f"== event-triggered run of {DAG_ID} for partition {ds}")
    outcome = trigger_and_wait(ds, settings=settings, timeout_s=timeout_s, echo=echo)
    summary: dict[str, Any] = {
        "airflow_url": f"{settings.airflow_url}/dags/{DAG_ID}",
        "airflow_user": "admin",
        # Where the password is, never the password: the summary is a plain file.
        "airflow_password_file": str(airflow_password_file(settings)),
        "mlflow_url": settings.tracking_uri,
        "mlflow_credentials_file": str(credentials_file(settings)),
        "serving_url": f"{settings.serving_url}/v2/models/preranking",
        **outcome,
    }
    if outcome["dag_run_state"] == "success":
        from serving.preranking_client import score

        summary["sample_request"] = score(1, [1, 50, 100, 181, 258], settings=settings)
    out = secure_state_folder(settings.home) / "demo" / "summary.json"
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    out.write_text(json.dumps(summary, indent=2, default=str))
    train, register = outcome.get("train") or {}, outcome.get("register") or {}
    echo("")
    echo(
        f"== {outcome.get('failed_dag', DAG_ID)} run {outcome['dag_run_id']} "
        f"({outcome.get('run_type')}): "
        f"{outcome['dag_run_state']}"
    )
    echo(
        f"   Airflow   {summary['airflow_url']}  (user admin, password in "
        f"{summary['airflow_password_file']})"
    )
    echo(
        f"   MLflow    {summary['mlflow_url']}  run {train.get('run_id')}  (user admin, "
        f"password in {summary['mlflow_credentials_file']})"
    )
    echo(
        f"   champion  {REGISTERED_MODEL} v{register.get('champion_version')} "
        f"AUC {register.get('champion_auc')} (this run: v{register.get('version')}, "
        f"AUC {register.get('test_auc')}, promoted {register.get('promoted')})"
    )
    echo(f"   serving   {summary['serving_url']}")
    echo(f"   summary   {out}")
    echo("   stop the stack with `cascade down`")
    return summary
