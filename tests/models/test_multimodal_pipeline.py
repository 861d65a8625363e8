"""The multimodal DAG's steps on a tiny partition: real Spark corpus, GX gate, 2-process DeepSpeed
training of the debug config and its dense twin, a real MLflow store; promotion on recall and a
failed gate that blocks training and registration."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from cascade.config import Settings
from cascade.errors import NothingLanded
from cascade.lake import Lake
from cascade.landing import land
from cascade.step_context import StepContext
from cascade.step_runner import execute
from domains.captions.tokenizer import CaptionTokenizer
from jobs.multimodal_corpus_gate import MultimodalGateFailed
from models.multimodal import REGISTERED_MODEL
from models.multimodal.registration import MODEL_ARTIFACT_PATH
from pipelines import multimodal as pipeline

pytestmark = [pytest.mark.slow, pytest.mark.spark]

DS = "2026-11-20"


@pytest.fixture
def small_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_MULTIMODAL_CONFIG", "debug")
    monkeypatch.setenv("CASCADE_MULTIMODAL_GENERATED", "200")
    monkeypatch.setenv("CASCADE_MULTIMODAL_SOURCE_LIMIT", "20")
    # Stated, not inherited: the e2e stack turns the twin off in this process's environment.
    monkeypatch.setenv("CASCADE_MULTIMODAL_DENSE_TWIN", "1")
    monkeypatch.delenv("CASCADE_MULTIMODAL_RECALL_TOLERANCE", raising=False)


def _client(settings: Settings) -> mlflow.MlflowClient:
    return mlflow.MlflowClient(
        tracking_uri=settings.tracking_uri, registry_uri=settings.tracking_uri
    )


def _test_pairs(settings: Settings, ds: str) -> int:
    corpus = pipeline.corpus_dir(Lake(settings.lake_root), ds)
    return len(pd.read_parquet(corpus / "shards" / "split=test"))


def _refit(corpus: Path) -> None:
    """Another partition's corpus: half of the held-out pairs, and a tokenizer whose ids differ
    from the original's (the characters in reverse order), the shards tokenized with it."""
    tokenizer = CaptionTokenizer(chars=CaptionTokenizer.load(corpus / "tokenizer.json").chars[::-1])
    tokenizer.save(corpus / "tokenizer.json")
    for path in sorted((corpus / "shards").rglob("*.parquet")):
        frame = pd.read_parquet(path)
        if "split=test" in str(path):
            frame = frame.iloc[::2]
        frame = frame.assign(token_ids=[tokenizer.encode(c) for c in frame["caption"]])
        frame.to_parquet(path)


def _challenger(settings: Settings, ds: str, recall: float, *, refit: bool = False) -> None:
    """What train and evaluate leave for a model of the given recall: a finished MLflow run and
    an evaluate result (the corpus and its gate copied from an earlier partition; ``refit``:
    then changed as :func:`_refit` does)."""
    lake = Lake(settings.lake_root)
    shutil.copytree(pipeline.corpus_dir(lake, DS), pipeline.corpus_dir(lake, ds))
    if refit:
        _refit(pipeline.corpus_dir(lake, ds))
    mlflow.set_tracking_uri(settings.tracking_uri)
    mlflow.set_experiment(REGISTERED_MODEL)
    # The champion's model files stand in for its own (registration records their digests).
    champion = _client(settings).get_model_version_by_alias(REGISTERED_MODEL, "champion")
    files = mlflow.artifacts.download_artifacts(
        run_id=champion.run_id,
        artifact_path=MODEL_ARTIFACT_PATH,
        dst_path=str(settings.home / f"challenger-{ds}"),
        tracking_uri=settings.tracking_uri,
    )
    with mlflow.start_run() as run:
        mlflow.log_metric("mean_recall_at_1", recall)
        mlflow.log_artifacts(files, MODEL_ARTIFACT_PATH)
    result = {
        "ds": ds, "config": "debug", "run_id": run.info.run_id, "mean_recall_at_1": recall,
        "i2t_recall_at_1": recall, "t2i_recall_at_1": recall, "i2t_recall_at_5": recall,
        "t2i_recall_at_5": recall, "dense": None, "eval_pairs": _test_pairs(settings, ds),
    }  # fmt: skip
    summary = lake.step_summary("mm_evaluate", ds)  # what the runner records
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(json.dumps(result))


