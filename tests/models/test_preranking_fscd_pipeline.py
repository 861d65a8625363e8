"""The ctr_preranking train step on the cascade: a real 2-process DeepSpeed run of the teacher,
FSCD selection and ColdPreRanker on a partition's training set, its artifacts and result, a
resumed retry, and the registry registering and comparing what it deployed."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from cascade.config import Settings
from cascade.lake import Lake
from domains.ctr.schema import LABEL
from models.preranking import REGISTERED_MODEL
from models.preranking.cascade_train import (
    CHECKPOINT_EVERY_ENV,
    checkpoint_every_override,
    launch_pipeline,
    parse_args,
    pipeline_fingerprint,
)
from models.preranking.config_registry import cascade_debug, get_cascade_config
from models.preranking.fields import FIELD_NAMES
from models.preranking.fscd_data import DegenerateData
from models.preranking.inference import (
    COLD_DIR_ARTIFACT,
    load_cold_dir,
    load_registered,
    load_trained,
    score_frame,
)
from models.preranking.model import ColdPreRanker
from models.preranking.synthetic_data import synthetic_training_frame
from models.preranking.training_set import time_split

DS = "2026-01-31"


@pytest.fixture(autouse=True)
def _config_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """The config's own checkpoint interval, whatever the e2e stack left in the environment."""
    monkeypatch.delenv(CHECKPOINT_EVERY_ENV, raising=False)


def test_launch_pipeline_refuses_a_missing_training_set_or_a_bad_config(
    settings: Settings,
) -> None:
    with pytest.raises(FileNotFoundError, match="run the training-set task for ds=2026-01-31"):
        launch_pipeline(DS, config="debug", settings=settings)
    with pytest.raises(ValueError, match="unknown cascade config 'nope'"):
        launch_pipeline(DS, config="nope", settings=settings)


def _sparse_training_set(settings: Settings, clicks: int = 300) -> Path:
    """A partition's training set of 20,000 impressions keeping only ``clicks`` clicks."""
    frame = synthetic_training_frame(20_000, users=400, items=600, seed=2)
    clicked = np.flatnonzero(frame[LABEL].to_numpy() == 1)
    kept = np.random.default_rng(0).choice(clicked, size=clicks, replace=False)
    frame[LABEL] = 0
    frame.loc[kept, LABEL] = 1
    data = Lake(settings.lake_root).training_set("preranking", DS) / "data.parquet"
    data.parent.mkdir(parents=True)
    frame.to_parquet(data)
    return data


