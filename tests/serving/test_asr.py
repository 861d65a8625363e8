"""The ASR model server: an espeak-ng WAV over real HTTP (v2 JSON base64 and the binary tensor
extension) on the int8 package, and each kind of bad input answered with its 4xx."""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import subprocess
import sys
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from conftest import REPO_ROOT

from cascade.config import load_settings
from cascade.ports import free_port
from domains.speech.audio_features import CorpusConfig, decode_wav, log_mel, resample
from jobs.speech_synth import synthesize, utterance_spec
from models.asr.artifact import load_artifact, save_artifact
from models.asr.compiled import INT8_FILE, REPORT_FILE, load_compiled
from models.asr.inference import transcribe
from serving import asr_client
from serving.asr import decode_request_audio, load_model_dir, unwrap_bytes_tensor
from tests.asr_models import tiny_artifact


def wav_bytes(
    samples: np.ndarray, rate: int = 16_000, *, channels: int = 1, width: int = 2
) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        writer.writeframes(np.asarray(samples).tobytes())
    return buffer.getvalue()


def espeak_wav() -> bytes:
    pcm, rate = synthesize(utterance_spec(3))
    return wav_bytes(np.frombuffer(pcm, dtype="<i2"), rate)


def model_dir(path: Path) -> Path:
    save_artifact(path, tiny_artifact(quantized=False))
    return path


def test_decoding_checks_the_header_before_the_samples() -> None:
    config = CorpusConfig()
    tone = (np.sin(np.arange(16_000) / 5) * 8000).astype("<i2")
    stereo = np.repeat(tone, 2)
    audio = decode_request_audio(wav_bytes(stereo, 48_000, channels=2), config)
    assert audio.channels == 2 and audio.source_rate == 48_000
    assert audio.seconds == pytest.approx(1 / 3, abs=1e-3)  # 16k frames at 48 kHz
    # A streamed WAV's data size is a placeholder: its length is what follows the header.
    streamed = bytearray(wav_bytes(tone))
    struct.pack_into("<I", streamed, 40, 0x7FFFF000)
    assert decode_request_audio(bytes(streamed), config).seconds == pytest.approx(1.0)
    with pytest.raises(ValueError) as rejected:
        decode_request_audio(wav_bytes(np.zeros(16_000 * 21, "<i2")), config)
    assert getattr(rejected.value, "status", None) == 413
    framed = struct.pack("<I", 10) + b"0123456789"
    assert unwrap_bytes_tensor(framed) == b"0123456789"
    assert unwrap_bytes_tensor(b"RIFF....") == b"RIFF...."


def test_cut_short_and_too_short_audio_is_a_400() -> None:
    config = CorpusConfig()
    whole = wav_bytes(TONE)
    cases = {
        whole[: 44 + 9000]: "truncated WAV file: the data chunk holds 4500 of the 16000 frames",
        whole[:30]: "truncated WAV header: the file ends after 30 bytes, inside the 'fmt ' chunk",
        wav_bytes(TONE[:2000]): "audio of 125 ms is too short to transcribe",
        wav_bytes(TONE[:4700]): "the shortest utterance taken is 0.3 s",
    }
    for content, message in cases.items():
        with pytest.raises(ValueError) as rejected:
            decode_request_audio(content, config)
        assert getattr(rejected.value, "status", None) == 400, rejected.value
        assert message in str(rejected.value)
    assert decode_request_audio(wav_bytes(TONE[:4800]), config).seconds == pytest.approx(0.3)


