"""What comes out of the registry is data: a registered version whose files changed after
registration is never loaded, and a pickle planted in a version is never unpickled. A version
the platform did not sign, or whose files are not the signed ones, is refused by the
pre-ranking server before any native code (the compiled package) is loaded."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import mlflow
import mlflow.pyfunc
import pytest
import torch
import yaml

from benchmarks.security import planted_pickle
from cascade.artifacts import DIGESTS_TAG, TamperedArtifact, digests_tag, folder_digests
from cascade.config import Settings
from cascade.signing import RELEASE_TAG, UnsignedRelease, load_signing_key, sign_version
from models.preranking import REGISTERED_MODEL
from models.preranking.inference import (
    frame_inputs,
    load_version,
    registration_files,
)
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

    # The digests beside the files are no longer what vouches for them: the signature is.
    client = mlflow.MlflowClient(settings.tracking_uri, registry_uri=settings.tracking_uri)
    client.delete_model_version_tag(REGISTERED_MODEL, version, RELEASE_TAG)
    with pytest.raises(UnsignedRelease, match="carries no platform signature"):
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
    # Even signed with the pickle in it (the worst case), the loader does not unpickle.
    sign_version(client, load_signing_key(settings.home), REGISTERED_MODEL, version,
                 compile_gate=None, decision={"promoted": True})  # fmt: skip

    loaded = load_version(settings, version)

    assert not marker.exists()
    sample = frame_inputs(synthetic_training_frame(8, seed=5))
    torch.testing.assert_close(loaded.model(*sample), model(*sample))
    # The control: MLflow's standard loader runs it where pickles are allowed.
    monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "true")
    with contextlib.suppress(Exception):
        mlflow.pyfunc.load_model(str(folder))
    assert marker.read_text() == "unpickled"


def test_the_preranking_server_loads_no_native_code_of_an_unsigned_or_changed_version(
    settings: Settings,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from models.preranking.config_registry import cascade_debug
    from models.preranking.fields import FieldEncoder
    from models.preranking.inference import COLD_DIR_ARTIFACT, save_cold_model
    from models.preranking.model import ColdPreRanker
    from serving import served_version
    from serving.preranking import PreRankingModel, ServingConfig
    from serving.preranking_backends import registry_backends

    # An FSCD pre-ranker's files as a run holds them (logged directly: MLflow's model logging
    # is not what is tested here, and costs tens of seconds).
    config = cascade_debug()
    encoder = FieldEncoder(bins=config.bins).fit(synthetic_training_frame(500, seed=1))
    fields = ("user_id", "item_id", "genre", "item_ctr")
    model = ColdPreRanker(config.net, fields, encoder.cardinalities())
    save_cold_model(settings.home / "v" / "artifacts" / COLD_DIR_ARTIFACT, model, config, encoder)
    client = mlflow.MlflowClient(settings.tracking_uri, registry_uri=settings.tracking_uri)
    run = client.create_run(client.create_experiment("signed"))
    run_id = run.info.run_id
    client.log_artifacts(run_id, str(settings.home / "v"), artifact_path="model")
    model_uri = f"{run.info.artifact_uri}/model"
    name = REGISTERED_MODEL
    package = settings.home / "preranking.pt2"
    package.write_bytes(b"the package the compile gate tested")
    client.log_artifact(run_id, str(package), artifact_path="compiled")
    gate = {"passed": True, "reasons": []}
    client.log_text(run_id, json.dumps(gate), "compiled/gate.json")
    client.create_registered_model(name)
    source, digests = registration_files(settings, model_uri, run_id)
    tags = {DIGESTS_TAG: digests_tag(digests)}
    first = client.create_model_version(name, source, run_id=run_id, tags=tags).version
    native: list[str] = []
    # Every native load of a pre-ranker's package goes through here (serving.served_version).
    monkeypatch.setattr(served_version, "load_package", native.append)

    # Unsigned: refused from its tags alone.
    with pytest.raises(UnsignedRelease, match="carries no platform signature"):
        load_version(settings, first, with_package=True)
    key = load_signing_key(settings.home, create=True)
    sign_version(client, key, name, first, compile_gate=gate, decision={"promoted": True})
    signed = load_version(settings, first, with_package=True)
    assert signed.compiled is not None and signed.compiled.read_bytes() == package.read_bytes()

    # A re-run of the compile step rewrites the run's compiled/: the version does not change.
    package.write_bytes(b"a package built again")
    client.log_artifact(run_id, str(package), artifact_path="compiled")
    assert registration_files(settings, model_uri, run_id)[0] != source  # a new candidate
    shutil.rmtree(settings.home / "serving" / "compiled")  # a fresh worker
    again = load_version(settings, first, with_package=True)
    assert again.compiled is not None
    assert again.compiled.read_bytes() == b"the package the compile gate tested"

    # A registry writer swaps the registered package itself: the version is refused.
    stored = Path(client.get_model_version_download_uri(name, first).removeprefix("file://"))
    (stored / "compiled" / "preranking.pt2").write_bytes(b"someone else's shared library")
    shutil.rmtree(settings.home / "serving" / "compiled")
    with pytest.raises(TamperedArtifact, match=r"changed \['compiled/preranking.pt2'\]"):
        load_version(settings, first, with_package=True)

    # A new version of the same files wearing the first one's signature.
    second = client.create_model_version(name, source, run_id=run_id, tags=tags).version
    envelope = client.get_model_version(name, first).tags[RELEASE_TAG]
    client.set_model_version_tag(name, second, RELEASE_TAG, envelope)
    client.set_registered_model_alias(name, "champion", second)
    server = PreRankingModel(
        settings=settings,
        config=ServingConfig(poll_s=60),
        backends=registry_backends(version_source=lambda s, run: "generated"),
    )
    server.observer = None
    with caplog.at_level("ERROR", logger="serving.preranking"):
        assert not server.refresh() and not server.refresh()
    assert not server.ready and server.served_version is None
    refusals = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(refusals) == 1 and "made for another version" in refusals[0]
    assert "version 2" in refusals[0] and "\n" not in refusals[0]
    assert native == []
