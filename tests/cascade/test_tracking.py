"""Training without the stack: a run that finds no MLflow server says so in one line and logs
to a local store, and a pipeline run that needs the registry fails at once instead of after
MLflow's client retried for minutes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cascade.config import Settings
from cascade.ports import free_port
from cascade.training.resumable_run import TrackingUnavailable, reachable_tracking
from models.preranking.cascade_train import launch_cascade


def dead(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", mlflow_tracking_uri=f"http://127.0.0.1:{free_port()}")


def test_no_server_falls_back_to_a_local_store_or_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = dead(tmp_path)
    local = reachable_tracking(settings, tmp_path / "run", fallback=True, who="train")
    assert local.tracking_uri == f"sqlite:///{(tmp_path / 'run' / 'mlflow.db').resolve()}"
    assert "does not answer (start the local stack with `cascade up`" in capsys.readouterr().out
    started = time.monotonic()
    with pytest.raises(TrackingUnavailable, match=r"^train: MLflow at http://127.0.0.1:\d+ does"):
        reachable_tracking(settings, tmp_path / "run", fallback=False, who="train")
    assert time.monotonic() - started < 5
    stored = Settings(home=tmp_path / "home", mlflow_tracking_uri="sqlite:////tmp/x.db")
    assert reachable_tracking(stored, tmp_path, fallback=False, who="train") is stored


@pytest.mark.slow
def test_the_documented_training_command_runs_without_the_stack(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, tail = launch_cascade("debug", out, processes=1, settings=dead(tmp_path))
    assert code == 0, tail
    assert "does not answer" in (out / "train.log").read_text()
    assert (out / "mlflow.db").is_file()
    assert json.loads((out / "result.json").read_text())["run_id"]


def test_runs_are_named_and_tagged_with_their_pipeline_partition_and_airflow_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow

    from cascade.step_runner import step_context
    from cascade.training.resumable_run import open_resumable_run

    settings = Settings(
        home=tmp_path / "home", mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"
    )
    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", "ctr_preranking")
    monkeypatch.setenv("AIRFLOW_CTX_DAG_RUN_ID", "asset_triggered__2026-11-22T03:00:00")
    monkeypatch.setenv("AIRFLOW_CTX_TASK_ID", "train")
    monkeypatch.setenv("AIRFLOW_CTX_TRY_NUMBER", "1")
    marker = tmp_path / "mlflow_run.json"
    with step_context("ctr_preranking", "train", "2026-11-22"):
        run_id = open_resumable_run(settings, "exp", marker, "cascade-pipeline", {"lr": 0.1})
        mlflow.end_run()
        monkeypatch.setenv("AIRFLOW_CTX_TRY_NUMBER", "2")
        assert open_resumable_run(settings, "exp", marker, "cascade-pipeline", {}) == run_id
        mlflow.end_run()

    run = mlflow.MlflowClient(settings.tracking_uri).get_run(run_id)
    assert run.info.run_name == "ctr_preranking/2026-11-22/cascade-pipeline"
    tags = run.data.tags
    assert (tags["dag_id"], tags["ds"], tags["step"], tags["task_id"]) == (
        "ctr_preranking", "2026-11-22", "train", "train"
    )  # fmt: skip
    assert tags["run_id"].startswith("asset_triggered__") and tags["try_number"] == "2"
