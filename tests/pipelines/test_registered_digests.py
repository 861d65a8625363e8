"""The asr and multimodal register steps record the digests of a version's files
(:data:`cascade.artifacts.DIGESTS_TAG`), and a champion whose stored files no longer match them
is never loaded: the next registration refuses to score it (nothing of it is read or
unpickled) and the champion alias stays where it was (real MLflow store)."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
import torch

from benchmarks.security import planted_pickle
from cascade.artifacts import DIGESTS_TAG, TamperedArtifact, folder_digests
from cascade.config import Settings
from cascade.lake import Lake
from cascade.step_context import StepContext
from cascade.step_runner import execute
from models.asr import REGISTERED_MODEL as ASR
from models.multimodal import REGISTERED_MODEL as MULTIMODAL
from models.multimodal.registration import MODEL_ARTIFACT_PATH as MM_ARTIFACT_PATH
from pipelines import asr as asr_pipeline
from pipelines import multimodal as mm_pipeline


def _client(settings: Settings) -> mlflow.MlflowClient:
    return mlflow.MlflowClient(
        tracking_uri=settings.tracking_uri, registry_uri=settings.tracking_uri
    )


def _stored(settings: Settings, name: str, version: str) -> Path:
    uri = _client(settings).get_model_version_download_uri(name, version)
    folder = Path(uri.removeprefix("file://"))
    assert folder.is_dir(), uri  # the local profile's artifact store is a folder
    return folder


def _champion(settings: Settings, name: str) -> str:
    return str(_client(settings).get_model_version_by_alias(name, "champion").version)


def test_asr_registration_records_digests_and_a_tampered_champion_is_never_loaded(
    settings: Settings, tmp_path: Path
) -> None:
    from tests.models.test_asr_pipeline import _corpus, _int8_artifact, _trained

    lake = Lake(settings.lake_root)
    artifact = _int8_artifact(tmp_path / "model", train_steps=0)
    for ds in ("2026-11-20", "2026-11-21"):
        _corpus(asr_pipeline.corpus_dir(lake, ds))
    _trained(settings, "2026-11-20", artifact)
    first = execute(
        StepContext.build(asr_pipeline.PIPELINE, "register", "2026-11-20", platform=settings)
    )
    assert first["promoted"] and first["version"] == "1"
    version = _client(settings).get_model_version(ASR, "1")
    stored = _stored(settings, ASR, "1")
    assert json.loads(version.tags[DIGESTS_TAG]) == folder_digests(stored)
    assert "asr_model.pt" in json.loads(version.tags[DIGESTS_TAG])

    marker = tmp_path / "unpickled.txt"
    (stored / "asr_model.pt").write_bytes(planted_pickle(marker))
    _trained(settings, "2026-11-21", artifact)
    with pytest.raises(TamperedArtifact, match=r"asr v1 differs .*changed \['asr_model.pt'\]"):
        execute(
            StepContext.build(asr_pipeline.PIPELINE, "register", "2026-11-21", platform=settings)
        )
    assert not marker.exists()
    assert _champion(settings, ASR) == "1"


def _mm_trained(settings: Settings, ds: str, files: Path) -> None:
    """What train and evaluate leave: a run holding the stored model files, an evaluate result,
    a corpus that passed its gate."""
    lake = Lake(settings.lake_root)
    corpus = mm_pipeline.corpus_dir(lake, ds)
    corpus.mkdir(parents=True)
    (corpus / "gate.json").write_text(json.dumps({"success": True}))
    mlflow.set_tracking_uri(settings.tracking_uri)
    mlflow.set_experiment("multimodal-trust")
    with mlflow.start_run() as run:
        mlflow.log_artifacts(str(files), MM_ARTIFACT_PATH)
    recall = 0.5
    result = {
        "ds": ds, "config": "debug", "run_id": run.info.run_id, "mean_recall_at_1": recall,
        "i2t_recall_at_1": recall, "t2i_recall_at_1": recall, "i2t_recall_at_5": recall,
        "t2i_recall_at_5": recall, "dense": None, "eval_pairs": 2,
    }  # fmt: skip
    summary = lake.step_summary("mm_evaluate", ds)  # what the runner records
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(json.dumps(result))


def test_multimodal_registration_records_digests_and_a_tampered_champion_is_never_loaded(
    settings: Settings, tmp_path: Path
) -> None:
    from models.multimodal.stored import DIGESTS_FILE, MODEL_CONFIG_FILE, MODULE_STATES

    files = tmp_path / "final"
    files.mkdir()
    torch.save({"module": {"w": torch.zeros(2)}}, files / MODULE_STATES)
    (files / MODEL_CONFIG_FILE).write_text("{}")
    (files / DIGESTS_FILE).write_text(json.dumps(folder_digests(files)))
    _mm_trained(settings, "2026-11-20", files)
    first = execute(
        StepContext.build(mm_pipeline.PIPELINE, "register", "2026-11-20", platform=settings)
    )
    assert first["promoted"] and first["version"] == "1"
    version = _client(settings).get_model_version(MULTIMODAL, "1")
    stored = _stored(settings, MULTIMODAL, "1")
    recorded = json.loads(version.tags[DIGESTS_TAG])
    assert recorded == folder_digests(stored)
    assert {MODULE_STATES, MODEL_CONFIG_FILE, DIGESTS_FILE} <= set(recorded)

    # Whoever writes the store can write digests.json too: the registry's record decides.
    marker = tmp_path / "unpickled.txt"
    (stored / MODULE_STATES).write_bytes(planted_pickle(marker))
    listing = {name: digest for name, digest in recorded.items() if name != DIGESTS_FILE}
    listing[MODULE_STATES] = folder_digests(stored)[MODULE_STATES]
    (stored / DIGESTS_FILE).write_text(json.dumps(listing))
    _mm_trained(settings, "2026-11-21", files)
    with pytest.raises(TamperedArtifact, match=r"multimodal v1 differs .*changed \[.*mp_rank"):
        execute(
            StepContext.build(mm_pipeline.PIPELINE, "register", "2026-11-21", platform=settings)
        )
    assert not marker.exists()
    # The champion was never scored: no worker was started on its files.
    assert not (
        Lake(settings.lake_root).reports("mm_register", "2026-11-21") / "champion-v1"
    ).exists()
    assert _champion(settings, MULTIMODAL) == "1"
