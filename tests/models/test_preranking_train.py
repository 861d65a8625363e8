"""Pre-ranking training: data checks, time split, launch outcome, and a real 2-process run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch

from cascade.config import Settings
from cascade.lake import Lake
from cascade.training.checkpoints import CHECKPOINTS
from cascade.training.crash_points import CRASH_ENV, crash_point
from cascade.training.resumable_run import RUN_MARKER
from domains.ctr.schema import LABEL, MODEL_FEATURES, TIMESTAMP
from models.preranking.config_registry import preranking_debug
from models.preranking.inference import build_model, frame_inputs, load_model_dir
from models.preranking.model import PreRanker
from models.preranking.synthetic_data import synthetic_training_frame
from models.preranking.train import (
    check_launch_outcome,
    launch,
    load_training_frame,
    parse_args,
    time_split,
)

DS = "2026-01-31"


def test_synthetic_frame_follows_the_training_contract() -> None:
    frame = synthetic_training_frame(2_000, seed=3)
    assert list(frame.columns[:5]) == ["user_id", "item_id", "genre", TIMESTAMP, LABEL]
    assert tuple(frame.columns[5:]) == MODEL_FEATURES
    assert frame["user_id"].dtype == np.int64 and frame[LABEL].isin([0, 1]).all()
    assert str(frame[TIMESTAMP].dtype) == "datetime64[us, UTC]"
    assert 0.3 < frame[LABEL].mean() < 0.8
    assert frame["ug_ctr"].isna().any() and not frame["user_ctr"].isna().any()
    # Deterministic for a seed, different across seeds.
    pd.testing.assert_frame_equal(frame, synthetic_training_frame(2_000, seed=3))
    assert not frame[LABEL].equals(synthetic_training_frame(2_000, seed=4)[LABEL])


def test_time_split_holds_out_the_latest_rows() -> None:
    frame = synthetic_training_frame(1_001, seed=1).sample(frac=1.0, random_state=0)
    train, test = time_split(frame, 0.2)
    assert len(test) == 201 and len(train) == 800
    assert train[TIMESTAMP].max() <= test[TIMESTAMP].min()
    assert sorted(train.index.tolist() + test.index.tolist()) == list(range(1_001))
    again_train, _ = time_split(frame, 0.2)
    pd.testing.assert_frame_equal(train, again_train)
    with pytest.raises(ValueError, match="at least 2 rows"):
        time_split(frame.head(1), 0.5)


def test_load_training_frame_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="training set .* does not exist"):
        load_training_frame(tmp_path / "missing.parquet")
    frame = synthetic_training_frame(50)
    frame.drop(columns=["item_ctr"]).to_parquet(tmp_path / "no_ctr.parquet")
    with pytest.raises(ValueError, match=r"lacks columns \['item_ctr'\]"):
        load_training_frame(tmp_path / "no_ctr.parquet")
    frame.assign(click=frame[LABEL] * 2).to_parquet(tmp_path / "bad_label.parquet")
    with pytest.raises(ValueError, match="must be 0/1"):
        load_training_frame(tmp_path / "bad_label.parquet")
    frame.to_parquet(tmp_path / "good.parquet")
    assert len(load_training_frame(tmp_path / "good.parquet")) == 50


def _result(ds: str = DS, **changes: object) -> dict[str, object]:
    result = {"run_id": "r1", "test_auc": 0.7, "model_uri": "models:/m-1", "config": "debug"}
    return {**result, "ds": ds, **changes}


def test_launch_outcome_accepts_a_complete_result_after_a_crash_at_exit(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(_result()))
    assert check_launch_outcome(0, path, DS, "")["run_id"] == "r1"
    with pytest.warns(RuntimeWarning, match="exited with code -6 .* accepting run r1"):
        assert check_launch_outcome(-6, path, DS, "")["test_auc"] == 0.7


@pytest.mark.parametrize(
    "content",
    [None, "{not json", json.dumps(_result(run_id="")), json.dumps(_result(ds="2026-01-30"))],
)
def test_launch_outcome_raises_with_the_log_tail(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "result.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RuntimeError, match=r"failed \(exit code -6\)(.|\n)*Traceback: boom"):
        check_launch_outcome(-6, path, DS, "Traceback: boom\n")
    # A clean exit without a usable result is a failure too.
    with pytest.raises(RuntimeError, match="exit code 0"):
        check_launch_outcome(0, path, DS, "")


def test_bf16_module_accepts_fp32_inputs() -> None:
    config = preranking_debug().model
    model = PreRanker(config)
    frame = synthetic_training_frame(64)
    inputs = frame_inputs(frame)
    model.fit_normalizer(inputs[0])
    out = model.bfloat16()(*inputs)
    assert out.dtype == torch.bfloat16 and out.shape == (64,)
    restored = build_model(model.state_dict(), preranking_debug())
    assert restored.mean.dtype == torch.float32 and not restored.training


def test_launch_refuses_a_missing_training_set(settings: Settings) -> None:
    with pytest.raises(FileNotFoundError, match="run the training-set task for ds=2026-01-31"):
        launch(DS, config="debug", settings=settings)
    with pytest.raises(ValueError, match="unknown pre-ranking config"):
        launch(DS, config="nope", settings=settings)


@pytest.mark.slow
def test_two_process_debug_run_learns_resumes_and_logs_to_mlflow(
    settings: Settings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = Lake(settings.lake_root)
    data = lake.training_set("preranking", DS) / "data.parquet"
    data.parent.mkdir(parents=True)
    synthetic_training_frame(20_000, seed=0).to_parquet(data)
    out = lake.reports("train", DS)
    out.mkdir(parents=True)
    # A stale result from an earlier launch must not be returned for this one.
    (out / "result.json").write_text(json.dumps(_result(run_id="stale")))

    started = time.monotonic()
    result = launch(DS, config="debug", settings=settings)
    wall = time.monotonic() - started
    logged = capsys.readouterr().out
    print(f"2-process debug run: {wall:.1f} s wall")

    assert result["run_id"] != "stale"
    assert result["config"] == "debug" and result["ds"] == DS
    assert result["test_auc"] > 0.7, result  # the synthetic signal is strong (oracle ~0.8)
    assert json.loads((out / "result.json").read_text()) == result
    assert "world=2" in logged and "step=10 loss=" in logged

    client = mlflow.tracking.MlflowClient(tracking_uri=settings.tracking_uri)
    run = client.get_run(result["run_id"])
    assert run.info.status == "FINISHED"
    assert run.info.artifact_uri.startswith(settings.home.as_uri()), run.info.artifact_uri
    assert run.data.metrics["test_auc"] == pytest.approx(result["test_auc"])
    assert run.data.metrics["train_loss"] < 0.69  # below the loss of a constant guess
    assert run.data.params["world_size"] == "2" and run.data.params["zero_stage"] == "1"
    losses = client.get_metric_history(result["run_id"], "loss")
    assert len(losses) >= 5 and losses[-1].value < losses[0].value

    # The logged pyfunc and the files beside result.json give the same scores.
    model, config = load_model_dir(out / "state_dict.pt", out / "train_config.json")
    assert config == preranking_debug()
    sample = synthetic_training_frame(32, seed=9)
    with torch.no_grad():
        expected = torch.sigmoid(model(*frame_inputs(sample))).numpy()
    mlflow.set_tracking_uri(settings.tracking_uri)
    pyfunc = mlflow.pyfunc.load_model(result["model_uri"])
    np.testing.assert_allclose(pyfunc.predict(sample), expected, rtol=1e-5)
    assert not (out / CHECKPOINTS).exists() and not (out / RUN_MARKER).exists()

    # Killed after step 25 (its last checkpoint: step 20), then launched again: the retry
    # resumes at step 20, continues the same MLflow run and ends with the same metrics.
    monkeypatch.setenv(CRASH_ENV, "train:25")
    with pytest.raises(RuntimeError, match="failed"):
        launch(DS, config="debug", settings=settings)
    monkeypatch.delenv(CRASH_ENV)
    assert (out / CHECKPOINTS / "step20").is_dir() and not (out / "result.json").exists()
    killed_run = json.loads((out / RUN_MARKER).read_text())["run_id"]
    resumed = launch(DS, config="debug", settings=settings)
    assert "[train] resumed at step 20" in capsys.readouterr().out
    assert resumed["run_id"] == killed_run != result["run_id"]
    assert resumed["test_auc"] == result["test_auc"]
    resumed_run = client.get_run(killed_run)
    assert resumed_run.info.status == "FINISHED"
    assert resumed_run.data.metrics["train_loss"] == run.data.metrics["train_loss"]
    assert resumed_run.data.params["resumed_from_step"] == "20"


def test_crash_point_names_a_bad_value() -> None:
    assert crash_point({}) is None
    assert crash_point({CRASH_ENV: "select_0.05:6"}) == ("select_0.05", 6)
    with pytest.raises(ValueError, match="PHASE:STEP"):
        crash_point({CRASH_ENV: "train"})


def test_command_line_accepts_the_deepspeed_launchers_local_rank() -> None:
    args = parse_args(
        ["--local_rank=1", "--config", "ml100k", "--data", "/l/dt=2026-01-15/data.parquet"]
        + ["--out", "/o"]
    )
    assert (args.local_rank, args.config, args.ds) == (1, "ml100k", "2026-01-15")
    assert parse_args(["--config", "debug", "--data", "x.parquet", "--out", "o"]).ds == ""
    with pytest.raises(SystemExit):
        parse_args(["--config", "huge", "--data", "x.parquet", "--out", "o"])


def test_fscd_reads_only_the_row_columns_and_takes_the_rest_from_fields_json(
    tmp_path: Path,
) -> None:
    import dataclasses

    from models.preranking.config_registry import get_cascade_config
    from models.preranking.fscd_data import load_frame, prepare

    rows = synthetic_training_frame(600)
    engine_built = rows[["user_id", "item_id", "genre", "event_timestamp", LABEL]].assign(
        user_cat_ctr_7d=rows["user_ctr"] * 0.5
    )
    engine_built.to_parquet(tmp_path / "data.parquet")
    fields = [
        {"name": "user_id", "kind": "user", "categorical": True},
        {"name": "item_id", "kind": "item", "categorical": True},
        {"name": "genre", "kind": "item", "categorical": True},
        {"name": "user_cat_ctr_7d", "kind": "cross", "categorical": False, "window_days": 7},
    ]
    (tmp_path / "fields.json").write_text(json.dumps({"version": 1, "fields": fields}))
    config = dataclasses.replace(
        get_cascade_config("debug"), data=str(tmp_path / "data.parquet"), min_validation_clicks=1
    )

    assert "item_ctr" not in load_frame(config).columns  # no MovieLens-shaped column required
    prepared = prepare(config)
    assert prepared.fields.names == ("user_id", "item_id", "genre", "user_cat_ctr_7d")
    assert prepared.train_codes.shape[1] == 4
    with pytest.raises(ValueError, match=r"lacks columns \['click'\]"):
        engine_built.drop(columns=LABEL).to_parquet(tmp_path / "data.parquet")
        load_frame(config)


def test_the_dense_network_refuses_a_set_without_its_columns(tmp_path: Path) -> None:
    from models.preranking.train import require_dense_contract

    path = tmp_path / "data.parquet"
    pd.DataFrame({"user_id": [1], "item_id": [2], "click": [0], "user_ctr_7d": [0.1]}).to_parquet(
        path
    )
    with pytest.raises(ValueError, match="CASCADE_PRERANKING_MODEL=fscd"):
        require_dense_contract(path)
