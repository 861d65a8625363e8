"""Every registered model kind loads the standard way,
``mlflow.pyfunc.load_model("models:/NAME/N")`` with pickle loading switched off, and predicts
on the input example its version logged what the project's own (digest-checked) loader
predicts; the files MLflow's loader needs are covered by the version's recorded digests.

One real MLflow store serves the module (each kind registers under its own name): creating a
store costs seconds."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import mlflow
import mlflow.pyfunc
import numpy as np
import pandas as pd
import pytest
import torch

from cascade.artifacts import DIGESTS_TAG
from cascade.config import Settings, load_settings
from cascade.lake import Lake
from cascade.registry import add_pyfunc_files, download_verified
from cascade.step_context import StepContext
from cascade.step_runner import execute
from domains.speech.audio_features import SAMPLE_RATE, decode_wav, log_mel
from models.asr import REGISTERED_MODEL as ASR
from models.asr.registration import SERVED_ARTIFACT_PATH as ASR_ARTIFACT_PATH
from models.multimodal import REGISTERED_MODEL as MULTIMODAL
from models.preranking import REGISTERED_MODEL
from models.preranking.inference import load_version, score_frame
from pipelines import asr as asr_pipeline
from pipelines import multimodal as mm_pipeline

DS = "2026-11-20"
PYFUNC_FILES = {"MLmodel", "mlflow_model.py", "input_example.json"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Settings of one state folder and MLflow store for the module's tests; MLflow's loader
    refuses a pickled model here (its default in this version allows one)."""
    root = tmp_path_factory.mktemp("standard-loading")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CASCADE_HOME", str(root / "home"))
        patch.setenv("CASCADE_MLFLOW_URI", f"sqlite:///{root / 'mlflow.db'}")
        patch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "false")
        yield load_settings()


def _use_store(settings: Settings) -> mlflow.MlflowClient:
    mlflow.set_tracking_uri(settings.tracking_uri)
    mlflow.set_registry_uri(settings.tracking_uri)
    return mlflow.MlflowClient(
        tracking_uri=settings.tracking_uri, registry_uri=settings.tracking_uri
    )


def _recorded(client: mlflow.MlflowClient, name: str, version: str) -> set[str]:
    return set(json.loads(client.get_model_version(name, version).tags[DIGESTS_TAG]))


def test_preranker_loads_the_standard_way(store: Settings) -> None:
    from tests.cascade.test_registry import fitted, promote, trained
    from tests.compilers.test_preranking_gate import fscd_trained

    trained(store, "2026-11-20", fitted(0))
    fscd_trained(store, "2026-11-21")
    versions = {
        kind: promote(ds, store)["version"]
        for kind, ds in (("mlp", "2026-11-20"), ("fscd", "2026-11-21"))
    }
    client = _use_store(store)
    name = REGISTERED_MODEL
    for kind, version in versions.items():
        assert PYFUNC_FILES <= _recorded(client, name, version)
        assert "python_model.pkl" not in _recorded(client, name, version)

        model = mlflow.pyfunc.load_model(f"models:/{name}/{version}")
        example = model.input_example
        assert isinstance(example, pd.DataFrame) and len(example) >= 1
        scores = np.asarray(model.predict(example), dtype=np.float32).reshape(-1)
        ours = load_version(store, version)  # the project's loader: digests checked first
        assert (ours.encoder is not None) == (kind == "fscd")
        expected = score_frame(ours.model, example, ours.encoder)
        np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
        assert ((scores > 0) & (scores < 1)).all()


def test_asr_loads_the_standard_way(store: Settings, tmp_path: Path) -> None:
    from models.asr.artifact import load_artifact
    from models.asr.evaluate import int8_model
    from models.asr.inference import transcribe
    from models.asr.pyfunc import AUDIO_COLUMN, save_pyfunc
    from tests.models.test_asr_pipeline import _corpus, _int8_artifact, _trained

    artifact = _int8_artifact(tmp_path / "model", train_steps=0)
    _corpus(asr_pipeline.corpus_dir(Lake(store.lake_root), DS))
    _trained(store, DS, artifact)
    assert (
        execute(StepContext.build(asr_pipeline.PIPELINE, "register", DS, platform=store))["version"]
        == "1"
    )
    client = _use_store(store)
    recorded = _recorded(client, ASR, "1")
    assert {*PYFUNC_FILES, "asr_model.pt", "asr_model.vocabulary.json"} <= recorded
    # A repeated registration leaves the registered files alone.
    run_id = client.get_model_version(ASR, "1").run_id
    assert not add_pyfunc_files(store, run_id, ASR_ARTIFACT_PATH, save_pyfunc)
    folder = download_verified(store, ASR, "1", tmp_path / "verified")

    model = mlflow.pyfunc.load_model(f"models:/{ASR}/1")
    example = model.input_example
    out = model.predict(example)
    assert list(out.columns) == ["transcript", "duration_s"] and len(out) == len(example)
    stored = load_artifact(folder)
    samples, _ = decode_wav(base64.b64decode(example[AUDIO_COLUMN][0]))
    reference = transcribe(int8_model(stored), stored.alphabet, log_mel(samples, stored.n_mels))
    assert reference.text and out["transcript"][0] == reference.text
    assert out["duration_s"][0] == pytest.approx(len(samples) / SAMPLE_RATE)
    with pytest.raises(Exception, match="not a 16-bit PCM WAV"):
        model.predict(pd.DataFrame({AUDIO_COLUMN: ["bm90IGEgd2F2"]}))