def test_a_sparse_log_is_refused_in_one_line_before_any_training_process_starts(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cascade.step_runner import TIMING_FILE, run_step, summary_path
    from models.preranking import cascade_train

    _sparse_training_set(settings)
    launched: list[list[str]] = []

    def launcher(module: str, args: list[str], **_: object) -> dict[str, object]:
        launched.append(args)
        return {"run_id": "r", "test_auc": 0.6, "model_uri": "m", "config": "pipeline", "ds": DS}

    monkeypatch.setattr(cascade_train, "launch_for_result", launcher)
    with pytest.raises(DegenerateData) as refused:
        run_step("train", DS, "ctr_preranking")
    message = str(refused.value)
    assert "\n" not in message and len(message) < 300
    assert re.search(r"validation split \(0.2 of the training period\) has [\d,]+ rows with \d+ "
                     r"clicks; FSCD needs at least 100 clicks", message), message  # fmt: skip
    assert "CASCADE_PRERANKING_VALIDATION_FRACTION" in message
    assert launched == []  # no torchrun, no DeepSpeed
    timing = json.loads(
        summary_path("train", DS, "ctr_preranking").with_name(TIMING_FILE).read_text()
    )
    assert timing["status"] == "failed"
    assert timing["error"] == f"DegenerateData: {message}"

    # The knob: a larger validation share holds enough clicks, and the trainer is told.
    run_step("train", DS, "ctr_preranking", {"validation_fraction": "0.9", "cost_budget": "1"})
    assert len(launched) == 1
    at = launched[0].index("--validation-fraction")
    assert launched[0][at + 1] == "0.9"
    at = launched[0].index("--cost-budget")
    assert launched[0][at + 1] == "1.0"
    args = parse_args(
        ["--config", "pipeline", "--out", "x", "--validation-fraction", "0.9", "--cost-budget", "1"]
    )
    assert args.validation_fraction == 0.9 and args.cost_budget == 1.0


def test_pipeline_config_is_the_ml100k_networks_with_a_short_sweep() -> None:
    config = get_cascade_config("pipeline")
    assert config.net == get_cascade_config("ml100k").net
    assert len(config.fscd_strengths) == 3 and config.epochs == 2


def test_checkpoint_interval_override_is_a_positive_step_count() -> None:
    assert checkpoint_every_override({}) is None
    assert checkpoint_every_override({CHECKPOINT_EVERY_ENV: "50"}) == 50
    for bad in ("0", "-5", "ten"):
        with pytest.raises(ValueError, match=CHECKPOINT_EVERY_ENV):
            checkpoint_every_override({CHECKPOINT_EVERY_ENV: bad})
    args = parse_args(["--config", "pipeline", "--out", "x", "--checkpoint-every", "50"])
    assert args.checkpoint_every == 50
    assert parse_args(["--config", "pipeline", "--out", "x"]).checkpoint_every is None


def test_fingerprint_changes_with_the_data_and_the_partition(tmp_path: Path) -> None:
    data = tmp_path / "data.parquet"
    synthetic_training_frame(200, seed=0).to_parquet(data)
    first = pipeline_fingerprint(cascade_debug(), data, DS)
    assert first == pipeline_fingerprint(cascade_debug(), data, DS)
    assert first != pipeline_fingerprint(cascade_debug(), data, "2026-02-01")
    synthetic_training_frame(300, seed=0).to_parquet(data)
    second = pipeline_fingerprint(cascade_debug(), data, DS)
    assert first != second
    # Field declarations written beside the data are part of what a resumed run must match.
    (tmp_path / "fields.json").write_text('{"ug_ctr_7d": {"kind": "cross", "window_days": 7}}')
    assert second != pipeline_fingerprint(cascade_debug(), data, DS)


@pytest.mark.slow
def test_train_step_trains_registers_and_serves_the_fscd_preranker(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.cascade.test_registry import promote

    lake = Lake(settings.lake_root)
    data = lake.training_set("preranking", DS) / "data.parquet"
    data.parent.mkdir(parents=True)
    frame = synthetic_training_frame(5_000, users=125, items=200, seed=0)
    frame.to_parquet(data)
    out = lake.reports("train", DS)
    # Phases of a run on other data in the same folder must not be reused.
    (out / "phases" / "teacher").mkdir(parents=True)
    (out / "phases" / "teacher" / "model.pt").write_bytes(b"stale")

    result = launch_pipeline(DS, config="debug", settings=settings)
    logged = capsys.readouterr().out
    assert "world=2" in logged and "teacher: done" in logged
    assert result["model_kind"] == "fscd" and result["ds"] == DS and result["config"] == "debug"
    assert result["test_auc"] == result["fscd_auc"] > 0.6, result
    assert json.loads((out / "result.json").read_text()) == result

    # The artifact: the chosen model with its kept fields and encoder, scoring the held-out
    # rows (the rows the registry compares champions on) at the reported AUC.
    trained = load_trained(out)
    assert isinstance(trained.model, ColdPreRanker) and trained.encoder is not None
    assert list(trained.model.fields) == result["fscd_fields"]
    assert trained.test_fraction == cascade_debug().test_fraction
    held_out = time_split(frame, trained.test_fraction)[1]
    scores = score_frame(trained.model, held_out, trained.encoder)
    assert roc_auc_score(held_out[LABEL], scores) == pytest.approx(result["test_auc"], abs=1e-6)

    # The logged pyfunc scores a frame of fields exactly like the files.
    mlflow.set_tracking_uri(settings.tracking_uri)
    pyfunc = mlflow.pyfunc.load_model(result["model_uri"])
    sample = synthetic_training_frame(32, seed=9)[list(FIELD_NAMES)]
    np.testing.assert_allclose(
        pyfunc.predict(sample), score_frame(trained.model, sample, trained.encoder), rtol=1e-6
    )
    # Both URIs named: another test in this process may have set MLflow's default registry.
    client = mlflow.tracking.MlflowClient(
        tracking_uri=settings.tracking_uri, registry_uri=settings.tracking_uri
    )
    run = client.get_run(result["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["test_auc"] == pytest.approx(result["test_auc"])

    # A retry of the same partition resumes: finished phases are loaded, not trained again.
    again = launch_pipeline(DS, config="debug", settings=settings)
    assert "teacher: done" not in capsys.readouterr().out
    assert again["run_id"] == result["run_id"] and again["test_auc"] == result["test_auc"]

    # The registry registers it, promotes the first version, and loads it with its encoder.
    decision = promote(DS, settings)
    assert decision["promoted"] and decision["version"] == "1"
    loaded = load_registered(settings)
    assert loaded is not None and isinstance(loaded.model, ColdPreRanker)
    assert loaded.encoder is not None and loaded.test_auc == pytest.approx(result["test_auc"])
    torch.testing.assert_close(loaded.model.state_dict(), trained.model.state_dict())
    # The version's recorded files include the field set, so a changed one is refused.
    from cascade.artifacts import recorded_digests

    version = client.get_model_version(REGISTERED_MODEL, "1")
    digests = recorded_digests(version.tags, "version 1")
    assert f"artifacts/{COLD_DIR_ARTIFACT}/fields.json" in digests
    assert loaded.encoder.fields == trained.encoder.fields

    # A second partition with a worse model: the registry compares both ColdPreRankers on
    # the new partition's held-out rows and keeps the champion.
    ds2 = "2026-02-01"
    data2 = lake.training_set("preranking", ds2) / "data.parquet"
    data2.parent.mkdir(parents=True)
    frame.to_parquet(data2)
    out2 = lake.reports("train", ds2)
    shutil.copytree(out, out2)
    worse, encoder, config = load_cold_dir(out2 / COLD_DIR_ARTIFACT)
    with torch.no_grad():
        for parameter in worse.parameters():
            parameter.mul_(0.0)  # a constant scorer: AUC 0.5
    from models.preranking.inference import log_pyfunc, save_cold_model

    save_cold_model(out2 / COLD_DIR_ARTIFACT, worse, config, encoder)
    with mlflow.start_run() as worse_run:
        info = log_pyfunc("fscd_preranker", {COLD_DIR_ARTIFACT: str(out2 / COLD_DIR_ARTIFACT)})
    (out2 / "result.json").write_text(
        json.dumps(
            {**result, "ds": ds2, "run_id": worse_run.info.run_id, "model_uri": info.model_uri}
        )
    )
    second = promote(ds2, settings)
    assert not second["promoted"] and second["champion_version"] == "1"
    comparison = second["comparison"]
    assert comparison["challenger"] == pytest.approx(0.5)
    assert comparison["champion"] == pytest.approx(result["test_auc"], abs=1e-6)
    assert comparison["rows"] == len(held_out)
