"""Registry: register each trained model, promote only if it is not worse than the champion."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
import torch

from cascade.config import Settings, load_settings
from cascade.lake import Lake
from domains.ctr.schema import LABEL
from models.preranking.config_registry import preranking_debug
from models.preranking.inference import alias_version, frame_inputs, load_registered
from models.preranking.model import PreRanker
from models.preranking.registration import register_and_promote
from models.preranking.synthetic_data import synthetic_training_frame
from models.preranking.train import log_run


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CASCADE_MLFLOW_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("CASCADE_PROMOTION_TOLERANCE", "0.005")
    return load_settings()


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
    log_run(
        model,
        preranking_debug(),
        out=lake.reports("train", ds),
        ds=ds,
        metrics={"test_auc": test_auc, "train_loss": 0.6},
        params={"ds": ds},
        input_example=synthetic_training_frame(8),
        settings=settings,
    )
    return model


def test_promotes_first_refuses_worse_on_the_same_rows_promotes_not_worse(
    settings: Settings, tmp_path: Path
) -> None:
    assert load_registered(settings) is None
    assert alias_version(settings) is None

    good = trained(settings, "2026-01-01", fitted(30), test_auc=0.70)
    # The registry must use settings' store, whatever MLflow's process-wide URI says.
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    first = register_and_promote("2026-01-01", settings=settings)
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
    worse = register_and_promote("2026-01-02", settings=settings)
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
    assert register_and_promote("2026-01-02", settings=settings) == worse
    client = mlflow.tracking.MlflowClient(
        tracking_uri=settings.tracking_uri, registry_uri=settings.tracking_uri
    )
    assert len(client.search_model_versions(f"name='{settings.registered_model}'")) == 2
    # Artifacts of a local store stay in the state folder, not in ./mlruns of the repository.
    run = client.get_run(worse["run_id"])
    assert run.info.artifact_uri.startswith(settings.home.as_uri()), run.info.artifact_uri

    # The same weights again score the same: not worse, so promoted, whatever AUC it claims.
    trained(settings, "2026-01-03", good, test_auc=0.60)
    same = register_and_promote("2026-01-03", settings=settings)
    assert (same["version"], same["promoted"], same["previous_champion"]) == ("3", True, "1")
    assert same["comparison"]["challenger"] == same["comparison"]["champion"]

    best = trained(settings, "2026-01-04", fitted(60), test_auc=0.75)
    better = register_and_promote("2026-01-04", settings=settings)
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
    blocked = register_and_promote("2026-01-05", settings=settings)
    assert (blocked["promoted"], blocked["champion_version"]) == (False, "4")
    assert blocked["reasons"] == ["compile gate: max |artifact - eager| 0.31 > 0.0001"]
    assert blocked["comparison"]["passed"] and alias_version(settings) == "4"


def test_log_loss_gate_refuses_a_worse_calibrated_challenger(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_PROMOTION_METRIC", "logloss")
    settings = load_settings()
    trained(settings, "2026-01-01", fitted(30))
    assert register_and_promote("2026-01-01", settings=settings)["promoted"]
    trained(settings, "2026-01-02", fitted(0))
    refused = register_and_promote("2026-01-02", settings=settings)
    assert not refused["promoted"] and refused["metric"] == "logloss"
    assert refused["comparison"]["challenger"] > refused["comparison"]["champion"]
    assert "above champion logloss" in refused["reasons"][0]
    monkeypatch.setenv("CASCADE_PROMOTION_METRIC", "accuracy")
    with pytest.raises(ValueError, match="CASCADE_PROMOTION_METRIC"):
        load_settings()


def test_missing_training_result_says_how_to_make_it(settings: Settings) -> None:
    with pytest.raises(FileNotFoundError, match=r"launch\('2026-02-01'\)"):
        register_and_promote("2026-02-01", settings=settings)
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        register_and_promote("yesterday", settings=settings)


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
        register_and_promote("2026-01-01", settings=settings, requires_compile_gate=True)
    client = MlflowClient(settings.tracking_uri, settings.tracking_uri)
    assert client.search_model_versions(f"name='{settings.registered_model}'") == []
    assert alias_version(settings) is None

    gate_dir = Lake(settings.lake_root).reports("compile", "2026-01-01")
    gate_dir.mkdir(parents=True)
    (gate_dir / "result.json").write_text(json.dumps({"passed": "true", "reasons": []}))
    refused = register_and_promote("2026-01-01", settings=settings, requires_compile_gate=True)
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
    assert register_and_promote("2026-02-01", settings=settings)["promoted"]

    def without_user_ctr(ds: str, test_auc: float) -> None:
        trained(settings, ds, fitted(30), test_auc=test_auc)
        data = Lake(settings.lake_root).training_set("preranking", ds) / "data.parquet"
        pd.read_parquet(data).drop(columns=["user_ctr"]).to_parquet(data)

    without_user_ctr("2026-02-02", 0.60)
    worse = register_and_promote("2026-02-02", settings=settings)
    comparison = worse["comparison"]
    assert not worse["promoted"] and worse["champion_version"] == "1"
    assert (comparison["challenger"], comparison["champion"]) == (0.60, 0.70)
    assert comparison["champion_fields_absent"] == ["user_ctr"]
    assert "their own held-out rows (champion v1 reads fields" in worse["reasons"][0]

    without_user_ctr("2026-02-03", 0.71)
    better = register_and_promote("2026-02-03", settings=settings)
    assert better["promoted"] and better["previous_champion"] == "1"
