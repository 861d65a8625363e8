"""What `make demo` does, against the started stack, asserting on outcomes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import requests

from cascade.config import REPO_ROOT, Settings
from models.preranking import REGISTERED_MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_kafka_event_starts_a_successful_asset_triggered_run(pipeline_run: dict) -> None:
    assert pipeline_run["run_type"] == "asset_triggered"
    assert pipeline_run["dag_run_state"] == "success", pipeline_run


def test_a_registered_model_version_is_the_champion(stack: Settings, pipeline_run: dict) -> None:
    from mlflow import MlflowClient

    # Both URIs explicitly: unit tests earlier in the session may have set a global registry.
    client = MlflowClient(tracking_uri=stack.tracking_uri, registry_uri=stack.tracking_uri)
    champion = client.get_model_version_by_alias(REGISTERED_MODEL, "champion")
    assert str(champion.version) == str(pipeline_run["register"]["champion_version"])
    run = client.get_run(champion.run_id)
    auc = run.data.metrics["test_auc"]
    assert 0.5 < auc <= 1.0
    assert pipeline_run["train"]["run_id"] == champion.run_id


def test_server_scores_every_candidate_with_the_champion(
    stack: Settings, pipeline_run: dict
) -> None:
    from serving.preranking_client import score

    items = [1, 50, 100, 181, 258, 99999]
    result = score(1, items, settings=stack)
    scores = result["scores"]
    assert len(scores) == len(items)
    assert all(math.isfinite(s) and 0.0 <= s <= 1.0 for s in scores)
    assert str(result["model_version"]) == str(pipeline_run["register"]["champion_version"])


def test_server_scores_with_the_compiled_package_the_gate_passed(
    stack: Settings, pipeline_run: dict
) -> None:
    from serving.preranking_client import score

    version = str(pipeline_run["register"]["champion_version"])
    assert str(score(1, [1, 50], settings=stack)["model_version"]) == version
    log = (stack.logs_dir / "serving.log").read_text()
    gate = pipeline_run["compile"]
    if gate["passed"]:
        # The FSCD pre-ranker's package, downloaded with the version, scores its requests.
        assert f"version {version}: scoring with its compiled package" in log
    else:  # the gate's reason is the log's reason for serving eagerly
        assert f"version {version}: scoring with eager PyTorch: the compile gate" in log


@pytest.mark.parametrize(
    "body",
    [
        {"inputs": [{"name": "user_id", "shape": [1], "datatype": "INT64", "data": [1]}]},
        {
            "inputs": [
                {"name": "user_id", "shape": [1], "datatype": "INT64", "data": [1]},
                {"name": "item_ids", "shape": [0], "datatype": "INT64", "data": []},
            ]
        },
        {
            "inputs": [
                {"name": "user_id", "shape": [1], "datatype": "BYTES", "data": ["bob"]},
                {"name": "item_ids", "shape": [1], "datatype": "INT64", "data": [1]},
            ]
        },
        {"not": "v2"},
    ],
    ids=["missing-items", "empty-items", "string-user", "not-v2"],
)
def test_malformed_requests_get_a_4xx(stack: Settings, pipeline_run: dict, body: dict) -> None:
    response = requests.post(
        f"{stack.serving_url}/v2/models/preranking/infer", json=body, timeout=30
    )
    assert 400 <= response.status_code < 500, response.text


@pytest.mark.browser
def test_airflow_ui_shows_the_asset_triggered_run_as_successful(
    stack: Settings, pipeline_run: dict, tmp_path: Path
) -> None:
    from cascade.airflow_client import airflow_password
    from infra.ui_check import check_dag_runs

    shot = REPO_ROOT / "artifacts" / "screenshots" / "ctr_preranking_runs.png"
    seen = check_dag_runs(
        stack.airflow_url,
        airflow_password(stack) or "",
        "ctr_preranking",
        pipeline_run["dag_run_id"],
        shot,
    )
    assert "Success" in seen["row"] and "Asset Triggered" in seen["row"], seen["row"]
    assert shot.stat().st_size > 10_000


@pytest.mark.browser
def test_a_run_triggered_from_the_form_works_on_the_partition_it_names(
    stack: Settings, pipeline_run: dict
) -> None:
    """A person backfills one partition of the monitor from the UI's trigger form: a date that
    is no date is refused by the form (no run), a real one becomes the run's partition."""
    from cascade.airflow_client import AirflowClient, airflow_password
    from infra.ui_check import trigger_from_form

    airflow = AirflowClient(stack)
    password = airflow_password(stack) or ""
    shots = REPO_ROOT / "artifacts" / "screenshots"
    refused = trigger_from_form(
        stack.airflow_url, password, "ctr_monitor", "2026-13-40", shots / "trigger_refused.png"
    )
    assert refused["run_id"] is None and "Invalid input for param ds" in refused["error"]
    confs = [r.get("conf") or {} for r in airflow.dag_runs("ctr_monitor")]
    assert all(conf.get("ds") != "2026-13-40" for conf in confs)

    # A day before the pipeline's partition: the monitor finds no served rows, so it publishes
    # no drift event (which would start a retraining here) and ends quickly.
    backfill = "2026-11-20"
    started = trigger_from_form(
        stack.airflow_url, password, "ctr_monitor", backfill, shots / "trigger_backfill.png"
    )
    assert started["error"] is None and started["run_id"], started
    run = airflow.wait_for_run(
        "ctr_monitor", match=lambda r: r["dag_run_id"] == started["run_id"], timeout_s=600
    )
    assert (run["state"], run["run_type"], run["conf"]) == ("success", "manual", {"ds": backfill})
    assert airflow.xcom("ctr_monitor", run["dag_run_id"], "resolve_partition") == backfill
    drift = airflow.xcom("ctr_monitor", run["dag_run_id"], "drift")
    assert drift["ds"] == backfill and drift["rows"] == 0 and not drift["retrain"], drift


