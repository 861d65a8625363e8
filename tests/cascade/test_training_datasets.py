"""Training runs record the datasets they read, with a digest that changes with the data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade.config import load_settings
from cascade.training import datasets
from cascade.training.resumable_run import open_resumable_run


def test_a_new_run_logs_its_inputs_and_a_resumed_one_does_not_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CASCADE_MLFLOW_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    data = tmp_path / "training" / "dt=2026-11-22"
    data.mkdir(parents=True)
    (data / "part-0.parquet").write_bytes(b"rows" * 100)
    marker = tmp_path / "run.json"
    settings = load_settings()
    inputs = {"training/dt=2026-11-22": data, "missing": tmp_path / "nope"}
    run_id = open_resumable_run(settings, "datasets-test", marker, "t", {"a": 1}, inputs=inputs)
    mlflow.end_run()
    again = open_resumable_run(settings, "datasets-test", marker, "t", {"a": 1}, inputs=inputs)
    mlflow.end_run()
    assert again == run_id and json.loads(marker.read_text())["run_id"] == run_id

    logged = mlflow.MlflowClient(settings.tracking_uri).get_run(run_id).inputs.dataset_inputs
    assert len(logged) == 1  # once, and nothing for a path that does not exist
    dataset = logged[0].dataset
    digest, kind = datasets.dataset_digest(data)
    assert dataset.name == "training/dt=2026-11-22" and dataset.digest == digest[:36]
    assert str(data.resolve()) in dataset.source
    tags = {t.key: t.value for t in logged[0].tags}
    assert tags["mlflow.data.context"] == "training"
    assert (tags["digest_of"], tags["sha256"], kind) == ("content", digest, "content")


def test_the_digest_follows_the_content_and_large_inputs_by_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "d" / "x.parquet"
    file.parent.mkdir()
    file.write_bytes(b"a" * 10)
    first, kind = datasets.dataset_digest(file.parent)
    file.write_bytes(b"b" * 10)  # same name and size, other bytes
    assert datasets.dataset_digest(file.parent)[0] != first and kind == "content"
    assert datasets.dataset_digest(file)[0] != first  # a file is digested with its name
    monkeypatch.setattr(datasets, "CONTENT_DIGEST_LIMIT", 5)
    assert datasets.dataset_digest(file.parent)[1] == "listing"
