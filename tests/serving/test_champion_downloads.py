"""A server process downloads a registry version into a folder of its own and serves it only
when the completeness marker (written last, with the files' digests) vouches for it: a planted
partial download is never served, it is downloaded again. A version whose stored files are not
the ones its registration recorded is never loaded: the ASR server keeps the version it serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.security import planted_pickle
from cascade.artifacts import DIGESTS_TAG, TamperedArtifact, digests_tag, folder_digests
from cascade.config import Settings
from cascade.signing import RELEASE_TAG, load_signing_key, sign_version
from serving.champion import (
    COMPLETE_MARKER,
    ChampionFollower,
    download_version,
    incomplete_reason,
    worker_cache,
)

MODEL = "asr"
FILES = {"asr_model.pt": b"weights " * 4096, "config/asr.json": b'{"vocab": 42}'}


@pytest.fixture
def registry(settings: Settings, tmp_path: Path) -> Settings:
    """``MODEL`` version 1 in a real sqlite MLflow store, its files logged as run artifacts,
    and the champion alias on it."""
    from mlflow.tracking import MlflowClient

    source = tmp_path / "model"
    for name, data in FILES.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    client = MlflowClient(settings.tracking_uri, settings.tracking_uri)
    # A run of its own experiment in this store: no process-wide MLflow state is used.
    run = client.create_run(client.create_experiment("downloads"))
    client.log_artifacts(run.info.run_id, str(source), artifact_path="model")
    client.set_terminated(run.info.run_id)
    client.create_registered_model(MODEL)
    version = client.create_model_version(
        MODEL,
        source=f"{run.info.artifact_uri}/model",
        run_id=run.info.run_id,
        tags={DIGESTS_TAG: digests_tag(folder_digests(source))},
    )
    sign(settings, str(version.version))
    client.set_registered_model_alias(MODEL, "champion", version.version)
    return settings


def sign(settings: Settings, version: str) -> None:
    """Sign ``version`` of ``MODEL`` as the promotion gate does (a passed gate, promoted)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(settings.tracking_uri, settings.tracking_uri)
    key = load_signing_key(settings.home, create=True)
    sign_version(client, key, MODEL, version, compile_gate={"passed": True},
                 decision={"promoted": True, "reasons": []})  # fmt: skip


def contents(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in FILES}


