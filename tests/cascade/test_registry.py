"""Registry: register each trained model, promote only if it is not worse than the champion."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import mlflow
import pytest
import torch

from cascade.config import Settings, SettingsError, load_settings
from cascade.lake import Lake
from cascade.results import write_result
from cascade.training.resumable_run import use_experiment
from domains.ctr.schema import LABEL, MODEL_FEATURES
from models.preranking import REGISTERED_MODEL
from models.preranking.config_registry import preranking_debug
from models.preranking.inference import (
    CONFIG_ARTIFACT,
    STATE_DICT_ARTIFACT,
    alias_version,
    frame_inputs,
    load_registered,
    log_pyfunc,
    score_frame,
)
from models.preranking.model import PreRanker
from models.preranking.registration import register_and_promote
from models.preranking.synthetic_data import synthetic_training_frame
from pipelines.ctr_preranking import PIPELINE


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CASCADE_MLFLOW_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    for name in ("METRIC", "TOLERANCE"):
        monkeypatch.delenv(f"CASCADE_PRERANKING_PROMOTION_{name}", raising=False)
    return load_settings()


def promote(ds: str, settings: Settings, *, requires_compile_gate: bool = False) -> dict[str, Any]:
    """The register step on ``ds`` under the pipeline's rule in force (its settings as they are
    set now); without the compile gate's requirement unless asked, as these tests compile
    nothing (a report that is there still counts)."""
    rule = PIPELINE.promotion()
    assert rule is not None
    rule = dataclasses.replace(rule, requires_compile_gate=requires_compile_gate)
    return register_and_promote(ds, settings=settings, promotion=rule)


def fitted(steps: int, seed: int = 0) -> PreRanker:
    """A debug-sized model after ``steps`` Adam steps on synthetic impressions (0: untrained)."""
    torch.manual_seed(seed)
    config = preranking_debug()
    model = PreRanker(config.model)
    frame = synthetic_training_frame(4000, seed=100 + seed)
    dense, user, item = frame_inputs(frame)
    label = torch.tensor(frame[LABEL].to_numpy(), dtype=torch.float32)
    model.fit_normalizer(dense)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    for step in range(steps):
        idx = torch.arange(step * 256, (step + 1) * 256) % len(frame)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(dense[idx], user[idx], item[idx]), label[idx]
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def trained(settings: Settings, ds: str, model: PreRanker, test_auc: float = 0.7) -> PreRanker:
    """Write ``ds``'s training set and log ``model`` as training would (skipping the training)."""
    lake = Lake(settings.lake_root)
    data = lake.training_set("preranking", ds) / "data.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    synthetic_training_frame(3000, seed=int(ds[-2:]), end=ds).to_parquet(data)
    log_dense(model, out=lake.reports("train", ds), ds=ds, test_auc=test_auc, settings=settings)
    return model


def log_dense(
    model: PreRanker, *, out: Path, ds: str, test_auc: float, settings: Settings
) -> dict[str, Any]:
    """Log a dense PreRanker as a training run logs its model (state dict, config, pyfunc,
    ``result.json``): a small registry subject for the promotion gate, which compares any
    kind of pre-ranker on the same held-out rows."""
    from mlflow.models import infer_signature

    config = preranking_debug()
    out.mkdir(parents=True, exist_ok=True)
    state_path, config_path = out / "state_dict.pt", out / "train_config.json"
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, state_path)
    config_path.write_text(json.dumps(config.to_dict(), indent=2))
    experiment_id = use_experiment(settings, "preranking")
    with mlflow.start_run(experiment_id=experiment_id, run_name=f"{config.name}-{ds}") as run:
        mlflow.log_metrics({"test_auc": test_auc})
        example = synthetic_training_frame(8)[["user_id", "item_id", *MODEL_FEATURES]].head(5)
        example[list(MODEL_FEATURES)] = example[list(MODEL_FEATURES)].astype("float64")
        info = log_pyfunc(
            "model",
            {STATE_DICT_ARTIFACT: str(state_path), CONFIG_ARTIFACT: str(config_path)},
            input_example=example,
            signature=infer_signature(example, score_frame(model.eval(), example)),
        )
        result = {
            "run_id": run.info.run_id,
            "test_auc": test_auc,
            "model_uri": info.model_uri,
            "model_kind": "mlp",
            "config": config.name,
            "ds": ds,
        }
    write_result(out / "result.json", result)
    return result