def test_steps_build_train_evaluate_and_register_a_champion(
    settings: Settings, small_partition: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = Lake(settings.lake_root)
    # The pipeline makes up no data: the generated batch is a named source, landed explicitly.
    with pytest.raises(NothingLanded, match=f"nothing landed for {DS}"):
        execute(StepContext.build(pipeline.PIPELINE, "corpus", DS, platform=settings))
    land(lake, pipeline.IMAGES, DS, source="generated")
    corpus = execute(StepContext.build(pipeline.PIPELINE, "corpus", DS, platform=settings))
    assert not corpus["producer_landed"] and corpus["landed_from"] == "generated"
    assert corpus["landed"]["generated"] == 200 and corpus["landed"]["tuxpaint"] > 0
    assert corpus["splits"]["test"] >= 2 and corpus["splits"]["train"] >= 32
    assert (
        corpus["kept"] + corpus["quarantined"] + sum(corpus["duplicates_removed"].values())
        == (corpus["pairs_in"])
    )
    # A retry reads the batch the first attempt landed instead of landing another one.
    again = execute(StepContext.build(pipeline.PIPELINE, "corpus", DS, platform=settings))
    assert again["kept"] == corpus["kept"] and again["landed"] == corpus["landed"]
    assert not again["producer_landed"]

    with pytest.raises(RuntimeError, match="has not been validated"):
        execute(StepContext.build(pipeline.PIPELINE, "train", DS, platform=settings))
    gate = execute(StepContext.build(pipeline.PIPELINE, "validate", DS, platform=settings))
    assert gate["success"] and gate["rows"] == corpus["kept"]

    trained = execute(StepContext.build(pipeline.PIPELINE, "train", DS, platform=settings))
    assert trained["config"] == "debug" and trained["moe"] is True
    assert trained["eval_pairs"] == corpus["splits"]["test"]

    evaluation = execute(StepContext.build(pipeline.PIPELINE, "evaluate", DS, platform=settings))
    for side in (evaluation, evaluation["dense"]):
        for direction in ("i2t", "t2i"):
            assert 0 <= side[f"{direction}_recall_at_1"] <= side[f"{direction}_recall_at_5"] <= 1
    assert evaluation["dense"]["config"] == "debug-dense"
    assert evaluation["dense"]["run_id"] != evaluation["run_id"]
    assert evaluation["comparison"]["moe"]["active_params"] == pytest.approx(
        evaluation["comparison"]["dense"]["active_params"], rel=0.05
    )

    first = execute(StepContext.build(pipeline.PIPELINE, "register", DS, platform=settings))
    assert first["promoted"] and first["version"] == "1" and first["previous_champion"] is None
    client = _client(settings)
    champion = client.get_model_version_by_alias(REGISTERED_MODEL, "champion")
    assert str(champion.version) == "1"
    assert float(champion.tags["mean_recall_at_1"]) == evaluation["mean_recall_at_1"]
    run_id = champion.run_id
    assert run_id is not None
    files = {f.path for f in client.list_artifacts(run_id, MODEL_ARTIFACT_PATH)}
    assert "model/mp_rank_00_model_states.pt" in files
    # Stored with what scoring it on another partition needs: its config and tokenizer.
    assert {"model/model_config.json", "model/tokenizer.json", "model/digests.json"} <= files
    assert any("expert" in f for f in files)  # the experts' own files
    metrics = client.get_run(run_id).data.metrics
    assert {"i2t_recall_at_1", "t2i_recall_at_5", "mean_recall_at_1"} <= set(metrics)
    assert (
        execute(StepContext.build(pipeline.PIPELINE, "register", DS, platform=settings)) == first
    )  # a retry: the same decision

    # With no tolerance, a challenger just below the champion is registered, not promoted; one
    # above it is.
    monkeypatch.setenv("CASCADE_MULTIMODAL_RECALL_TOLERANCE", "0")
    recall = evaluation["mean_recall_at_1"]
    assert recall > 0, evaluation
    _challenger(settings, "2026-11-21", recall - 0.001)
    second = execute(
        StepContext.build(pipeline.PIPELINE, "register", "2026-11-21", platform=settings)
    )
    assert not second["promoted"] and second["champion_version"] == "1"
    assert second["comparison"]["champion"] == recall
    assert "worse than champion v1" in second["reasons"][0]
    assert str(client.get_model_version_by_alias(REGISTERED_MODEL, "challenger").version) == "2"
    # The champion was scored again, on the new partition's held-out pairs: here a copy of its
    # own, so it measures what its tag says.
    pairs = int(trained["eval_pairs"])
    assert second["comparison"]["same_rows"] is True
    assert second["comparison"]["rows"] == f"ds=2026-11-21 test split, {pairs} pairs"
    assert f"the same ds=2026-11-21 test split, {pairs} pairs" in second["reasons"][0]
    assert float(second["comparison"]["champion_tag"]) == recall
    # On a partition with other held-out pairs and another tokenizer, the champion reads the
    # captions with its own tokenizer and scores what it scores on those pairs, not its tag; a
    # challenger at the top is promoted whatever that is.
    _challenger(settings, "2026-11-23", 1.0, refit=True)
    third = execute(
        StepContext.build(pipeline.PIPELINE, "register", "2026-11-23", platform=settings)
    )
    assert third["promoted"] and third["previous_champion"] == "1" and third["version"] == "3"
    halved = _test_pairs(settings, "2026-11-23")
    assert halved < pairs
    comparison = third["comparison"]
    assert comparison["same_rows"] is True and comparison["champion_ds"] == DS
    assert comparison["rows"] == f"ds=2026-11-23 test split, {halved} pairs"
    assert comparison["champion"] != recall and float(comparison["champion_tag"]) == recall
    assert comparison["champion"] == pytest.approx(
        (comparison["champion_i2t_recall_at_1"] + comparison["champion_t2i_recall_at_1"]) / 2
    )

    # A corpus that fails its gate (one group in two splits) is refused by every later step.
    bad = "2026-11-22"
    shutil.copytree(pipeline.corpus_dir(lake, DS), pipeline.corpus_dir(lake, bad))
    manifest_dir = pipeline.corpus_dir(lake, bad) / "manifest"
    manifest = pd.read_parquet(manifest_dir)
    leak = manifest[manifest["split"] == "train"].head(1).assign(split="test", pair_id="leaked")
    shutil.rmtree(manifest_dir)
    manifest_dir.mkdir()
    pd.concat([manifest, leak]).to_parquet(manifest_dir / "part-0.parquet")
    with pytest.raises(
        MultimodalGateFailed, match=r"groups\.expect_column_values_to_be_between\(splits\)"
    ):
        execute(StepContext.build(pipeline.PIPELINE, "validate", bad, platform=settings))
    with pytest.raises(RuntimeError, match="failed its GX gate"):
        execute(StepContext.build(pipeline.PIPELINE, "train", bad, platform=settings))
    with pytest.raises(RuntimeError, match="failed its GX gate"):
        execute(StepContext.build(pipeline.PIPELINE, "register", bad, platform=settings))
    versions = client.search_model_versions(f"name='{REGISTERED_MODEL}'")
    assert sorted(str(v.version) for v in versions) == ["1", "2", "3"]


def test_steps_refuse_an_unvalidated_corpus_and_a_missing_result(settings: Settings) -> None:
    lake = Lake(settings.lake_root)
    with pytest.raises(RuntimeError, match="has not been validated"):
        execute(StepContext.build(pipeline.PIPELINE, "train", DS, platform=settings))
    (pipeline.corpus_dir(lake, DS)).mkdir(parents=True)
    (pipeline.corpus_dir(lake, DS) / "gate.json").write_text(json.dumps({"success": True}))
    with pytest.raises(FileNotFoundError, match="run step 'train'"):
        execute(StepContext.build(pipeline.PIPELINE, "evaluate", DS, platform=settings))
    with pytest.raises(FileNotFoundError, match="run step 'evaluate'"):
        execute(StepContext.build(pipeline.PIPELINE, "register", DS, platform=settings))


def test_evaluate_without_the_dense_twin_records_the_moe_figures_and_says_so(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_MULTIMODAL_DENSE_TWIN", "0")
    lake = Lake(settings.lake_root)
    mlflow.set_tracking_uri(settings.tracking_uri)
    mlflow.set_experiment(REGISTERED_MODEL)
    with mlflow.start_run() as run:
        pass
    trained = {
        "run_id": run.info.run_id, "config": "debug", "moe": True, "eval_pairs": 4.0,
        "i2t_recall_at_1": 0.5, "i2t_recall_at_5": 1.0, "t2i_recall_at_1": 0.25,
        "t2i_recall_at_5": 1.0,
    }  # fmt: skip
    summary = lake.step_summary("mm_train", DS)  # what the runner records
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(json.dumps(trained))
    evaluation = execute(StepContext.build(pipeline.PIPELINE, "evaluate", DS, platform=settings))
    assert evaluation["dense"] is None and "MoE figures only" in evaluation["dense_note"]
    assert evaluation["mean_recall_at_1"] == pytest.approx(0.375)
    logged = _client(settings).get_run(run.info.run_id).data.metrics
    assert logged["mean_recall_at_1"] == pytest.approx(0.375)
    monkeypatch.setenv("CASCADE_MULTIMODAL_DENSE_TWIN", "maybe")
    with pytest.raises(ValueError, match="CASCADE_MULTIMODAL_DENSE_TWIN must be 0 or 1"):
        execute(StepContext.build(pipeline.PIPELINE, "evaluate", DS, platform=settings))
