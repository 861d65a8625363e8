"""A server process downloads a registry version into a folder of its own and serves it only
when the completeness marker (written last, with the files' digests) vouches for it: a planted
partial download is never served, it is downloaded again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cascade.config import Settings
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
        MODEL, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id
    )
    client.set_registered_model_alias(MODEL, "champion", version.version)
    return settings


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
