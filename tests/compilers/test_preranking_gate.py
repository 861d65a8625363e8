"""The pipeline's compile step on a trained model: artifact, gate report, MLflow, registry."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
import torch

from cascade.artifacts import DIGESTS_TAG, digests_tag
from cascade.compiled_packages import load_package
from cascade.config import Settings
from cascade.lake import Lake
from cascade.signing import load_signing_key, sign_version
from compilers.preranking import cold_request_inputs
from compilers.preranking_gate import cold_gate_sample, compile_and_gate
from models.preranking import REGISTERED_MODEL
from models.preranking.config_registry import cascade_debug
from models.preranking.fields import FIELD_NAMES, FieldEncoder
from models.preranking.inference import (
    COLD_DIR_ARTIFACT,
    load_trained,
    load_version,
    log_cold_model,
    registration_files,
)
from models.preranking.model import ColdPreRanker
from models.preranking.synthetic_data import synthetic_training_frame
from tests.cascade.test_registry import fitted, trained

DS = "2026-01-07"


def test_compile_step_refuses_a_missing_training_and_a_dense_preranker(settings: Settings) -> None:
    """The compile step compiles what the train step trains, the FSCD pre-ranker: nothing
    trained, or a dense PreRanker's run (which no pipeline trains any more), is a one-line
    error naming what to do, and no gate report is written."""
    with pytest.raises(FileNotFoundError, match="run the train step"):
        compile_and_gate(DS, settings=settings)
    trained(settings, DS, fitted(0))
    with pytest.raises(ValueError, match="is a PreRanker, which the pipeline neither compiles"):
        compile_and_gate(DS, settings=settings)
    assert not (Lake(settings.lake_root).reports("compile", DS) / "result.json").exists()


def fscd_trained(settings: Settings, ds: str) -> ColdPreRanker:
    """Write ``ds``'s training set and an FSCD pre-ranker's run folder and MLflow run as the
    cascade's train step leaves them (random weights: the gate checks fidelity, not skill)."""
    lake = Lake(settings.lake_root)
    data = lake.training_set("preranking", ds) / "data.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    frame = synthetic_training_frame(3000, seed=int(ds[-2:]), end=ds)
    frame.to_parquet(data)
    config = cascade_debug()
    encoder = FieldEncoder(bins=config.bins).fit(frame)
    torch.manual_seed(0)
    fields = ("user_id", "user_ctr", "item_id", "genre", "item_ctr", "ug_ctr")
    model = ColdPreRanker(config.net, fields, encoder.cardinalities())
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embedding" in name:
                parameter.normal_(0, 0.5)
    out = lake.reports("train", ds)
    mlflow.set_tracking_uri(settings.tracking_uri)
    example = frame[list(FIELD_NAMES)].head(5).reset_index(drop=True)
    with mlflow.start_run() as run:
        info = log_cold_model(out / COLD_DIR_ARTIFACT, model.eval(), config, encoder, example)
    result = {
        "run_id": run.info.run_id,
        "test_auc": 0.5,
        "model_uri": info.model_uri,
        "model_kind": "fscd",
        "config": config.name,
        "ds": ds,
        "fscd_fields": list(fields),
    }
    (out / "result.json").write_text(json.dumps(result))
    return model


