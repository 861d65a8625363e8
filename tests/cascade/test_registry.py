"""Registry: register each trained model, promote only if it is not worse than the champion."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
import torch

from cascade.config import Settings, load_settings
from cascade.lake import Lake
from cascade.registry import register_and_promote
from models.preranking.config_registry import preranking_debug
from models.preranking.inference import alias_version, frame_inputs, load_registered
from models.preranking.model import PreRanker
from models.preranking.synthetic_data import synthetic_training_frame
from models.preranking.train import log_run


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CASCADE_MLFLOW_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("CASCADE_PROMOTION_TOLERANCE", "0.005")
    return load_settings()


def trained(settings: Settings, ds: str, test_auc: float, seed: int) -> PreRanker:
    """Log a model as training would and write its result.json (skipping the training)."""
    torch.manual_seed(seed)
    config = preranking_debug()
    model = PreRanker(config.model).eval()
    log_run(
        model,
        config,
        out=Lake(settings.lake_root).reports("train", ds),
        ds=ds,
        metrics={"test_auc": test_auc, "train_loss": 0.6},
        params={"ds": ds},
        input_example=synthetic_training_frame(8),
        settings=settings,
    )
    return model


def test_promotes_first_refuses_worse_promotes_better(settings: Settings, tmp_path: Path) -> None:
    assert load_registered(settings) is None
    assert alias_version(settings) is None

    trained(settings, "2026-01-01", 0.70, seed=1)
    # The registry must use settings' store, whatever MLflow's process-wide URI says.
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    first = register_and_promote("2026-01-01", settings=settings)
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
    }

    trained(settings, "2026-01-02", 0.60, seed=2)
    worse = register_and_promote("2026-01-02", settings=settings)
    assert (worse["version"], worse["promoted"]) == ("2", False)
    assert (worse["champion_version"], worse["champion_auc"]) == ("1", 0.70)
    assert worse["previous_champion"] == "1"
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

    # Within the tolerance counts as not worse.
    trained(settings, "2026-01-03", 0.697, seed=3)
    close = register_and_promote("2026-01-03", settings=settings)
    assert (close["version"], close["promoted"], close["previous_champion"]) == ("3", True, "1")

    best = trained(settings, "2026-01-04", 0.75, seed=4)
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


def test_missing_training_result_says_how_to_make_it(settings: Settings) -> None:
    with pytest.raises(FileNotFoundError, match=r"launch\('2026-02-01'\)"):
        register_and_promote("2026-02-01", settings=settings)
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        register_and_promote("yesterday", settings=settings)
