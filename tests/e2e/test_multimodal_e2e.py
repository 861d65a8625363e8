"""The multimodal DAG against the started stack: captioned pictures (offline sources and
generated ones, as images/ + captions.jsonl) landed with ``cascade land``, a Kafka ``images``
event -> Spark corpus -> GX -> DeepSpeed MoE (debug flavor) -> held-out recall -> registry,
asserting on outcomes (the debug flavor trains for seconds, so recall is checked for range, not
for quality)."""

from __future__ import annotations

import pytest

from cascade.config import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_images_event_runs_the_whole_multimodal_dag(multimodal_run: dict, triggered: dict) -> None:
    assert multimodal_run["run_type"] == "asset_triggered"
    assert multimodal_run["dag_run_state"] == "success", multimodal_run
    corpus = multimodal_run["corpus"]
    # An images/ + captions.jsonl export landed with `cascade land`: every pair kept.
    assert corpus["producer_landed"] and corpus["landed_from"] == "image_folder"
    exported = triggered["exported"]["images"]
    assert exported["generated"] == 200
    assert corpus["landed"]["pairs"] == sum(exported.values())
    assert corpus["landed"]["quarantined"] == 0
    assert corpus["splits"]["test"] >= 2 and corpus["kept"] > 0
    assert multimodal_run["validate"]["success"]
    assert multimodal_run["train"]["config"] == "debug" and multimodal_run["train"]["moe"]
    evaluation = multimodal_run["evaluate"]
    assert evaluation["dense"] is None and "MoE figures only" in evaluation["dense_note"]
    assert evaluation["eval_pairs"] == corpus["splits"]["test"]
    register = multimodal_run["register"]
    assert register["promoted"] and register["run_id"] == multimodal_run["train"]["run_id"]


def test_the_multimodal_champion_carries_its_recall_and_model_files(
    stack: Settings, multimodal_run: dict
) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=stack.tracking_uri, registry_uri=stack.tracking_uri)
    champion = client.get_model_version_by_alias("multimodal", "champion")
    assert str(champion.version) == multimodal_run["register"]["champion_version"]
    assert float(champion.tags["mean_recall_at_1"]) == pytest.approx(
        multimodal_run["evaluate"]["mean_recall_at_1"]
    )
    run_id = champion.run_id
    assert run_id is not None
    metrics = client.get_run(run_id).data.metrics
    recalls = {f"{d}_recall_at_{k}" for d in ("i2t", "t2i") for k in (1, 5)}
    assert recalls | {"mean_recall_at_1"} <= set(metrics)
    for name in recalls:
        assert 0.0 <= metrics[name] <= 1.0, name
    files = {f.path for f in client.list_artifacts(run_id, "model")}
    assert "model/mp_rank_00_model_states.pt" in files and "model/result.json" in files