def test_a_tasks_extra_link_leads_to_its_mlflow_run_tagged_with_the_dag_run(
    stack: Settings, pipeline_run: dict
) -> None:
    from urllib.parse import quote

    from mlflow import MlflowClient

    from cascade.airflow_client import AirflowClient, airflow_password
    from cascade.tracking_auth import tracking_credentials
    from infra.ui_check import follow_extra_link

    airflow = AirflowClient(stack)
    dag_run = pipeline_run["dag_run_id"]
    base = f"/dags/ctr_preranking/dagRuns/{quote(dag_run, safe='')}/taskInstances"
    train_run = pipeline_run["train"]["run_id"]
    run_page = f"{stack.tracking_uri}/#/runs/{train_run}"
    # The task's result and its extra-link buttons carry the same links.
    assert pipeline_run["train"]["links"]["MLflow run"] == run_page
    assert airflow.get(f"{base}/train/links")["extra_links"]["MLflow run"] == run_page
    version = pipeline_run["register"]["version"]
    registered = airflow.get(f"{base}/register/links")["extra_links"]
    assert registered["Model version"] == (
        f"{stack.tracking_uri}/#/models/preranking/versions/{version}"
    )

    client = MlflowClient(tracking_uri=stack.tracking_uri)
    run = client.get_run(train_run)
    tags = run.data.tags
    assert (tags["dag_id"], tags["run_id"], tags["task_id"]) == ("ctr_preranking", dag_run, "train")
    assert tags["ds"] == pipeline_run["train"]["ds"] and tags["try_number"]
    # The training set it read, with its digest (MLflow's Datasets column).
    (read,) = run.inputs.dataset_inputs
    assert f"dt={pipeline_run['train']['ds']}" in read.dataset.name and read.dataset.digest
    # In the browser: the train task's page, its "MLflow run" button, MLflow's page for the run
    # (behind the stack's basic auth: the admin's credentials, as a person types them).
    credentials = tracking_credentials(stack)
    assert credentials is not None
    user, password = credentials
    seen = follow_extra_link(
        stack.airflow_url,
        airflow_password(stack) or "",
        "ctr_preranking",
        dag_run,
        "train",
        "MLflow run",
        run.info.run_name,
        REPO_ROOT / "artifacts" / "screenshots",
        link_credentials={"username": user, "password": password, "origin": stack.tracking_uri},
    )
    assert seen["href"] == run_page and train_run in seen["url"]
    assert Path(seen["screenshot"]).stat().st_size > 10_000