def test_serves_eager_when_the_package_is_missing_or_from_another_model(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    assert load_model_dir(directory).backend == "eager"
    (directory / INT8_FILE).write_bytes(b"not a package")
    (directory / REPORT_FILE).write_text(json.dumps({"model_digest": "another model"}))
    assert load_model_dir(directory).backend == "eager"


def test_a_request_naming_its_language_is_decoded_with_that_languages_ngram(
    tmp_path: Path,
) -> None:
    """In process, on the eager tiny model with n-grams stored beside it: a request naming
    English is decoded by beam search with the English n-gram (what the model's own decoder
    gives with them), one naming no language greedily, as before."""
    import asyncio

    from kserve import InferRequest
    from kserve.protocol.infer_type import InferInput

    from models.asr.language_model import DecoderWeights, LanguageModels
    from serving.asr import AsrModel

    artifact = tiny_artifact(quantized=False)
    # Heavy weights: the n-gram's choice, not the random network's, makes the text.
    artifact.language_models = LanguageModels.fit(
        ["the weather", "hello there"], ["en", "en"], order=3,
        weights=DecoderWeights(alpha=3.0, beta=4.0, beam=4),
    ).only(artifact.alphabet.languages)  # fmt: skip
    save_artifact(tmp_path, artifact)
    model = AsrModel(tmp_path, prefer_compiled=False)
    assert model.load() and model.backend == "eager"
    wav = espeak_wav()
    audio = InferInput(name="audio", shape=[1], datatype="BYTES", data=[wav])

    def infer(parameters: dict[str, Any] | None) -> str:
        request = InferRequest(
            model_name="asr", infer_inputs=[audio], request_id="r", parameters=parameters
        )
        return str(asyncio.run(model.predict(request)).outputs[0].data[0])

    samples, rate = decode_wav(wav)
    features = log_mel(resample(samples, rate), artifact.n_mels)
    loaded = load_artifact(tmp_path)
    expected = transcribe(
        loaded.model, loaded.alphabet, features, language="en",
        language_models=loaded.language_models,
    ).text  # fmt: skip
    greedy = transcribe(loaded.model, loaded.alphabet, features, language="en").text
    assert expected != greedy
    assert infer({"language": "en"}) == expected
    assert infer(None) == transcribe(loaded.model, loaded.alphabet, features).text


def test_a_request_naming_no_language_is_decoded_in_the_language_the_identifier_detects(
    tmp_path: Path,
) -> None:
    """In process, on the eager tiny model with a language identifier stored beside it (one
    fitted on Mandarin only, so it always answers Mandarin): a request naming no language is
    decoded restricted to Mandarin and says the language was detected; one naming English is
    decoded in English, not detected; a model without an identifier decodes unrestricted."""
    import asyncio

    from kserve import InferRequest
    from kserve.protocol.infer_type import InferInput

    from models.asr.language_id import expected_inputs, fit_language_identifier
    from serving.asr import AsrModel

    artifact = tiny_artifact(quantized=False)
    wav = espeak_wav()
    samples, rate = decode_wav(wav)
    features = log_mel(resample(samples, rate), artifact.n_mels)
    inputs = expected_inputs(artifact.n_mels, artifact.alphabet)
    rng = np.random.default_rng(0)
    artifact.language_identifier = fit_language_identifier(
        rng.standard_normal((4, inputs)), ["cmn"] * 4, uses_model=True
    )
    save_artifact(tmp_path / "with", artifact)
    artifact.language_identifier = None
    save_artifact(tmp_path / "without", artifact)
    audio = InferInput(name="audio", shape=[1], datatype="BYTES", data=[wav])

    def infer(folder: str, parameters: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        model = AsrModel(tmp_path / folder, prefer_compiled=False)
        assert model.load() and model.backend == "eager"
        request = InferRequest(
            model_name="asr", infer_inputs=[audio], request_id="r", parameters=parameters
        )
        response = asyncio.run(model.predict(request))
        return str(response.outputs[0].data[0]), dict(response.parameters or {})

    loaded = load_artifact(tmp_path / "with")
    text, parameters = infer("with", None)
    assert parameters["language"] == "mandarin" and parameters["language_detected"] is True
    assert text == transcribe(loaded.model, loaded.alphabet, features, language="cmn").text
    text, parameters = infer("with", {"language": "en"})
    assert parameters["language"] == "english" and parameters["language_detected"] is False
    assert text == transcribe(loaded.model, loaded.alphabet, features, language="en").text
    text, parameters = infer("without", None)
    assert parameters["language"] is None and parameters["language_detected"] is False
    assert text == transcribe(loaded.model, loaded.alphabet, features).text


def test_a_reference_with_characters_the_model_never_saw_is_counted_not_refused(
    tmp_path: Path,
) -> None:
    """In process, on the eager tiny model (alphabet: English letters and 你好天气): a request
    with its known transcript is transcribed and answered with its CER and the reference's
    characters the model has no output for; a reference that is not a string is a 400."""
    import asyncio

    from kserve import InferRequest
    from kserve.protocol.infer_type import InferInput

    from models.asr.metrics import cer
    from serving.asr import AsrModel, AudioRejected

    model = AsrModel(model_dir(tmp_path), prefer_compiled=False)
    assert model.load() and model.backend == "eager"
    audio = InferInput(name="audio", shape=[1], datatype="BYTES", data=[espeak_wav()])

    def infer(parameters: dict[str, Any] | None) -> dict[str, Any]:
        request = InferRequest(
            model_name="asr", infer_inputs=[audio], request_id="r", parameters=parameters
        )
        response = asyncio.run(model.predict(request))
        return {"text": response.outputs[0].data[0], **(response.parameters or {})}

    plain = infer(None)
    assert "unseen_characters" not in plain
    # Czech letters and digits: transcribed all the same, the unseen ones counted.
    checked = infer({"reference": "Kůň č. 42 — 你好!"})
    assert checked["text"] == plain["text"]
    assert checked["unseen"] == ["2", "4", "č", "ň", "ů"]
    assert checked["unseen_characters"] == 5
    assert checked["reference_cer"] == pytest.approx(cer(["kůň č 42 你好"], [plain["text"]]))
    assert infer({"reference": "hello"})["unseen_characters"] == 0
    with pytest.raises(AudioRejected, match="'reference' parameter must be the transcript"):
        infer({"reference": 42})


class AsrServer:
    def __init__(self, directory: Path, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = {
            **os.environ,
            "CASCADE_HOME": str(directory / "home"),
            "CASCADE_ASR_SERVING_PORT": str(self.port),
            "PYTHONPATH": str(REPO_ROOT),
        }
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "serving.asr", "--model-dir", str(directory)],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"ASR server exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                if requests.get(f"{self.url}/v2/models/asr/ready", timeout=1).status_code == 200:
                    return
            except (requests.ConnectionError, requests.Timeout):
                pass
            time.sleep(0.2)
        self.stop()
        pytest.fail(f"ASR server not ready:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def post_json(self, payload: Any) -> requests.Response:
        return requests.post(f"{self.url}/v2/models/asr/infer", json=payload, timeout=60)

    def post_wav(self, content: bytes) -> requests.Response:
        encoded = base64.b64encode(content).decode()
        return self.post_json(
            {"inputs": [{"name": "audio", "datatype": "BYTES", "shape": [1], "data": [encoded]}]}
        )


@pytest.fixture(scope="module")
def int8_server(
    compiled_asr_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[AsrServer, Path]]:
    server = AsrServer(compiled_asr_dir, tmp_path_factory.mktemp("asr-server") / "server.log")
    try:
        server.wait_ready()
        yield server, compiled_asr_dir
    finally:
        server.stop()


def outputs_of(response: requests.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return {o["name"]: o for o in response.json()["outputs"]}


@pytest.mark.slow
def test_espeak_wav_round_trip_json_and_binary(int8_server: tuple[AsrServer, Path]) -> None:
    server, directory = int8_server
    content = espeak_wav()
    response = server.post_wav(content)
    outputs = outputs_of(response)
    assert response.json()["parameters"]["backend"] == "int8"
    # The server's answer is the int8 package's transcription of the same audio.
    samples, rate = decode_wav(content)
    artifact = load_artifact(directory)
    local = transcribe(
        load_compiled(directory / INT8_FILE, artifact.model.config),
        artifact.alphabet,
        log_mel(resample(samples, rate), artifact.n_mels),
    )
    assert local.text and outputs["transcript"]["data"] == [local.text]
    words = local.words()
    assert words
    assert outputs["words"]["data"] == [w["word"] for w in words]
    assert outputs["word_start_s"]["data"] == pytest.approx([w["start_s"] for w in words])
    assert outputs["word_end_s"]["data"] == pytest.approx([w["end_s"] for w in words])
    assert outputs["duration_s"]["data"][0] == pytest.approx(len(samples) / rate, abs=1e-3)

    # The binary tensor extension: JSON header, then the BYTES tensor (length-prefixed file).
    raw = struct.pack("<I", len(content)) + content
    header = json.dumps(
        {
            "id": "bin-1",
            "inputs": [
                {
                    "name": "audio",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
        }
    ).encode()
    binary = requests.post(
        f"{server.url}/v2/models/asr/infer",
        data=header + raw,
        headers={
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Type": "application/octet-stream",
        },
        timeout=60,
    )
    assert binary.json()["id"] == "bin-1"
    assert outputs_of(binary)["transcript"]["data"] == [local.text]


@pytest.mark.slow
def test_the_client_transcribes_probes_and_names_why_a_roll_out_waits(
    int8_server: tuple[AsrServer, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _ = int8_server
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CASCADE_ASR_SERVING_PORT", str(server.port))
    settings = load_settings()
    content = espeak_wav()
    answer = asr_client.transcribe(settings, content)
    assert outputs_of(server.post_wav(content))["transcript"] == next(
        o for o in answer["outputs"] if o["name"] == "transcript"
    )
    # The probe tone is audio the server takes; a folder it serves has no registry version.
    probe = asr_client.client(settings).infer(
        asr_client.request_body(asr_client.probe_tone()), timeout_s=60
    )
    assert probe["parameters"]["backend"] == "int8" and asr_client.served_version(settings) is None
    with pytest.raises(TimeoutError, match=r"still serves version None .*\(cascade asr serve\)"):
        asr_client.roll_out(
            settings, "2026-11-22", {}, timeout_s=0.2, poll_s=0.1,
            champion_version=lambda s, name: "1",
        )  # fmt: skip
    with pytest.raises(RuntimeError, match="no 'asr@champion' to deploy; .* refused: worse"):
        asr_client.roll_out(
            settings, "2026-11-22", {"reasons": ["worse"]}, champion_version=lambda s, name: None
        )

    monkeypatch.setenv("CASCADE_ASR_SERVING_PORT", str(free_port()))  # nothing listens there
    down = load_settings()
    assert asr_client.served_version(down, timeout_s=2) is None
    with pytest.raises(RuntimeError, match="the ASR server did not answer"):
        asr_client.transcribe(down, content, timeout_s=2)


@pytest.mark.slow
def test_the_language_restricts_the_transcript_and_an_unknown_one_is_a_400(
    int8_server: tuple[AsrServer, Path],
) -> None:
    """A language on the request (JSON parameter or Content-Language header) gives the int8
    package's transcription decoded for it; an unknown or contradicting one is a 400."""
    server, directory = int8_server
    content = espeak_wav()
    samples, rate = decode_wav(content)
    artifact = load_artifact(directory)
    package = load_compiled(directory / INT8_FILE, artifact.model.config)
    features = log_mel(resample(samples, rate), artifact.n_mels)
    audio = {
        "name": "audio",
        "datatype": "BYTES",
        "shape": [1],
        "data": [base64.b64encode(content).decode()],
    }
    plain = server.post_json({"inputs": [audio]})
    assert plain.json()["parameters"]["language"] is None
    mixed = outputs_of(plain)["transcript"]["data"][0]
    assert mixed == transcribe(package, artifact.alphabet, features).text
    scripts = {"english": set("abcdefghijklmnopqrstuvwxyz' "), "mandarin": set("你好天气 ")}
    texts = {}
    for language, group in (("en-US", "english"), ("cmn", "mandarin")):
        response = server.post_json({"parameters": {"language": language}, "inputs": [audio]})
        text = outputs_of(response)["transcript"]["data"][0]
        assert response.json()["parameters"]["language"] == group
        assert text == transcribe(package, artifact.alphabet, features, language=language).text
        assert set(text) <= scripts[group]
        texts[group] = text
    assert mixed not in texts.values()  # the untrained model mixes scripts; restriction ends it

    raw = struct.pack("<I", len(content)) + content
    header = json.dumps(
        {"inputs": [{**audio, "data": None, "parameters": {"binary_data_size": len(raw)}}]}
    ).encode()

    def binary(language: str) -> requests.Response:
        return requests.post(
            f"{server.url}/v2/models/asr/infer",
            data=header + raw,
            headers={
                "Inference-Header-Content-Length": str(len(header)),
                "Content-Type": "application/octet-stream",
                "Content-Language": language,
            },
            timeout=60,
        )

    assert outputs_of(binary("zh"))["transcript"]["data"] == [texts["mandarin"]]
    for response in (
        server.post_json({"parameters": {"language": "fr"}, "inputs": [audio]}),
        binary("klingon"),
    ):
        assert response.status_code == 400, response.text
        assert "unknown language" in response.json()["error"]
        assert "this model knows english, mandarin" in response.json()["error"]
    response = server.post_json({"parameters": {"language": 3}, "inputs": [audio]})
    assert response.status_code == 400 and "language name or code" in response.json()["error"]
    disagree = requests.post(
        f"{server.url}/v2/models/asr/infer",
        json={"parameters": {"language": "en"}, "inputs": [audio]},
        headers={"Content-Language": "cmn"},
        timeout=60,
    )
    assert disagree.status_code == 400 and "disagree" in disagree.json()["error"]


TONE = (np.sin(np.arange(16_000) / 5) * 8000).astype("<i2")

BAD_AUDIO = [
    pytest.param(b"this is a text file, not audio" * 10, 400, "not a WAV file", id="non-audio"),
    pytest.param(b"", 400, "empty audio", id="empty-bytes"),
    pytest.param(wav_bytes(TONE[:0]), 400, "empty audio", id="no-samples"),
    pytest.param(wav_bytes(TONE[:400]), 400, "too short", id="too-short"),
    pytest.param(wav_bytes(TONE[:2000]), 400, "too short", id="125-ms"),
    pytest.param(wav_bytes(TONE)[:9044], 400, "truncated WAV file", id="truncated-data"),
    pytest.param(wav_bytes(TONE)[:30], 400, "truncated WAV header", id="header-cut-30"),
    pytest.param(wav_bytes(np.zeros(16_000 * 21, "<i2")), 413, "longer than 20 s", id="too-long"),
    pytest.param(
        wav_bytes((TONE // 256 + 128).astype(np.uint8), width=1), 415, "8 bits", id="8-bit"
    ),
    pytest.param(wav_bytes(np.repeat(TONE, 3), channels=3), 415, "channel count 3", id="3-ch"),
    pytest.param(wav_bytes(TONE, 11_025), 415, "sample rate 11025", id="rate"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("content", "status", "message"), BAD_AUDIO)
def test_bad_audio_gets_its_4xx(
    int8_server: tuple[AsrServer, Path], content: bytes, status: int, message: str
) -> None:
    server, _ = int8_server
    response = server.post_wav(content)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]


@pytest.mark.slow
def test_bad_requests_get_their_4xx(int8_server: tuple[AsrServer, Path]) -> None:
    server, _ = int8_server
    audio = {"name": "audio", "datatype": "BYTES", "shape": [1], "data": ["%%%"]}
    assert server.post_json({"inputs": [audio]}).status_code == 400  # not base64
    wrong_type = {**audio, "datatype": "FP32", "data": [1.0]}
    response = server.post_json({"inputs": [wrong_type]})
    assert response.status_code == 400 and "BYTES" in response.json()["error"]
    response = server.post_json({"inputs": [{**audio, "name": "wav"}]})
    assert response.status_code == 400 and "'audio'" in response.json()["error"]
    not_json = requests.post(
        f"{server.url}/v2/models/asr/infer",
        data=b"{",
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert not_json.status_code == 422
    huge = requests.post(
        f"{server.url}/v2/models/asr/infer",
        data=b"0" * (17 << 20),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert huge.status_code == 413


def chunks(total: int, piece: int = 1 << 20) -> Iterator[bytes]:
    """A body of ``total`` bytes that requests sends chunked (no Content-Length)."""
    for _ in range(total // piece):
        yield b"0" * piece


@pytest.mark.slow
def test_the_asr_route_takes_json_or_binary_and_counts_streamed_bytes(tmp_path: Path) -> None:
    """The ASR route's 16 MiB limit holds for a chunked upload (no Content-Length to trust),
    other paths keep the server's 1 MiB, and only its documented content types are read."""
    server = AsrServer(model_dir(tmp_path / "model"), tmp_path / "server.log")
    try:
        server.wait_ready()
        url = f"{server.url}/v2/models/asr/infer"
        as_json = {"Content-Type": "application/json"}
        binary = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": "1",
        }
        response = requests.post(url, data=chunks(20 << 20), headers=as_json, timeout=60)
        assert response.status_code == 413, response.text
        assert "16777216 bytes" in response.json()["error"]
        response = requests.post(url, data=chunks(20 << 20), headers=binary, timeout=60)
        assert response.status_code == 413
        # 8 MB chunked is within the route's limit: read whole, then refused as not JSON.
        response = requests.post(url, data=chunks(8 << 20), headers=as_json, timeout=60)
        assert response.status_code == 422, response.text
        other = requests.post(
            f"{server.url}/v1/models/asr:predict", data=chunks(2 << 20), headers=as_json, timeout=60
        )
        assert other.status_code == 413
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "audio/wav"):
            response = requests.post(
                url, data=b"{}", headers={"Content-Type": content_type}, timeout=10
            )
            assert response.status_code == 415, content_type
        response = requests.post(url, data=b"{", headers=binary, timeout=10)
        assert response.status_code == 422  # the binary extension's JSON header is read
        espeak = server.post_wav(espeak_wav())
        assert espeak.status_code == 200, espeak.text
    finally:
        server.stop()