def test_promotes_first_refuses_worse_on_the_same_rows_promotes_not_worse(
    settings: Settings, tmp_path: Path
) -> None:
    assert load_registered(settings) is None
    assert alias_version(settings) is None

    good = trained(settings, "2026-01-01", fitted(30), test_auc=0.70)
    # The registry must use settings' store, whatever MLflow's process-wide URI says.
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    first = promote("2026-01-01", settings)
    baseline = first.pop("baseline")
    assert (baseline["name"], baseline["metric"], baseline["passed"]) == (
        "item popularity",
        "auc",
        True,
    )
    assert baseline["challenger"] > baseline["baseline"], baseline
    assert first == {
        "version": "1",
        "promoted": True,
        "test_auc": 0.70,
        "champion_version": "1",
        "champion_auc": 0.70,
        "previous_champion": None,
        "ds": "2026-01-01",
        "run_id": first["run_id"],
        "tolerance": 0.005,
        "metric": "auc",
        "comparison": None,
        "compile_gate": None,
        "reasons": [],
    }

    # An untrained model, although its training claimed a higher AUC on its own hold-out: the
    # gate scores both models on the same rows and refuses it.
    trained(settings, "2026-01-02", fitted(0), test_auc=0.95)
    worse = promote("2026-01-02", settings)
    assert (worse["version"], worse["promoted"]) == ("2", False)
    assert (worse["champion_version"], worse["champion_auc"]) == ("1", 0.70)
    assert worse["previous_champion"] == "1"
    comparison = worse["comparison"]
    assert comparison["rows"] == 600 and comparison["metric"] == "auc"
    assert comparison["champion"] > 0.65 and comparison["challenger"] < 0.6
    assert "below champion auc" in worse["reasons"][0]
    # Nor does it beat item popularity on those rows: the decision says that too.
    assert worse["baseline"]["passed"] is False and worse["baseline"]["challenger"] < 0.6
    assert worse["reasons"][1:] == [worse["baseline"]["reason"]]
    assert alias_version(settings) == "1"
    assert alias_version(settings, alias="challenger") == "2"

    # Idempotent: the same training run is not registered twice and gets the same answer.
    assert promote("2026-01-02", settings) == worse
    client = mlflow.tracking.MlflowClient(
        tracking_uri=settings.tracking_uri, registry_uri=settings.tracking_uri
    )
    assert len(client.search_model_versions(f"name='{REGISTERED_MODEL}'")) == 2
    # Artifacts of a local store stay in the state folder, not in ./mlruns of the repository.
    run = client.get_run(worse["run_id"])
    assert run.info.artifact_uri.startswith(settings.home.as_uri()), run.info.artifact_uri

    # The same weights again score the same: not worse, so promoted, whatever AUC it claims.
    trained(settings, "2026-01-03", good, test_auc=0.60)
    same = promote("2026-01-03", settings)
    assert (same["version"], same["promoted"], same["previous_champion"]) == ("3", True, "1")
    assert same["comparison"]["challenger"] == same["comparison"]["champion"]

    best = trained(settings, "2026-01-04", fitted(60), test_auc=0.75)
    better = promote("2026-01-04", settings)
    assert (better["version"], better["promoted"], better["previous_champion"]) == ("4", True, "3")
    report = Lake(settings.lake_root).reports("register", "2026-01-04") / "result.json"
    assert json.loads(report.read_text()) == better

    loaded = load_registered(settings)
    assert loaded is not None
    assert (loaded.version, loaded.test_auc, loaded.run_id) == ("4", 0.75, better["run_id"])
    assert not loaded.model.training
    sample = frame_inputs(synthetic_training_frame(16, seed=5))
    torch.testing.assert_close(loaded.model(*sample), best(*sample))
    challenger = load_registered(settings, alias="challenger")
    assert challenger is not None and challenger.version == "4"
    assert load_registered(settings, alias="nobody") is None

    # A failed compile gate blocks even a model as good as the champion, with its reasons.
    trained(settings, "2026-01-05", best)
    gate_dir = Lake(settings.lake_root).reports("compile", "2026-01-05")
    gate_dir.mkdir(parents=True)
    (gate_dir / "result.json").write_text(
        json.dumps({"passed": False, "reasons": ["max |artifact - eager| 0.31 > 0.0001"]})
    )
    blocked = promote("2026-01-05", settings)
    assert (blocked["promoted"], blocked["champion_version"]) == (False, "4")
    assert blocked["reasons"] == ["compile gate: max |artifact - eager| 0.31 > 0.0001"]
    assert blocked["comparison"]["passed"] and alias_version(settings) == "4"