def test_a_download_is_marked_complete_with_its_digests_in_the_process_own_folder(
    registry: Settings, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    folder = download_version(registry, MODEL, "1", cache)
    assert folder == cache / f"worker-{os.getpid()}" / "v1"
    assert contents(folder) == FILES and incomplete_reason(folder) is None
    marker = json.loads((folder / COMPLETE_MARKER).read_text())
    assert sorted(marker["files"]) == sorted(FILES) and marker["version"] == "1"
    assert marker["files"]["asr_model.pt"]["bytes"] == len(FILES["asr_model.pt"])
    # Another process's folder is another folder: workers never share a download.
    assert worker_cache(cache, os.getpid() + 1) != worker_cache(cache)


@pytest.mark.parametrize("damage", ["no_marker", "changed_after_marker", "extra_file"])
def test_a_planted_partial_download_is_never_served_and_is_downloaded_again(
    registry: Settings, tmp_path: Path, damage: str
) -> None:
    cache = tmp_path / "cache"
    planted = worker_cache(cache) / "v1"
    if damage == "no_marker":  # a download killed half way: a truncated file, no marker
        planted.mkdir(parents=True)
        (planted / "asr_model.pt").write_bytes(FILES["asr_model.pt"][:100])
    else:
        download_version(registry, MODEL, "1", cache)
        if damage == "changed_after_marker":
            (planted / "asr_model.pt").write_bytes(FILES["asr_model.pt"][:100])
        else:
            (planted / "leftover.tmp").write_bytes(b"half")
    assert incomplete_reason(planted) is not None

    swaps: list[tuple[Path, str]] = []
    follower = ChampionFollower(
        registry, MODEL, lambda folder, version: swaps.append((folder, version)), cache=cache
    )
    assert follower.refresh()
    [(folder, version)] = swaps
    assert (folder, version) == (planted, "1")
    assert contents(folder) == FILES and incomplete_reason(folder) is None
    assert not (folder / "leftover.tmp").exists()


def test_folders_of_server_processes_that_ended_are_removed(
    registry: Settings, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    dead = worker_cache(cache, int(ended.stdout))
    (dead / "v1").mkdir(parents=True)
    mine = download_version(registry, MODEL, "1", cache)
    ChampionFollower(registry, MODEL, lambda folder, version: None, cache=cache)
    assert not dead.exists() and mine.is_dir()


def test_an_operator_release_signs_a_version_whose_files_match_its_registration(
    registry: Settings, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    from cascade.signing import new_signing_key, release_version, retire_key, trusted_keys

    client = MlflowClient(registry.tracking_uri, registry.tracking_uri)
    client.delete_model_version_tag(MODEL, "1", RELEASE_TAG)
    with pytest.raises(TamperedArtifact, match="carries no platform signature"):
        download_version(registry, MODEL, "1", tmp_path / "cache")
    released = release_version(registry, MODEL, "1", reason="hotfix")
    assert released.decision["by"] == "operator" and released.decision["reason"] == "hotfix"
    assert download_version(registry, MODEL, "1", tmp_path / "cache").is_dir()

    # Rotation: a new key re-signs with the same decision; the old one is then retired.
    old = set(trusted_keys(registry.home))
    new_signing_key(registry.home)
    assert release_version(registry, MODEL, "1", reason="rotation").decision == released.decision
    retire_key(registry.home, old.pop())
    assert download_version(registry, MODEL, "1", tmp_path / "fresh").is_dir()

    # Files changed in the store since registration: not signed.
    stored = Path(client.get_model_version_download_uri(MODEL, "1").removeprefix("file://"))
    (stored / "asr_model.pt").write_bytes(b"other weights")
    with pytest.raises(TamperedArtifact, match="differs from what was registered"):
        release_version(registry, MODEL, "1", reason="again")


def _register_asr(settings: Settings, folder: Path) -> tuple[str, Path]:
    """``folder`` registered as a new version of ``asr`` with the digests its registration
    records (:func:`cascade.registry.source_digests`, as the asr pipeline's register step
    does); returns the version and where the store keeps its files."""
    from mlflow.tracking import MlflowClient

    from cascade.registry import source_digests

    client = MlflowClient(settings.tracking_uri, settings.tracking_uri)
    names = [m.name for m in client.search_registered_models()]
    experiment = "asr-trust"
    found = client.get_experiment_by_name(experiment)
    run = client.create_run(found.experiment_id if found else client.create_experiment(experiment))
    client.log_artifacts(run.info.run_id, str(folder), artifact_path="int8")
    client.set_terminated(run.info.run_id)
    if MODEL not in names:
        client.create_registered_model(MODEL)
    source = f"{run.info.artifact_uri}/int8"
    version = client.create_model_version(
        MODEL,
        source=source,
        run_id=run.info.run_id,
        tags={DIGESTS_TAG: digests_tag(source_digests(settings, source))},
    ).version
    sign(settings, str(version))
    stored = Path(client.get_model_version_download_uri(MODEL, version).removeprefix("file://"))
    assert stored.is_dir()  # the local profile's artifact store is a folder
    return str(version), stored


TAMPERING = ["changed_weights", "planted_pickle", "swapped_package", "unsigned", "retagged"]


@pytest.mark.parametrize("tamper", TAMPERING)
def test_the_asr_server_never_loads_a_version_that_differs_from_its_signed_release(
    settings: Settings,
    tmp_path: Path,
    tamper: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch
    from mlflow.tracking import MlflowClient

    from models.asr.artifact import save_artifact
    from models.asr.compiled import INT8_FILE, REPORT_FILE, model_digest
    from serving import asr
    from tests.asr_models import tiny_artifact

    model_dir = tmp_path / "model"
    save_artifact(model_dir, tiny_artifact(quantized=False))
    # A compiled version as the compile step leaves it: the package, what it was built from,
    # the gate's passed report (a stand-in package: what is checked is whether it is loaded).
    (model_dir / INT8_FILE).write_bytes(b"the package the compile gate tested")
    (model_dir / REPORT_FILE).write_text(json.dumps({"model_digest": model_digest(model_dir)}))
    (model_dir / asr.GATE_FILE).write_text(json.dumps({"passed": True, "reasons": []}))
    native: list[Path] = []

    def load_compiled(path: Path, config: object) -> None:
        native.append(Path(path))
        raise RuntimeError("not a real package")  # the server falls back to eager

    monkeypatch.setattr(asr, "load_compiled", load_compiled)
    first, _ = _register_asr(settings, model_dir)
    second, stored = _register_asr(settings, model_dir)
    client = MlflowClient(settings.tracking_uri, settings.tracking_uri)
    client.set_registered_model_alias(MODEL, "champion", first)
    server = asr.AsrModel(None, prefer_compiled=True)
    cache = tmp_path / "cache"
    follower = ChampionFollower(settings, MODEL, server.swap, cache=cache)
    assert follower.refresh() and server.served_version == first
    assert [p.name for p in native] == [INT8_FILE]  # signed, gate passed: its package loads

    marker = tmp_path / "unpickled.txt"
    if tamper == "changed_weights":  # still a valid model file: only the digest tells
        payload = torch.load(stored / "asr_model.pt", weights_only=True)
        payload["state_dict"] = {k: v + 1 for k, v in payload["state_dict"].items()}
        torch.save(payload, stored / "asr_model.pt")
    elif tamper == "planted_pickle":
        (stored / "asr_model.pt").write_bytes(planted_pickle(marker))
    elif tamper == "swapped_package":
        (stored / INT8_FILE).write_bytes(b"someone else's shared library")
    elif tamper == "unsigned":
        client.delete_model_version_tag(MODEL, second, RELEASE_TAG)
    else:  # the first version's signature on the second (same files, same digests)
        envelope = client.get_model_version(MODEL, first).tags[RELEASE_TAG]
        client.set_model_version_tag(MODEL, second, RELEASE_TAG, envelope)
    client.set_registered_model_alias(MODEL, "champion", second)

    with caplog.at_level("ERROR", logger="serving.champion"):
        assert not follower.refresh()
    assert server.served_version == first and follower.served == first
    refusal = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(refusal) == 1 and f"refusing {MODEL} v{second}" in refusal[0]
    assert f"still serving v{first}" in refusal[0]
    why = {
        "unsigned": "carries no platform signature",
        "retagged": "made for another version",
        "swapped_package": f"changed ['{INT8_FILE}']",
    }.get(tamper, "changed ['asr_model.pt']")
    assert why in refusal[0]
    assert not marker.exists() and len(native) == 1
    assert not (worker_cache(cache) / f"v{second}").exists()
    assert not list(worker_cache(cache).glob(f".v{second}*"))  # nothing left of the download
    # Refused once: the next ticks neither download it again nor log again.
    caplog.clear()
    with caplog.at_level("ERROR", logger="serving.champion"):
        assert not follower.refresh()
    assert not caplog.records and server.served_version == first