LOAD_SCRIPT = """
import json, sys
import mlflow, mlflow.pyfunc
uri, out = sys.argv[1], sys.argv[2]
mlflow.set_tracking_uri(sys.argv[3]); mlflow.set_registry_uri(sys.argv[3])
model = mlflow.pyfunc.load_model(uri)
example = model.input_example
result = model.predict(example)
json.dump({"example": example.to_dict("list"),
           "image": [list(map(float, v)) for v in result["image_embedding"]],
           "text": [list(map(float, v)) for v in result["text_embedding"]],
           "similarity": [float(v) for v in result["similarity"]]}, open(out, "w"))
"""


def _stored_moe_model(final: Path, corpus: Path) -> torch.nn.Module:
    """A small MoE model's files as DeepSpeed's final checkpoint lays them out (module states
    and one file per MoE layer and expert), with its config and its corpus's tokenizer."""
    from deepspeed.moe.layer import MoE

    from domains.captions.tokenizer import CaptionTokenizer
    from models.multimodal.model import ImageTextTransformer, MoEConfig, MultimodalConfig
    from models.multimodal.pyfunc import example_frame
    from models.multimodal.stored import MODULE_STATES, save_model_files

    torch.manual_seed(0)
    moe = MoEConfig(num_experts=4, prototypes=2, capacity_factor=2.0, min_capacity=4)
    config = MultimodalConfig(dim=32, heads=2, layers=2, ffn_hidden=64, embed_dim=16, moe=moe)
    tokenizer = CaptionTokenizer.fit(list(example_frame()["caption"]), min_count=1)
    config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size)
    model = ImageTextTransformer(config).eval()
    states = dict(model.state_dict())
    final.mkdir(parents=True)
    moe_layers = [n for n, m in model.named_modules() if isinstance(m, MoE)]
    assert moe_layers
    for layer, name in enumerate(moe_layers):
        prefix = f"{name}.deepspeed_moe.experts.deepspeed_experts."
        experts = sorted({k[len(prefix) :].split(".")[0] for k in states if k.startswith(prefix)})
        for expert in experts:
            keys = [k for k in states if k.startswith(f"{prefix}{expert}.")]
            torch.save(
                {k: states.pop(k) for k in keys},
                final / f"layer_{layer}_expert_{expert}_mp_rank_00_model_states.pt",
            )
    torch.save({"module": states}, final / MODULE_STATES)
    corpus.mkdir(parents=True)
    tokenizer.save(corpus / "tokenizer.json")
    save_model_files(final, config, corpus)
    return model


def test_multimodal_loads_the_standard_way(store: Settings, tmp_path: Path) -> None:
    from models.multimodal.pyfunc import CAPTION_COLUMN, IMAGE_COLUMN, decode_image
    from models.multimodal.stored import caption_tokens, stored_tokenizer
    from tests.pipelines.test_registered_digests import _mm_trained

    final = tmp_path / "final"
    model = _stored_moe_model(final, tmp_path / "corpus")
    _mm_trained(store, DS, final)
    assert (
        execute(StepContext.build(mm_pipeline.PIPELINE, "register", DS, platform=store))["version"]
        == "1"
    )
    client = _use_store(store)
    recorded = _recorded(client, MULTIMODAL, "1")
    assert {*PYFUNC_FILES, "tokenizer.json", "layer_1_expert_1_mp_rank_00_model_states.pt"} <= (
        recorded
    )

    # MoE layers need a process group: MLflow's loader runs in a process of its own.
    out = tmp_path / "predicted.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    uri = f"models:/{MULTIMODAL}/1"
    subprocess.run(
        [sys.executable, "-c", LOAD_SCRIPT, uri, str(out), store.tracking_uri],
        check=True, env=env, timeout=300,
    )  # fmt: skip
    predicted = json.loads(out.read_text())

    # The same rows through the model as it was built, its own tokenizer reading the captions.
    example = predicted["example"]
    size, max_tokens = model.config.image_size, model.config.max_tokens
    images = torch.from_numpy(np.stack([decode_image(v, size) for v in example[IMAGE_COLUMN]]))
    tokens = caption_tokens(stored_tokenizer(final), example[CAPTION_COLUMN], max_tokens)
    with torch.no_grad():
        expected = model(images, tokens)
    np.testing.assert_allclose(predicted["image"], expected.image_embedding.numpy(), atol=1e-5)
    np.testing.assert_allclose(predicted["text"], expected.text_embedding.numpy(), atol=1e-5)
    similarity = (expected.image_embedding * expected.text_embedding).sum(dim=1).numpy()
    np.testing.assert_allclose(predicted["similarity"], similarity, atol=1e-5)
