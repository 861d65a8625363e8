"""A real 2-process DeepSpeed ZeRO-2 run of the MoE debug config (experts split over the two
processes) that lowers the loss, logs routing figures to MLflow and resumes after a kill."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest

from cascade.config import Settings
from cascade.training.crash_points import CRASH_ENV
from models.multimodal.train import RUN_MARKER, train_multimodal


@pytest.mark.slow
def test_two_process_moe_run_learns_logs_routing_and_resumes_after_a_kill(
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "run"
    # Killed after step 12 (last checkpoint: 8), launched again: it resumes at step 8 in the
    # same MLflow run and finishes.
    monkeypatch.setenv(CRASH_ENV, "train:12")
    with pytest.raises(RuntimeError, match="failed"):
        train_multimodal(settings, "debug", None, out, echo=False)
    monkeypatch.delenv(CRASH_ENV)
    assert (out / "checkpoints" / "step8").is_dir()
    killed_run = json.loads((out / RUN_MARKER).read_text())["run_id"]
    # A checkpoint planted in the run folder and named by ``latest`` is never unpickled: the
    # resume loads the one whose digest the run recorded.
    planted = out / "checkpoints" / "step20"
    planted.mkdir()
    (planted / "mp_rank_00_model_states.pt").write_bytes(b"planted, not DeepSpeed's")
    (out / "checkpoints" / "latest").write_text("step20")

    result = train_multimodal(settings, "debug", None, out, echo=True)
    logged = capsys.readouterr().out
    assert "world=2 ep_size=2" in logged and "resumed at step 8" in logged
    assert result["run_id"] == killed_run and result["resumed_from_step"] == 8
    assert result["ep_size"] == 2 and result["moe"] is True
    assert 0.0 <= result["i2t_recall_at_1"] <= result["i2t_recall_at_5"] <= 1.0
    assert result["eval_pairs"] == 40
    assert result["active_params"] < result["total_params"]
    assert not (out / "checkpoints").exists() and not (out / RUN_MARKER).exists()

    client = mlflow.tracking.MlflowClient(tracking_uri=settings.tracking_uri)
    run = client.get_run(killed_run)
    assert run.info.status == "FINISHED"
    assert run.data.params["model.moe.prototypes"] == "2"
    for name in ("expert_load_cv.layer0", "expert_load_cv.layer1", "tokens_dropped.layer1"):
        history = client.get_metric_history(killed_run, name)
        assert history and all(m.value >= 0 for m in history), name
    losses = {m.step: m.value for m in client.get_metric_history(killed_run, "loss")}
    assert {4, 8, 12, 16, 20, 24} <= set(losses)
    assert losses[24] == pytest.approx(result["final_loss"]) and losses[24] < 0.9 * losses[4]
    assert run.data.metrics["t2i_recall_at_1"] == pytest.approx(result["t2i_recall_at_1"])


def test_launch_refuses_a_missing_corpus_and_a_bad_config(
    settings: Settings, tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError, match="not a multimodal corpus"):
        train_multimodal(settings, "debug", tmp_path / "nowhere", tmp_path / "out")
    with pytest.raises(ValueError, match="unknown multimodal config"):
        train_multimodal(settings, "huge", None, tmp_path / "out")
