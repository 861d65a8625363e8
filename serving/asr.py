"""The ASR KServe model: WAV bytes in, transcript with word timings out.

Run it (binds ``settings.host``:``CASCADE_ASR_SERVING_PORT``, 127.0.0.1:28082 by default)::

    cascade asr serve                            # the registry's asr@champion
    cascade asr serve --model-dir MODEL_DIR      # or CASCADE_ASR_MODEL_DIR=...

Following the registry (the stack's ``asr_serving`` service), the server polls ``asr@champion``,
downloads each new version's folder once and swaps it in between requests; responses name the
``model_version`` they were computed with (what the ``asr`` DAG's deploy step waits for).

``MODEL_DIR`` holds ``asr_model.pt`` with its alphabet, ``asr_model.vocabulary.json`` (fitted
from the training transcripts; a model stored before alphabets were fitted has none and is
served with the fixed alphabet its ``.pt`` lists, which the log says), and, from
``cascade asr compile --model MODEL_DIR``,
``asr_int8.pt2``: requests are transcribed with that int8 package when it was built from this
very model file (``asr_compiled.json`` names its digest), else with the eager fp32 model (the
reason is logged and every response names its ``backend``).

The ASR model is its own server process, not a second model beside the pre-ranker: on KServe
every model is its own InferenceService (its own pods, scaling, canary and rollout), and a
transcription holds a core for tens of milliseconds where a pre-ranking request takes one or
two, so sharing a process would put ASR's CPU time on the pre-ranker's tail latency.

Request, ``POST /v2/models/asr/infer``, one input ``audio`` (BYTES, shape ``[1]``) holding a
WAV file (16-bit PCM, mono or stereo, a rate in ``CorpusConfig.rates``, at most
``CorpusConfig.max_seconds``), either

- v2 JSON with the file base64-encoded:
  ``{"inputs": [{"name": "audio", "datatype": "BYTES", "shape": [1], "data": ["UklGR..."]}]}``;
- or the binary tensor extension: header ``Inference-Header-Content-Length: N``, the JSON
  header (``"parameters": {"binary_data_size": M}`` on the input, no ``data``), then ``M``
  bytes: the BYTES tensor (a 4-byte little-endian length, then the file) or the file itself.

The utterance's language, optional: ``"parameters": {"language": "en"}`` on the request (v2 JSON,
or the binary extension's JSON header) or an HTTP ``Content-Language: en`` header (either body
type; the two must agree). A name or code of a language the model knows (``english``, ``en``,
``en-us``, ``mandarin``, ``cmn``, ``zh``: :meth:`models.asr.model.Alphabet.language_of`)
restricts decoding to that language's characters (the space and the blank always allowed)
and, when the model carries that language's character n-gram (``asr_model.lm.json``,
:mod:`models.asr.language_model`), decodes by beam search with it; anything else is a 400
naming the languages the model knows. Without one, the model's language identifier
(``asr_model.language_id.json``, :mod:`models.asr.language_id`, fitted at training on the fp32
model's output) picks the language from the utterance's features and the served forward pass's
output, and decoding goes on as if the request had named it; the response's
``language_detected`` parameter says which of the two happened. A model stored without an
identifier decodes such an utterance unrestricted (every character of the output layer), and the
response's ``language`` parameter is null.

The utterance's known transcript, optional: ``"parameters": {"reference": "..."}`` (a client
that labels its audio, or checks a model on it). The utterance is transcribed all the same; the
reference is normalized as training transcripts are
(:func:`~domains.speech.audio_features.normalize_transcript`) and the response's parameters add
``reference_cer`` (the transcript's character error rate against it), ``unseen_characters``
(how many of its characters the model has no output for: none of its training transcripts held
them) and ``unseen`` (those characters). A character the model never saw is counted, never a
reason to refuse the utterance.

Response outputs: ``transcript`` (BYTES ``[1]``), ``words`` (BYTES ``[W]``), ``word_start_s`` and
``word_end_s`` (FP32 ``[W]``), ``duration_s`` (FP32 ``[1]``); ``parameters`` name the backend
the model digest, the language decoded for and whether it was detected. Errors: 422 not a v2
request, 400 an unknown language / wrong tensor / not a WAV file / empty
audio / a header or data cut short (fewer frames than the header declares) / audio shorter than
``CorpusConfig.min_seconds`` (:data:`~domains.speech.audio_features.MIN_SECONDS`, the corpus's), 413
audio longer than the limit (or a body past :data:`MAX_BODY_BYTES`, counted while it streams),
415 a WAV the model cannot take (sample width, channels, rate, compression) or a Content-Type
other than ``application/json`` (v2 JSON) or ``application/octet-stream`` (the binary
extension). The server's other checks (Host, token, concurrency) are :mod:`serving.guard`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import dataclasses
import json
import logging
import struct
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from kserve import InferRequest, InferResponse, Model
from kserve.errors import InferenceError, InvalidInput, ModelNotReady
from kserve.protocol.infer_type import InferInput, InferOutput

from cascade.config import load_settings
from cascade.tracking_auth import READER, use_tracking_credentials
from domains.speech.audio_features import (
    SAMPLE_RATE,
    CorpusConfig,
    WavError,
    decode_wav,
    log_mel,
    normalize_transcript,
    read_wav_header,
    resample,
)
from models.asr.artifact import AsrArtifact, load_artifact
from models.asr.compiled import (
    INT8_FILE,
    MIN_FRAMES,
    REPORT_FILE,
    CompiledAsr,
    load_compiled,
    model_digest,
)
from models.asr.inference import decode, log_probs_of
from models.asr.language_id import identify_output
from models.asr.metrics import cer
from models.asr.model import Alphabet
from serving.asr_client import AUDIO_INPUT, MODEL_NAME
from serving.v2_codec import (
    INFERENCE_HEADER,
    decode_binary_request,
    decode_v2_json,
    encode_v2_json,
    require_v2,
)

log = logging.getLogger("serving.asr")

MODEL_DIR_ENV = "CASCADE_ASR_MODEL_DIR"
LANGUAGE_PARAMETER = "language"
"""Request parameter naming the utterance's language."""
REFERENCE_PARAMETER = "reference"
"""Request parameter carrying the utterance's known transcript (optional)."""
LANGUAGE_HEADER = "content-language"
"""HTTP header that names it as well (``Content-Language: en``), for a binary request."""
MAX_BODY_BYTES = 16 << 20
"""Largest request body read: 20 s of 48 kHz stereo 16-bit PCM is 3.8 MB, 5.1 MB as base64."""