@pytest.mark.slow
def test_compile_step_compiles_and_gates_the_fscd_preranker(settings: Settings) -> None:
    model = fscd_trained(settings, DS)
    report = compile_and_gate(DS, settings=settings)
    assert report["max_abs_diff"] < 1e-4 and abs(report["auc_delta"]) <= 1e-3, report
    assert not [r for r in report["reasons"] if not r.startswith("latency")], report["reasons"]
    assert report["requests"] > 10 and report["candidates_timed"] > 100
    artifact = Path(report["artifact"])
    # The artifact scores one user x N candidates like the network, also for N = 1, the
    # cross side once per key.
    encoder = load_trained(Lake(settings.lake_root).reports("train", DS)).encoder
    assert encoder is not None
    codes = encoder.encode(synthetic_training_frame(40, seed=3))
    compiled = load_package(artifact)
    for n in (1, 40):
        with torch.no_grad():
            inputs = cold_request_inputs(model, codes[:1], codes[:n])
            assert inputs[2].shape[0] <= n
            torch.testing.assert_close(compiled(*inputs), model.score_request(codes[0], codes[:n]))
    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    logged = {a.path for a in client.list_artifacts(report["run_id"], "compiled")}
    assert {"compiled/preranking.pt2", "compiled/gate.json"} <= logged
    run = client.get_run(report["run_id"])
    assert run.data.tags["compile_gate"] == ("passed" if report["passed"] else "failed")
    assert "compile_speedup_vs_eager" in run.data.metrics
    written = json.loads(
        (Lake(settings.lake_root).reports("compile", DS) / "result.json").read_text()
    )
    assert written["passed"] == report["passed"] and written["run_id"] == report["run_id"]

    # The server's load of this version fetches the package when (and only when) it passed.
    # Both URIs: an earlier test may have left a global registry URI behind.
    client = mlflow.MlflowClient(
        tracking_uri=settings.tracking_uri, registry_uri=settings.tracking_uri
    )
    if not client.search_registered_models(f"name = '{REGISTERED_MODEL}'"):
        client.create_registered_model(REGISTERED_MODEL)
    trained_result = json.loads(
        (Lake(settings.lake_root).reports("train", DS) / "result.json").read_text()
    )
    source, digests = registration_files(settings, trained_result["model_uri"], report["run_id"])
    version = client.create_model_version(
        REGISTERED_MODEL,
        source,
        run_id=report["run_id"],
        tags={DIGESTS_TAG: digests_tag(digests)},
    ).version
    # Signed as the promotion gate signs it: the package it tested, and the gate's verdict.
    assert digests[f"compiled/{Path(report['artifact']).name}"] == next(
        iter(report["tested"].values())
    )
    key = load_signing_key(settings.home, create=True)
    sign_version(client, key, REGISTERED_MODEL, version, compile_gate=report,
                 decision={"promoted": True})  # fmt: skip
    assert load_version(settings, version).compiled is None  # the registry's loads skip it
    served = load_version(settings, version, with_package=True)
    if report["passed"]:
        assert served.compiled is not None and served.compiled_reason == ""
        assert served.compiled.read_bytes() == artifact.read_bytes()
    else:
        assert served.compiled is None and "compile gate" in served.compiled_reason


def test_cold_gate_sample_is_one_request_per_user_with_its_labels() -> None:
    frame = synthetic_training_frame(600, users=20, items=50, seed=4)
    encoder = FieldEncoder(bins=6).fit(frame)
    sample = cold_gate_sample(frame, encoder, max_users=5)
    counts = frame.groupby("user_id").size().sort_values(ascending=False, kind="stable")
    assert len(sample) == 5
    assert sorted(len(labels) for _, labels in sample) == sorted(counts.iloc[:5].tolist())
    for (user_codes, candidate_codes), labels in sample:
        assert user_codes.shape == (1, candidate_codes.shape[1])
        assert torch.equal(user_codes[0], candidate_codes[0])
        assert candidate_codes.shape[0] == len(labels)
    # The rows of a request are one user's: its user_id code is the same on every row.
    user_col = FIELD_NAMES.index("user_id")
    assert all(len(set(c[:, user_col].tolist())) == 1 for (_, c), _ in sample)


def test_serving_fetches_a_runs_package_only_when_its_gate_passed(settings: Settings) -> None:
    from models.preranking.inference import fetch_compiled

    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    experiment = client.create_experiment("fetch-compiled")
    cache = settings.home / "cache"

    def run_with(gate: dict[str, object] | None) -> str:
        run_id = client.create_run(experiment).info.run_id
        if gate is not None:
            package = settings.home / "preranking.pt2"
            package.parent.mkdir(parents=True, exist_ok=True)
            package.write_bytes(b"package of " + run_id.encode())
            client.log_artifact(run_id, str(package), artifact_path="compiled")
            client.log_text(run_id, json.dumps(gate), "compiled/gate.json")
        return run_id

    passed = run_with({"passed": True, "reasons": []})
    path, reason = fetch_compiled(settings, passed, cache)
    assert reason == "" and path == cache / passed / "preranking.pt2"
    assert path.read_bytes() == b"package of " + passed.encode()
    path.write_bytes(b"kept")  # a second load reads the downloaded copy
    assert fetch_compiled(settings, passed, cache)[0] == path and path.read_bytes() == b"kept"
    assert not [p for p in cache.iterdir() if p.name.endswith(".partial")]

    failed = run_with({"passed": False, "reasons": ["latency: 0.8x eager, need 1.0x"]})
    path, reason = fetch_compiled(settings, failed, cache)
    assert path is None and "gate of run" in reason and "latency: 0.8x" in reason
    path, reason = fetch_compiled(settings, run_with(None), cache)
    assert path is None and "compile step did not run" in reason
