"""The pipeline's compile step on a trained model: artifact, gate report, MLflow, registry."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest

from cascade.config import Settings
from cascade.lake import Lake
from cascade.registry import register_and_promote
from compilers.deploy_gate import compile_and_gate
from tests.cascade.test_registry import fitted, trained

DS = "2026-01-07"


@pytest.mark.slow
def test_compile_step_gates_logs_and_lets_the_registry_promote(settings: Settings) -> None:
    with pytest.raises(FileNotFoundError, match="run the train step"):
        compile_and_gate(DS, settings=settings)
    trained(settings, DS, fitted(30))
    report = compile_and_gate(DS, settings=settings)
    assert report["passed"], report["reasons"]
    assert report["max_abs_diff"] < 1e-3 and abs(report["auc_delta"]) <= 1e-3
    assert report["requests"] > 10 and report["speedup_vs_eager"] > 0
    assert Path(report["artifact"]).stat().st_size > 0
    written = json.loads(
        (Lake(settings.lake_root).reports("compile", DS) / "result.json").read_text()
    )
    assert written["passed"] and written["run_id"] == report["run_id"]

    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    run = client.get_run(report["run_id"])
    assert run.data.tags["compile_gate"] == "passed"
    assert "compile_speedup_vs_eager" in run.data.metrics
    logged = {a.path for a in client.list_artifacts(report["run_id"], "compiled")}
    assert {"compiled/preranking.pt2", "compiled/gate.json"} <= logged

    decision = register_and_promote(DS, settings=settings)
    assert decision["promoted"] and decision["compile_gate"]["passed"]
