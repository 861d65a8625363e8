"""The one registration every model goes through: the model's packaging hook names the files
and tags, the kernel copies them into a release, records and checks their digests, then
registers, signs and promotes (real MLflow store, no model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
import pytest

from cascade.artifacts import DIGESTS_TAG, TamperedArtifact, folder_digests, sha256_file
from cascade.config import Settings
from cascade.pipeline_spec import Promotion
from cascade.registration import Package, register_model
from cascade.registry import CHAMPION, RELEASES_DIR, registry_client_of
from cascade.signing import RELEASE_TAG

RULE = Promotion(metric="score", higher_is_better=True, requires_compile_gate=True)


def test_the_hook_names_files_and_tags_and_untested_files_register_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "weights.bin").write_bytes(b"weights")
    (files / "config.json").write_text("{}")
    # The store's own client: no process-wide tracking URI or experiment left for later tests.
    client = mlflow.MlflowClient(settings.tracking_uri)
    run_id = client.create_run(client.create_experiment("toy")).info.run_id
    client.log_artifacts(run_id, str(files), "model")
    client.set_terminated(run_id)
    hooked: list[tuple[Settings, str]] = []

    def package(given: Settings, given_run: str) -> Package:
        hooked.append((given, given_run))
        location = registry_client_of(given).get_run(given_run).info.artifact_uri
        return Package(parts={"": f"{location}/model"}, tags={"ds": "2026-01-07"})

    def register(gate: dict[str, Any]) -> dict[str, Any]:
        return register_model(
            settings, name="toy", model_description="a toy", run_id=run_id, description="v",
            package=package, promotion=RULE, score=lambda champion: pytest.fail("no champion"),
            compile_gate=gate, report=lambda decision: decision.record(),
        )  # fmt: skip

    # The gate tested other bytes than the run now holds: nothing is registered.
    with pytest.raises(TamperedArtifact, match="toy run .* not the files the compile gate tested"):
        register({"passed": True, "tested": {"weights.bin": "0" * 64}})
    client = registry_client_of(settings)
    assert client.search_model_versions("name='toy'") == []

    tested = {"weights.bin": sha256_file(files / "weights.bin")}
    decision = register({"passed": True, "tested": tested})
    assert decision["promoted"] and decision["version"] == "1"
    assert [run for _, run in hooked] == [run_id, run_id]
    version = client.get_model_version("toy", "1")
    assert version.tags["ds"] == "2026-01-07"
    assert json.loads(version.tags[DIGESTS_TAG]) == folder_digests(files)
    assert f"/{RELEASES_DIR}/" in version.source  # the write-once copy, not the run's folder
    assert RELEASE_TAG in version.tags  # signed before the alias moved
    assert str(client.get_model_version_by_alias("toy", CHAMPION).version) == "1"
    # Registering the same run again returns the stored decision.
    assert register({"passed": True, "tested": tested}) == decision