def test_log_loss_gate_refuses_a_worse_calibrated_challenger(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_PRERANKING_PROMOTION_METRIC", "logloss")
    trained(settings, "2026-01-01", fitted(30))
    assert promote("2026-01-01", settings)["promoted"]
    trained(settings, "2026-01-02", fitted(0))
    refused = promote("2026-01-02", settings)
    assert not refused["promoted"] and refused["metric"] == "logloss"
    assert refused["comparison"]["challenger"] > refused["comparison"]["champion"]
    assert "above champion logloss" in refused["reasons"][0]
    monkeypatch.setenv("CASCADE_PRERANKING_PROMOTION_METRIC", "accuracy")
    with pytest.raises(SettingsError, match="CASCADE_PRERANKING_PROMOTION_METRIC"):
        PIPELINE.promotion()


def test_the_tolerance_override_is_what_pipelines_prints_and_what_the_gate_applies(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One rule: the spec's, with the documented setting's override. ``cascade pipelines
    --json`` prints the rule that the register step then applies."""
    from cascade.cli import main

    def printed() -> dict[str, Any]:
        assert main(["pipelines", "--json"]) == 0
        specs = {spec["name"]: spec for spec in json.loads(capsys.readouterr().out)}
        return dict(specs["ctr_preranking"]["registered_model"]["promotion"])

    shown = printed()
    assert (shown["metric"], shown["tolerance"]) == ("auc", 0.005)
    assert shown["overridden_by"]["tolerance"] == "CASCADE_PRERANKING_PROMOTION_TOLERANCE"
    trained(settings, "2026-01-01", fitted(30))
    assert promote("2026-01-01", settings)["promoted"]
    # An untrained challenger is refused under the spec's tolerance...
    trained(settings, "2026-01-02", fitted(0))
    refused = promote("2026-01-02", settings)
    assert not refused["comparison"]["passed"] and refused["tolerance"] == 0.005
    # ...and passes the comparison under a tolerance wider than the gap, as printed.
    gap = refused["comparison"]["champion"] - refused["comparison"]["challenger"]
    tolerance = round(min(gap + 0.05, 0.99), 3)
    monkeypatch.setenv("CASCADE_PRERANKING_PROMOTION_TOLERANCE", str(tolerance))
    assert printed()["tolerance"] == tolerance
    trained(settings, "2026-01-03", fitted(0))
    wider = promote("2026-01-03", settings)
    assert wider["tolerance"] == tolerance and wider["comparison"]["passed"]


def test_missing_training_result_says_how_to_make_it(settings: Settings) -> None:
    with pytest.raises(FileNotFoundError, match="the ctr_preranking train step writes it"):
        promote("2026-02-01", settings)
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        promote("yesterday", settings)


def test_a_pipeline_that_compiles_registers_nothing_without_its_compile_report(
    settings: Settings,
) -> None:
    """ctr_preranking compiles: a register step that finds no compile report (or one that does
    not say ``"passed": true``) moves no alias; a missing one registers nothing, so the
    register step that runs after the compile step decides afresh."""
    from mlflow.tracking import MlflowClient

    from cascade.promotion import CompileReportMissing
    from pipelines.ctr_preranking import PIPELINE

    assert PIPELINE.model is not None and PIPELINE.model.promotion.requires_compile_gate
    trained(settings, "2026-01-01", fitted(30))
    with pytest.raises(CompileReportMissing, match="run the pipeline's compile step"):
        promote("2026-01-01", settings, requires_compile_gate=True)
    client = MlflowClient(settings.tracking_uri, settings.tracking_uri)
    assert client.search_model_versions(f"name='{REGISTERED_MODEL}'") == []
    assert alias_version(settings) is None

    gate_dir = Lake(settings.lake_root).reports("compile", "2026-01-01")
    gate_dir.mkdir(parents=True)
    (gate_dir / "result.json").write_text(json.dumps({"passed": "true", "reasons": []}))
    refused = promote("2026-01-01", settings, requires_compile_gate=True)
    assert not refused["promoted"] and alias_version(settings) is None
    assert refused["reasons"] == ["compile gate: failed"]


def test_a_champion_that_reads_fields_the_rows_lack_is_compared_by_its_recorded_auc(
    settings: Settings,
) -> None:
    """A champion trained on other features (the set before a feature change) cannot score the
    challenger's held-out rows: the comparison uses both recorded hold-out AUCs, says so, and
    still refuses a worse challenger."""
    import pandas as pd

    trained(settings, "2026-02-01", fitted(30), test_auc=0.70)
    assert promote("2026-02-01", settings)["promoted"]

    def without_user_ctr(ds: str, test_auc: float) -> None:
        trained(settings, ds, fitted(30), test_auc=test_auc)
        data = Lake(settings.lake_root).training_set("preranking", ds) / "data.parquet"
        pd.read_parquet(data).drop(columns=["user_ctr"]).to_parquet(data)

    without_user_ctr("2026-02-02", 0.60)
    worse = promote("2026-02-02", settings)
    comparison = worse["comparison"]
    assert not worse["promoted"] and worse["champion_version"] == "1"
    assert (comparison["challenger"], comparison["champion"]) == (0.60, 0.70)
    assert comparison["champion_fields_absent"] == ["user_ctr"]
    assert "their own held-out rows (champion v1 reads fields" in worse["reasons"][0]

    without_user_ctr("2026-02-03", 0.71)
    better = promote("2026-02-03", settings)
    assert better["promoted"] and better["previous_champion"] == "1"
