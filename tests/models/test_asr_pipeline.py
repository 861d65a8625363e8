"""The asr DAG's registry step: promotion on CER over the same held-out voices, compile gate,
idempotent retries (real MLflow store, tiny models trained in the test)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cascade.config import Settings
from cascade.lake import Lake
from cascade.step_context import StepContext
from cascade.step_runner import execute
from models.asr.artifact import AsrArtifact, artifact_files, save_artifact
from models.asr.model import Alphabet, ConvDFSMN, ConvDFSMNConfig, ctc_loss
from models.asr.registration import SERVED_ARTIFACT_PATH
from models.asr.rsq import float_state_dict, prepare_qat, quantization_record
from pipelines import asr as pipeline

N_MELS = 8
ALPHABET = Alphabet("ab")
TEXTS = ("ab", "ba", "a", "b")


def _features(text: str) -> np.ndarray:
    """Each character is 10 frames with energy in its own band, 5 silent frames around."""
    frames = np.full((5 + 15 * len(text), N_MELS), -5.0, np.float32)
    for i, char in enumerate(text):
        frames[5 + 15 * i : 15 + 15 * i, 1 if char == "a" else 5] = 3.0
    return frames


def _corpus(root: Path) -> Path:
    rows = [
        {
            "utterance_id": f"u{i}",
            "transcript": text,
            "language": "en",
            "voice": f"v{i}",
            "num_frames": len(_features(text)),
            "features": _features(text).astype(np.float16).tobytes(),
        }
        for i, text in enumerate(TEXTS)
    ]
    (root / "shards" / "split=test").mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(root / "shards" / "split=test" / "part-0.parquet")
    (root / "summary.json").write_text(json.dumps({"config": {"n_mels": N_MELS}}))
    return root


def _int8_artifact(out: Path, *, train_steps: int) -> Path:
    torch.manual_seed(0)
    config = ConvDFSMNConfig(
        n_mels=N_MELS, vocab_size=len(ALPHABET), conv_channels=16, hidden=32, memory=16,
        blocks=2, left=4, right=1, dropout=0.0,
    )  # fmt: skip
    model = prepare_qat(ConvDFSMN(config))
    feats = [torch.from_numpy(_features(t)) for t in TEXTS]
    batch = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True, padding_value=-5.0)
    lengths = torch.tensor([len(f) for f in feats])
    targets = [torch.tensor(ALPHABET.encode(t)) for t in TEXTS]
    target_lengths = torch.tensor([len(t) for t in targets])
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(max(train_steps, 1)):  # one step at least: the activation ranges calibrate
        optimizer.zero_grad()
        loss = ctc_loss(model, batch, lengths, torch.cat(targets), target_lengths)
        if train_steps:
            loss.backward()
            optimizer.step()
    plain = ConvDFSMN(config)
    plain.load_state_dict(float_state_dict(model))
    record = quantization_record(model, bits=8)
    return save_artifact(
        out, AsrArtifact(model=plain.eval(), alphabet=ALPHABET, n_mels=N_MELS, quantization=record)
    )


def _trained(settings: Settings, ds: str, artifact: Path, *, gate_passed: bool = True) -> None:
    """What the train and compile steps leave: an MLflow run holding the int8 model, results."""
    import mlflow

    from models.asr.evaluate import evaluate_artifacts

    lake = Lake(settings.lake_root)
    mlflow.set_tracking_uri(settings.tracking_uri)
    mlflow.set_experiment("asr-test")
    with mlflow.start_run() as run:
        for part in artifact_files(artifact):  # the weights and their vocabulary, as training
            mlflow.log_artifact(str(part), SERVED_ARTIFACT_PATH)
    evaluation = evaluate_artifacts(artifact, artifact, pipeline.corpus_dir(lake, ds))
    for kind, result in (
        ("asr_train", {"run_id": run.info.run_id, "int8_artifact": str(artifact),
                       "cer_int8": evaluation["cer_int8"], "cer_fp32": evaluation["cer_fp32"]}),
        ("asr_compile", {"passed": gate_passed,
                         "reasons": [] if gate_passed else ["int8 package disagrees"]}),
    ):  # fmt: skip
        summary = lake.step_summary(kind, ds)  # what the runner records
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.write_text(json.dumps(result))


@pytest.mark.slow
def test_registry_promotes_on_held_out_cer_and_respects_the_compile_gate(
    settings: Settings, tmp_path: Path
) -> None:
    lake = Lake(settings.lake_root)
    good = _int8_artifact(tmp_path / "good", train_steps=150)
    bad = _int8_artifact(tmp_path / "bad", train_steps=0)
    for ds in ("2026-11-20", "2026-11-21", "2026-11-22"):
        _corpus(pipeline.corpus_dir(lake, ds))

    _trained(settings, "2026-11-20", good)
    first = execute(
        StepContext.build(pipeline.PIPELINE, "register", "2026-11-20", platform=settings)
    )
    assert first["promoted"] and first["previous_champion"] is None and first["version"] == "1"
    # A server following the champion downloads the version's files once and swaps them in.
    from models.asr.artifact import load_artifact
    from serving.champion import ChampionFollower

    swaps: list[tuple[Path, str]] = []
    follower = ChampionFollower(
        settings, "asr", lambda folder, version: swaps.append((folder, version)),
        cache=tmp_path / "cache",
    )  # fmt: skip
    assert follower.refresh() and not follower.refresh()
    assert [v for _, v in swaps] == ["1"] and load_artifact(swaps[0][0]).quantization
    assert load_artifact(swaps[0][0]).alphabet == ALPHABET  # its vocabulary came with it

    _trained(settings, "2026-11-21", bad)
    second = execute(
        StepContext.build(pipeline.PIPELINE, "register", "2026-11-21", platform=settings)
    )
    assert not second["promoted"] and second["champion_version"] == "1"
    comparison = second["comparison"]
    assert comparison["champion"] < 0.2 < comparison["challenger"]
    assert comparison["utterances"] == len(TEXTS)
    assert comparison["unseen_characters"] == {"challenger": 0, "champion": 0}
    assert "worse than champion v1" in second["reasons"][0]
    # A retry registers nothing new and returns the stored decision.
    assert (
        execute(StepContext.build(pipeline.PIPELINE, "register", "2026-11-21", platform=settings))
        == second
    )

    _trained(settings, "2026-11-22", good, gate_passed=False)
    third = execute(
        StepContext.build(pipeline.PIPELINE, "register", "2026-11-22", platform=settings)
    )
    assert not third["promoted"] and third["reasons"] == ["compile gate: int8 package disagrees"]
    assert third["comparison"]["passed"]  # accurate, but its compiled package failed the gate
