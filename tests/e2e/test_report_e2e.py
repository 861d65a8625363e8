"""`cascade report` on the stack after the four event-started runs: every step of each is on
the page with its time, the gates passed, and the training runs' curves come from MLflow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade.config import REPO_ROOT, Settings
from tests.e2e.conftest import DS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_partitions_report_shows_every_run_step_timed_gated_and_its_curves(
    stack: Settings,
    pipeline_run: dict,
    asr_run: dict,
    multimodal_run: dict,
    cross_run: dict,
    tmp_path: Path,
) -> None:
    from cascade.run_report import write_report

    pipelines = ["asr", "ctr_cross", "ctr_preranking", "multimodal"]
    report = write_report(stack, DS, tmp_path, pipelines)
    steps = report["steps"]
    # Each DAG's steps ran through Airflow's tasks, which call the step runner.
    assert {s["status"] for s in steps} == {"ok"}, [s for s in steps if s["status"] != "ok"]
    assert all(s["seconds"] and s["seconds"] > 0 for s in steps)
    gates = {f"{s['pipeline']}.{s['step']}": s["gate"] for s in steps if s["gate"]}
    assert {"ctr_cross.validate", "asr.validate", "multimodal.validate"} <= set(gates)
    assert all(gate["success"] for gate in gates.values()), gates
    # Training curves of the runs the train steps named (the DeepSpeed loss histories).
    # (The fault test may have retrained the pre-ranker: the train step names its latest run.)
    curves = {c["label"]: c for c in report["curves"]}
    for name in ("asr", "ctr_preranking", "multimodal"):
        assert f"{name} · train" in curves, (sorted(curves), report["curves_note"])
    assert curves["multimodal · train"]["run_id"] == multimodal_run["train"]["run_id"]
    assert curves["asr · train"]["run_id"] == asr_run["train"]["run_id"]
    assert any(f["kind"] == "train" for f in report["figures"])  # the FSCD trade-off
    page = (tmp_path / "index.html").read_text()
    for name in pipelines:
        assert f"<h2>{name}</h2>" in page
    assert json.loads((tmp_path / "report.json").read_text())["counts"]["ok"] == len(steps)
    # What a person sees: the page renders with its images (the quickstart's screenshot).
    from infra.ui_check import screenshot_page

    shot = screenshot_page(
        tmp_path / "index.html", REPO_ROOT / "artifacts" / "screenshots" / "report.png"
    )
    assert shot.stat().st_size > 20_000
