"""`cascade report`: one page per partition from what the steps left in the lake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade import step_runner
from cascade.cli import main
from tests.cascade.test_step_runner import with_step

DS = "2026-11-22"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tracking(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite tracking store for the module (its schema takes seconds to create)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def _fail(ctx: object) -> dict:
    raise RuntimeError("the log for 2026-11-22 is empty\nsecond line not shown")


def test_the_report_shows_each_steps_status_time_gate_curves_and_figures(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tracking: str,
) -> None:
    import mlflow

    home = tmp_path / "home"
    monkeypatch.setenv("CASCADE_HOME", str(home))
    monkeypatch.setenv("CASCADE_MLFLOW_URI", tracking)
    client = mlflow.MlflowClient(tracking_uri=tracking)
    experiment = client.create_experiment("report-test", artifact_location=str(tmp_path / "art"))
    run_id = client.create_run(experiment).info.run_id
    for step, loss in enumerate([0.9, 0.7, 0.6, 0.55]):
        client.log_metric(run_id, "loss.teacher", loss, step=step)
    client.log_metric(run_id, "test_auc", 0.7)  # one point: no curve

    # Real step-runner records: a step that ran, a gate that said no, a step that raised.
    with_step(monkeypatch, "asr", "corpus", lambda ctx: {"rows": 3})
    gate = {"success": False, "failed": ["user.expect_column_values_to_not_be_null(user_id)"]}
    with_step(monkeypatch, "asr", "validate", lambda ctx: {**gate, "warnings": ["w"]})
    with_step(monkeypatch, "asr", "train", lambda ctx: {"run_id": run_id, "auc": 0.7})
    with_step(monkeypatch, "asr", "compile", _fail)
    for name in ("corpus", "validate", "train"):
        step_runner.run_step(name, DS, "asr")
    with pytest.raises(RuntimeError):
        step_runner.run_step("compile", DS, "asr")
    figure = home / "lake" / "reports" / "train" / f"dt={DS}" / "tradeoff.png"
    figure.parent.mkdir(parents=True, exist_ok=True)
    figure.write_bytes(PNG_MAGIC + b"figure")

    out = tmp_path / "report"
    assert main(["report", "--ds", DS, "--out", str(out), "--pipeline", "asr"]) == 0
    assert "3 steps ok, 1 failed" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    steps = {s["step"]: s for s in report["steps"]}
    assert steps["corpus"]["status"] == "ok" and steps["corpus"]["seconds"] >= 0
    assert steps["validate"]["gate"] == {"success": False, "failed": gate["failed"], "warnings": 1}
    assert steps["compile"]["status"] == "failed"
    assert steps["compile"]["error"] == "RuntimeError: the log for 2026-11-22 is empty"
    assert steps["deploy"]["status"] == "not run" and steps["deploy"]["seconds"] is None
    # Lineage from the catalog: what each step reads and writes, where, and whether it is there.
    corpus = str(home / "lake" / "corpora" / "speech" / f"dt={DS}")
    assert steps["train"]["inputs"] == [
        {"name": "speech_corpus", "location": corpus, "exists": False}
    ]
    assert [d["name"] for d in steps["corpus"]["outputs"]] == ["speech_corpus"]
    # The MLflow run the train step named: its curve, not its one-point metric.
    assert [c["metrics"] for c in report["curves"]] == [["loss.teacher"]]
    assert (out / "figures/train-tradeoff.png").read_bytes().startswith(PNG_MAGIC)
    # The timings and the curves are SVG drawn by the report: one bar per timed step (the
    # failed one red), one line of the run's four points.
    timings = (out / report["timings"]).read_text()
    assert timings.startswith("<svg") and timings.count("<rect x=") == 4
    assert "asr · compile" in timings and "#c0392b" in timings
    curve = (out / report["curves"][0]["file"]).read_text()
    assert curve.startswith("<svg") and "loss.teacher" in curve
    assert len(curve.split("<polyline points='")[1].split("'")[0].split()) == 4
    page = (out / "index.html").read_text()
    assert "FAILED" in page and "the log for 2026-11-22 is empty" in page
    assert "second line" not in page
    assert "speech_landing → speech_corpus" in page
    assert "<img src='figures/train-tradeoff.png'" in page and "timings.svg" in page


def test_values_from_the_lake_are_escaped_and_a_dead_tracking_server_is_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cascade.ports import free_port

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CASCADE_MLFLOW_URI", f"http://127.0.0.1:{free_port()}")
    hostile = {"run_id": "abc123", "note": "<script>alert(1)</script>"}
    with_step(monkeypatch, "ctr_preranking", "training_set", lambda ctx: hostile)
    step_runner.run_step("training_set", DS, "ctr_preranking")
    out = tmp_path / "report"
    assert main(["report", "--ds", DS, "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "does not answer" in capsys.readouterr().err
    assert json.loads((out / "report.json").read_text())["curves"] == []


def test_a_partition_nothing_ran_for_exits_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    assert main(["report", "--ds", DS, "--out", str(tmp_path / "r")]) == 3
    err = capsys.readouterr().err
    assert "no step has run for ds=2026-11-22" in err and "Traceback" not in err
    assert main(["report", "--ds", "2026-13-45", "--out", str(tmp_path / "r")]) == 2


def test_a_runs_report_is_logged_to_mlflow_tagged_with_its_airflow_run_and_a_retry_reuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tracking: str
) -> None:
    import mlflow

    from cascade.config import load_settings
    from cascade.run_report import log_run_report, report_url

    home = tmp_path / "home"
    monkeypatch.setenv("CASCADE_HOME", str(home))
    monkeypatch.setenv("CASCADE_MLFLOW_URI", tracking)
    with_step(monkeypatch, "ctr_monitor", "drift", lambda ctx: {"psi": 0.02})
    step_runner.run_step("drift", DS, "ctr_monitor")
    # GX Data Docs ship logos as PNGs: they are no step's figure.
    logo = home / "lake" / "reports" / "data_docs" / f"dt={DS}" / "asr" / "validate" / "logo.png"
    logo.parent.mkdir(parents=True)
    logo.write_bytes(PNG_MAGIC + b"logo")
    settings = load_settings()
    context = {"dag_id": "ctr_monitor", "run_id": "manual__2026-11-23", "try_number": "1"}

    first = log_run_report(settings, "ctr_monitor", DS, context)

    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    run = client.get_run(first["run_id"])
    assert run.info.run_name == f"ctr_monitor/{DS}/report" and run.info.status == "FINISHED"
    assert {k: run.data.tags[k] for k in ("dag_id", "run_id", "ds", "pipeline")} == {
        "dag_id": "ctr_monitor",
        "run_id": "manual__2026-11-23",
        "ds": DS,
        "pipeline": "ctr_monitor",
    }
    assert run.data.metrics["steps_ok"] == 1
    logged = {a.path for a in client.list_artifacts(first["run_id"], "report")}
    assert {"report/index.html", "report/report.json", "report/timings.svg"} <= logged
    report = json.loads(Path(first["index"]).with_name("report.json").read_text())
    assert report["pipelines"] == ["ctr_monitor"] and report["figures"] == []
    # No web server behind a sqlite store: the link is the lake's copy.
    assert first["url"] == Path(first["index"]).resolve().as_uri()

    again = log_run_report(settings, "ctr_monitor", DS, {**context, "try_number": "2"})
    assert again["run_id"] == first["run_id"]
    assert client.get_run(first["run_id"]).data.tags["try_number"] == "2"
    assert report_url("http://127.0.0.1:5000/", "3", "abc", Path("x")) == (
        "http://127.0.0.1:5000/#/experiments/3/runs/abc/artifactPath/report/index.html"
    )
