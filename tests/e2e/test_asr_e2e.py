"""The asr DAG against the started stack: a corpus (synthesized speech and recorded people, as
wav/ + transcripts.jsonl) landed with ``cascade land``, a Kafka ``speech`` event -> Spark corpus
-> GX -> DeepSpeed (debug flavor) -> compiled int8 package -> registry -> the ASR server,
asserting on outcomes (the debug flavor trains for seconds, so transcripts are not checked for
accuracy)."""

from __future__ import annotations

import base64
import io
import wave

import numpy as np
import pytest
import requests

from cascade.config import Settings
from tests.e2e.conftest import DS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _wav(samples: np.ndarray, rate: int = 16_000, width: int = 2) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(width)
        out.setframerate(rate)
        out.writeframes(samples.tobytes())
    return buffer.getvalue()


def _transcribe(stack: Settings, content: bytes) -> requests.Response:
    audio = {"name": "audio", "datatype": "BYTES", "shape": [1]}
    body = {"inputs": [{**audio, "data": [base64.b64encode(content).decode()]}]}
    return requests.post(f"{stack.asr_serving_url}/v2/models/asr/infer", json=body, timeout=60)


def test_speech_event_runs_the_whole_asr_dag(
    stack: Settings, asr_run: dict, triggered: dict
) -> None:
    from cascade.lake import Lake
    from cascade.landing import landing_dir, landing_record

    assert asr_run["run_type"] == "asset_triggered"
    assert asr_run["dag_run_state"] == "success", asr_run
    # A wav/ + transcripts.jsonl export landed with `cascade land`: every utterance kept.
    record = landing_record(landing_dir(Lake(stack.lake_root), "speech", DS))
    assert record is not None and record["format"] == "jsonl"
    exported = triggered["exported"]["speech"]
    assert record["counts"]["utterances"] == exported["utterances"] > exported["human"] > 0
    assert record["counts"]["quarantined"] == 0
    corpus = asr_run["corpus"]
    assert corpus["landed_from"] == "jsonl"
    assert corpus["utterances"] > 0 and corpus["splits"]["test"] > 0
    assert asr_run["compile"]["passed"] and asr_run["compile"]["agreement"] >= 0.95
    register = asr_run["register"]
    assert register["promoted"] and asr_run["deploy"]["served_version"] == register["version"]


def test_the_champion_carries_its_metrics_and_compiled_package(
    stack: Settings, asr_run: dict
) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=stack.tracking_uri, registry_uri=stack.tracking_uri)
    champion = client.get_model_version_by_alias("asr", "champion")
    assert str(champion.version) == asr_run["register"]["champion_version"]
    run = client.get_run(champion.run_id)
    assert {"cer_fp32", "cer_int8", "wer_fp32", "compile_int8_cer"} <= set(run.data.metrics)
    assert run.data.tags["compile_gate"] == "passed"
    files = {f.path for f in client.list_artifacts(champion.run_id, "int8")}
    assert {"int8/asr_model.pt", "int8/asr_int8.pt2", "int8/asr_compiled.json"} <= files


def test_server_transcribes_speech_with_the_champion_package(
    stack: Settings, asr_run: dict
) -> None:
    from jobs.speech_synth import synthesize, utterance_spec

    pcm, rate = synthesize(utterance_spec(5))
    response = _transcribe(stack, _wav(np.frombuffer(pcm, dtype="<i2"), rate))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["parameters"]["model_version"] == asr_run["register"]["champion_version"]
    assert body["parameters"]["backend"] == "int8"
    outputs = {o["name"]: o for o in body["outputs"]}
    assert isinstance(outputs["transcript"]["data"][0], str)
    assert len(outputs["words"]["data"]) == len(outputs["word_start_s"]["data"])
    assert outputs["duration_s"]["data"][0] == pytest.approx(len(pcm) / 2 / rate, abs=0.01)


@pytest.mark.parametrize(
    ("content", "status"),
    [
        (b"this is not audio", 400),
        (_wav(np.zeros(16_000 * 21, dtype="<i2")), 413),  # over the 20 s limit
        (_wav(np.full(16_000, 128, dtype=np.uint8), width=1), 415),  # 8-bit PCM
    ],
)
def test_bad_audio_gets_a_4xx(stack: Settings, asr_run: dict, content: bytes, status: int) -> None:
    response = _transcribe(stack, content)
    assert response.status_code == status, response.text