class AudioRejected(InvalidInput):
    """A request the model cannot transcribe, with the HTTP status that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Audio:
    """A decoded request: 16 kHz mono samples and what the file was."""

    samples: np.ndarray
    seconds: float
    source_rate: int
    channels: int


def too_long(seconds: float, config: CorpusConfig) -> AudioRejected:
    return AudioRejected(
        413,
        f"audio of {seconds:.2f} s is longer than {config.max_seconds:g} s; "
        "split it into shorter utterances",
    )


def decode_request_audio(content: bytes, config: CorpusConfig) -> Audio:
    """Check and decode one WAV file, or AudioRejected with the status of what is wrong.

    The header is read first, so an over-long or unsupported file is refused before its samples
    are decoded; the decoding itself is the corpus job's
    (:func:`~domains.speech.audio_features.decode_wav`,
    :func:`~domains.speech.audio_features.resample`), so serving hears what training heard."""
    if not content:
        raise AudioRejected(400, "empty audio: the 'audio' input holds no bytes")
    if content[:4] != b"RIFF" or content[8:12] != b"WAVE":
        raise AudioRejected(
            400, f"not a WAV file (starts with {content[:12]!r}); send a RIFF/WAVE file"
        )
    try:
        header = read_wav_header(content)
    except WavError as exc:
        if exc.kind == "unsupported":
            # The RIFF header is there, so this is a WAV the decoder refuses: float or
            # compressed samples ("unknown format: 3"), or a broken fmt chunk.
            raise AudioRejected(415, f"unsupported WAV: {exc.detail}; send 16-bit PCM") from None
        if exc.kind == "truncated header":
            raise AudioRejected(400, f"truncated WAV header: {exc.detail}") from None
        if exc.kind == "truncated":
            raise AudioRejected(
                400, f"truncated WAV file: {exc.detail}; send the whole file"
            ) from None
        raise AudioRejected(400, f"unreadable WAV: {exc}") from None
    channels, width, rate = header.channels, header.width, header.rate
    if width != 2:
        raise AudioRejected(415, f"unsupported sample width {8 * width} bits; send 16-bit PCM")
    if channels not in (1, 2):
        raise AudioRejected(415, f"unsupported channel count {channels}; send mono or stereo")
    if rate not in config.rates:
        raise AudioRejected(
            415, f"unsupported sample rate {rate} Hz; send one of {list(config.rates)} Hz"
        )
    if header.frames == 0:
        raise AudioRejected(400, "empty audio: the WAV file holds no samples")
    # A streamed WAV (espeak-ng --stdout, many recorders) declares a placeholder data size: its
    # length is what follows the header (header.frames); any other file holds all it declares.
    if header.frames / rate > config.max_seconds:
        raise too_long(header.frames / rate, config)
    try:
        samples, rate = decode_wav(content)
    except WavError as exc:
        raise AudioRejected(400, f"unreadable WAV: {exc}") from None
    if len(samples) == 0:
        raise AudioRejected(400, "empty audio: the WAV file's data chunk holds no samples")
    audio = resample(samples, rate)
    seconds = len(audio) / SAMPLE_RATE
    if seconds > config.max_seconds:
        raise too_long(seconds, config)
    frames = 1 + (len(audio) - int(0.025 * SAMPLE_RATE)) // (SAMPLE_RATE // 100)
    if seconds < config.min_seconds or frames < MIN_FRAMES:
        raise AudioRejected(
            400,
            f"audio of {seconds * 1000:.0f} ms is too short to transcribe: the shortest "
            f"utterance taken is {config.min_seconds:g} s",
        )
    return Audio(samples=audio, seconds=seconds, source_rate=rate, channels=channels)


def audio_bytes(infer_input: InferInput) -> bytes:
    """The file carried by the ``audio`` tensor: raw bytes (binary extension, with or without
    the BYTES length prefix) or a base64 string (JSON)."""
    if infer_input.datatype != "BYTES":
        raise InvalidInput(
            f"input '{AUDIO_INPUT}' has datatype {infer_input.datatype}; send the WAV file as BYTES"
        )
    if list(infer_input.shape or []) != [1]:
        raise InvalidInput(
            f"input '{AUDIO_INPUT}' has shape {infer_input.shape}; send one file, shape [1]"
        )
    data = infer_input.data
    if not isinstance(data, list) or len(data) != 1:
        raise InvalidInput(f"input '{AUDIO_INPUT}' must carry exactly one element")
    value = data[0]
    if isinstance(value, bytes | bytearray):
        return unwrap_bytes_tensor(bytes(value))
    if not isinstance(value, str):
        raise InvalidInput(f"input '{AUDIO_INPUT}' holds a {type(value).__name__}; send base64")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(
            f"input '{AUDIO_INPUT}' is not valid base64; in JSON the WAV file is sent "
            "base64-encoded (or use the binary tensor extension)"
        ) from None


def unwrap_bytes_tensor(raw: bytes) -> bytes:
    """A one-element BYTES tensor in the binary extension is ``<uint32 LE length><bytes>``;
    a client that sends the file itself (it starts with ``RIFF``) is accepted as well."""
    if len(raw) >= 4 and raw[:4] != b"RIFF":
        (length,) = struct.unpack("<I", raw[:4])
        if length == len(raw) - 4:
            return raw[4:]
    return raw


def request_language(parameters: Any, alphabet: Alphabet) -> str | None:
    """The known language a request names (``parameters["language"]``), ``None`` for none;
    AudioRejected 400 for one the model does not know or a value that is not a string."""
    value = (parameters or {}).get(LANGUAGE_PARAMETER) if isinstance(parameters, Mapping) else None
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise AudioRejected(
            400,
            f"the '{LANGUAGE_PARAMETER}' parameter must be a language name or code, "
            f"not {value!r}; this model knows {', '.join(sorted(alphabet.languages))}",
        )
    try:
        return alphabet.language_of(value)
    except ValueError as exc:
        raise AudioRejected(400, str(exc)) from None


def request_reference(parameters: Any) -> str | None:
    """The known transcript a request carries (``parameters["reference"]``), normalized as the
    training transcripts were; ``None`` for none; AudioRejected 400 for a value that is not a
    string."""
    value = (parameters or {}).get(REFERENCE_PARAMETER) if isinstance(parameters, Mapping) else None
    if value is None:
        return None
    if not isinstance(value, str):
        raise AudioRejected(
            400, f"the '{REFERENCE_PARAMETER}' parameter must be the transcript as a string"
        )
    return normalize_transcript(value)


def reference_report(alphabet: Alphabet, reference: str, transcript: str) -> dict[str, Any]:
    """What a response says of its reference: the transcript's CER against it, and its
    characters the model has no output for (counted, sorted)."""
    unseen = alphabet.unseen(reference)
    return {
        "reference_cer": cer([reference], [transcript]) if reference else None,
        "unseen_characters": sum(unseen.values()),
        "unseen": sorted(unseen),
    }


@dataclass(frozen=True, kw_only=True)
class LoadedAsr:
    """One loaded model version: the file, and the forward pass requests use."""

    artifact: AsrArtifact
    forward: torch.nn.Module | CompiledAsr
    backend: str
    """``int8`` (the compiled package) or ``eager`` (fp32 PyTorch)."""
    digest: str
    version: str | None = None
    """The registry version it came from (None for a folder served directly)."""


GATE_FILE = "compile_gate.json"
"""The compile gate's report in a registered version's folder (``pipelines.asr.compile``)."""


def load_model_dir(
    model_dir: Path, *, prefer_compiled: bool = True, require_gate: bool = False
) -> LoadedAsr:
    """The model in ``model_dir``, on its int8 package when that was built from this file.

    ``require_gate`` (a registered version, whose files matched its signed release): the
    package also needs the version's :data:`GATE_FILE` to say the compile gate passed (its
    digest is in the signature, so the verdict is the signed one)."""
    model_dir = Path(model_dir)
    artifact = load_artifact(model_dir)
    if not artifact.alphabet.fitted:
        log.warning(
            "%s was stored before alphabets were fitted: decoding with the fixed alphabet of "
            "%d characters its file lists (retrain it to fit one from its corpus)",
            model_dir,
            len(artifact.alphabet) - 1,
        )
    digest = model_digest(model_dir)
    reason = "compiled artifacts not wanted"
    if prefer_compiled:
        package, report = model_dir / INT8_FILE, model_dir / REPORT_FILE
        if require_gate and not _gate_passed(model_dir / GATE_FILE):
            reason = f"the version's {GATE_FILE} does not record a passed compile gate"
        elif not package.exists() or not report.exists():
            reason = f"no {INT8_FILE} with {REPORT_FILE} in {model_dir} (cascade asr compile)"
        elif json.loads(report.read_text()).get("model_digest") != digest:
            reason = f"{INT8_FILE} was built from another asr_model.pt; recompile it"
        else:
            try:
                compiled = load_compiled(package, artifact.model.config)
                return LoadedAsr(artifact=artifact, forward=compiled, backend="int8", digest=digest)
            except Exception as exc:  # a package of another torch build, a broken file
                reason = f"{INT8_FILE} did not load: {type(exc).__name__}: {exc}"
    log.warning("serving %s with the eager fp32 model: %s", model_dir, reason)
    return LoadedAsr(artifact=artifact, forward=artifact.model, backend="eager", digest=digest)


def _gate_passed(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("passed") is True
    except (OSError, ValueError, AttributeError):
        return False


class AsrModel(Model):
    """KServe model ``asr`` over one model folder; :meth:`swap` loads another in place."""

    max_body_bytes = MAX_BODY_BYTES
    """Read by :mod:`serving.server`: the byte limit of this model's infer route (413 past it,
    counted while the body streams, :class:`serving.guard.RequestGuard`)."""

    def __init__(
        self,
        model_dir: Path | None,
        *,
        name: str = MODEL_NAME,
        config: CorpusConfig | None = None,
        prefer_compiled: bool = True,
    ) -> None:
        super().__init__(name)
        self.model_dir = None if model_dir is None else Path(model_dir)
        self.config = config or CorpusConfig()
        self.prefer_compiled = prefer_compiled
        self._loaded: LoadedAsr | None = None
        self._lock = threading.Lock()

    def load(self) -> bool:
        """Load the folder given at construction; without one (following the registry) the
        model stays not ready until the first champion is swapped in."""
        if self.model_dir is not None:
            self.swap(self.model_dir)
        return self.ready

    def swap(self, model_dir: Path, version: str | None = None) -> LoadedAsr:
        """Load ``model_dir`` and serve it from the next request on (one reference swap).
        ``version``: a registry version the follower verified against its signed release
        (:mod:`serving.champion`), whose package loads only with a passed compile gate."""
        with self._lock:
            loaded = dataclasses.replace(
                load_model_dir(
                    model_dir,
                    prefer_compiled=self.prefer_compiled,
                    require_gate=version is not None,
                ),
                version=version,
            )
            self._loaded, self.model_dir, self.ready = loaded, Path(model_dir), True
        log.info("serving %s v%s from %s (%s)", self.name, version, model_dir, loaded.backend)
        return loaded

    @property
    def served_version(self) -> str | None:
        return self._loaded.version if self._loaded else None

    @property
    def backend(self) -> str | None:
        return self._loaded.backend if self._loaded else None

    def get_input_types(self) -> list[dict[str, Any]]:
        return [{"name": AUDIO_INPUT, "datatype": "BYTES", "shape": [1]}]

    def get_output_types(self) -> list[dict[str, Any]]:
        return [
            {"name": "transcript", "datatype": "BYTES", "shape": [1]},
            {"name": "words", "datatype": "BYTES", "shape": [-1]},
            {"name": "word_start_s", "datatype": "FP32", "shape": [-1]},
            {"name": "word_end_s", "datatype": "FP32", "shape": [-1]},
            {"name": "duration_s", "datatype": "FP32", "shape": [1]},
        ]

    def transcribe_wav(
        self, loaded: LoadedAsr, content: bytes, language: str | None = None
    ) -> dict[str, Any]:
        """Decode, featurize and transcribe one WAV file with ``loaded`` (restricted to
        ``language``'s characters when given)."""
        audio = decode_request_audio(content, self.config)
        artifact = loaded.artifact
        features = log_mel(audio.samples, artifact.n_mels)
        log_probs = log_probs_of(loaded.forward, features)  # type: ignore[arg-type]
        identifier, detected = artifact.language_identifier, False
        if language is None and identifier is not None:
            language = identify_output(identifier, features, log_probs, artifact.alphabet)
            detected = True
        result = decode(
            log_probs,
            artifact.alphabet,
            loaded.forward.config.subsample,
            language=language,
            language_models=artifact.language_models,
        )
        return {
            "text": result.text,
            "words": result.words(),
            "seconds": audio.seconds,
            "language": language,
            "language_detected": detected,
        }

    async def predict(
        self,
        payload: InferRequest | dict[str, Any],
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        payload = require_v2(payload, self.name)
        loaded = self._loaded
        if loaded is None:
            raise ModelNotReady(self.name, "No ASR model has been loaded yet.")
        inputs = {i.name: i for i in payload.inputs or []}
        if set(inputs) != {AUDIO_INPUT} or len(payload.inputs) != 1:
            raise InvalidInput(
                f"inputs {sorted(inputs)}; the model takes one input '{AUDIO_INPUT}' "
                "(BYTES [1], a WAV file)"
            )
        language = request_language(payload.parameters, loaded.artifact.alphabet)
        reference = request_reference(payload.parameters)
        content = audio_bytes(inputs[AUDIO_INPUT])
        result = await asyncio.to_thread(self.transcribe_wav, loaded, content, language)
        words = result["words"]
        checked = (
            {}
            if reference is None
            else reference_report(loaded.artifact.alphabet, reference, result["text"])
        )
        return InferResponse(
            response_id=payload.id or uuid.uuid4().hex,
            model_name=self.name,
            infer_outputs=[
                InferOutput(name="transcript", shape=[1], datatype="BYTES", data=[result["text"]]),
                InferOutput(
                    name="words",
                    shape=[len(words)],
                    datatype="BYTES",
                    data=[w["word"] for w in words],
                ),
                InferOutput(
                    name="word_start_s",
                    shape=[len(words)],
                    datatype="FP32",
                    data=[float(w["start_s"]) for w in words],
                ),
                InferOutput(
                    name="word_end_s",
                    shape=[len(words)],
                    datatype="FP32",
                    data=[float(w["end_s"]) for w in words],
                ),
                InferOutput(
                    name="duration_s", shape=[1], datatype="FP32", data=[float(result["seconds"])]
                ),
            ],
            parameters={
                "backend": loaded.backend,
                "model_digest": loaded.digest[:16],
                "model_version": loaded.version,
                "language": result["language"],
                "language_detected": result["language_detected"],
                **checked,
            },
        )

    async def infer_http(self, body: bytes, headers: Mapping[str, str]) -> bytes:
        """``POST /v2/models/asr/infer``: v2 JSON or the binary tensor extension in, v2 JSON
        out (through ``Model.__call__``, so KServe's metrics and pre/postprocess apply)."""
        json_length = headers.get(INFERENCE_HEADER)
        if json_length is None:
            request = decode_v2_json(body, self.name)
        else:
            request = decode_binary_request(body, json_length, self.name)
        header = headers.get(LANGUAGE_HEADER)
        if header is not None:
            parameters = dict(request.parameters or {})
            given = parameters.get(LANGUAGE_PARAMETER)
            if given is not None and str(given).strip().lower() != header.strip().lower():
                raise AudioRejected(
                    400,
                    f"the request's language parameter {given!r} and its {LANGUAGE_HEADER} "
                    f"header {header!r} disagree; send one",
                )
            parameters[LANGUAGE_PARAMETER] = header
            request.parameters = parameters
        response, _ = await self(request)
        if not isinstance(response, InferResponse):
            raise InferenceError(f"predict returned {type(response).__name__}, not InferResponse")
        return encode_v2_json(response)


def main(argv: list[str] | None = None) -> None:
    from serving.server import serve, set_torch_threads, workers_from_env

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=load_settings().serving.asr_model_dir,
        help=f"folder with asr_model.pt (default ${MODEL_DIR_ENV}); without one, serve the "
        f"MLflow registry's '{MODEL_NAME}@champion' and follow it as it moves",
    )
    parser.add_argument("--eager", action="store_true", help="ignore compiled packages")
    parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between registry checks")
    args = parser.parse_args(argv)
    if args.model_dir is not None and not (Path(args.model_dir) / "asr_model.pt").is_file():
        parser.error(f"no asr_model.pt in {args.model_dir}")
    set_torch_threads()
    settings = load_settings()
    use_tracking_credentials(settings, READER)  # a server reads the registry, never writes it

    def models() -> list[Model]:
        model = AsrModel(args.model_dir, prefer_compiled=not args.eager)
        model.load()
        if args.model_dir is None:
            from serving.champion import ChampionFollower

            follower = ChampionFollower(
                settings,
                MODEL_NAME,
                lambda folder, version: model.swap(folder, version),
                cache=settings.home / "serving" / MODEL_NAME,
                poll_s=args.poll_s,
            )
            follower.start()
        return [model]

    serve(models, settings, workers=workers_from_env(), port=settings.ports.asr_serving)


if __name__ == "__main__":
    main()
