"""What comes out of the registry is data: a registered version whose files changed after
registration is never loaded, and a pickle planted in a version is never unpickled."""

from __future__ import annotations

import contextlib
from pathlib import Path

import mlflow
import mlflow.pyfunc
import pytest
import torch
import yaml

from benchmarks.security import planted_pickle
from cascade.artifacts import DIGESTS_TAG, TamperedArtifact, digests_tag, folder_digests
from cascade.config import Settings
from models.preranking import REGISTERED_MODEL
from models.preranking.inference import frame_inputs, load_version
from models.preranking.synthetic_data import synthetic_training_frame
from tests.cascade.test_registry import fitted, promote, settings, trained  # noqa: F401 (fixture)

DS = "2026-01-01"


def stored_folder(store: Settings, version: str) -> Path:
    client = mlflow.MlflowClient(store.tracking_uri, registry_uri=store.tracking_uri)
    uri = client.get_model_version_download_uri(REGISTERED_MODEL, version)
    folder = Path(uri.removeprefix("file://"))
    assert folder.is_dir(), uri  # the local profile's store is a folder under the state folder
    return folder


def test_a_version_changed_after_registration_is_never_loaded(settings: Settings) -> None:  # noqa: F811
    model = trained(settings, DS, fitted(20))
    version = promote(DS, settings)["version"]
    sample = frame_inputs(synthetic_training_frame(8, seed=5))
    torch.testing.assert_close(load_version(settings, version).model(*sample), model(*sample))

    state = next(stored_folder(settings, version).rglob("*.pt"))
    weights = torch.load(state, weights_only=True)
    torch.save({k: v + 1 if v.is_floating_point() else v for k, v in weights.items()}, state)
    with pytest.raises(TamperedArtifact, match=r"changed \['artifacts/.*\.pt'\]"):
        load_version(settings, version)

    client = mlflow.MlflowClient(settings.tracking_uri, registry_uri=settings.tracking_uri)
    client.delete_model_version_tag(REGISTERED_MODEL, version, DIGESTS_TAG)
    with pytest.raises(TamperedArtifact, match="records no artifact digests"):
        load_version(settings, version)


def test_a_planted_pickle_is_never_unpickled(
    settings: Settings,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = trained(settings, DS, fitted(20))
    version = promote(DS, settings)["version"]
    folder = stored_folder(settings, version)
    marker = tmp_path / "unpickled.txt"
    # Whoever can write the store can also write the digests: the loader must not depend on
    # them to stay away from pickles. The version is a pyfunc from code; the planted MLmodel
    # names a pickled pyfunc object instead, as MLflow writes one for a pickled model.
    (folder / "python_model.pkl").write_bytes(planted_pickle(marker))
    mlmodel = yaml.safe_load((folder / "MLmodel").read_text())
    pyfunc = mlmodel["flavors"]["python_function"]
    pyfunc.pop("model_code_path")
    pyfunc.update(loader_module="mlflow.pyfunc.model", python_model="python_model.pkl")
    (folder / "MLmodel").write_text(yaml.safe_dump(mlmodel))
    client = mlflow.MlflowClient(settings.tracking_uri, registry_uri=settings.tracking_uri)
    client.set_model_version_tag(
        REGISTERED_MODEL, version, DIGESTS_TAG, digests_tag(folder_digests(folder))
    )

    loaded = load_version(settings, version)

    assert not marker.exists()
    sample = frame_inputs(synthetic_training_frame(8, seed=5))
    torch.testing.assert_close(loaded.model(*sample), model(*sample))
    # The control: MLflow's standard loader runs it where pickles are allowed.
    monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "true")
    with contextlib.suppress(Exception):
        mlflow.pyfunc.load_model(str(folder))
    assert marker.read_text() == "unpickled"
