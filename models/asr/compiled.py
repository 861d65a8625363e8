"""The compiled ASR model as serving, the compile gate and the benchmarks run it: the files a
compile writes beside an ``asr_model.pt``, the frame range one export covers, the digest that
ties the files to the weights, and the runners (AOTInductor package or ONNX Runtime) that
:func:`models.asr.inference.transcribe` accepts in place of the model. Building the files is
:mod:`compilers.asr`'s job; running them needs only this module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cascade.compiled_packages import load_package
from domains.speech.audio_features import MIN_SECONDS, SAMPLE_RATE, CorpusConfig
from models.asr.artifact import artifact_file
from models.asr.model import ConvDFSMNConfig

FP32_FILE = "asr_fp32.pt2"
INT8_FILE = "asr_int8.pt2"
ONNX_FILE = "asr.onnx"
REPORT_FILE = "asr_compiled.json"

HOP = SAMPLE_RATE // 100
"""Feature hop in samples (10 ms), as :func:`domains.speech.audio_features.log_mel` computes
them."""
WINDOW = int(0.025 * SAMPLE_RATE)


def frames_for_seconds(seconds: float) -> int:
    """Feature frames :func:`~domains.speech.audio_features.log_mel` makes of ``seconds`` of
    audio."""
    samples = max(int(round(seconds * SAMPLE_RATE)), WINDOW)
    return 1 + (samples - WINDOW) // HOP


MIN_FRAMES = 8
"""Shortest input the export admits: below 3 frames the stride-2 front end yields one output
frame, which export specializes on; 8 frames (80 ms) keeps the symbolic reasoning simple. It lies
below :data:`MIN_AUDIO_FRAMES`, so every utterance the server takes fits the package."""
MIN_AUDIO_FRAMES = frames_for_seconds(MIN_SECONDS)
"""Feature frames of the shortest utterance the corpus keeps and the server takes
(:data:`domains.speech.audio_features.MIN_SECONDS`, 0.3 s: 28 frames)."""
MAX_FRAMES = frames_for_seconds(CorpusConfig().max_seconds) + 2
"""Longest input: the corpus (and serving) limit of audio, a little headroom for rounding."""


def model_digest(path: Path) -> str:
    """sha256 of an ``asr_model.pt``: ties compiled artifacts to the weights they came from."""
    digest = hashlib.sha256()
    with open(artifact_file(path), "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class CompiledAsr:
    """A compiled ASR forward pass that :func:`models.asr.inference.transcribe` accepts in place
    of the model: ``features [1, T, n_mels] -> log-probs [1, T', V]`` plus ``config``.

    ``T`` must lie in ``[MIN_FRAMES, MAX_FRAMES]``: padding a shorter input would change its
    last outputs (the model looks ahead), so it is refused rather than silently different;
    serving never sends one (it rejects audio under ``CorpusConfig.min_seconds``)."""

    def __init__(self, run: Callable[[torch.Tensor], Any], config: ConvDFSMNConfig, kind: str):
        self._run = run
        self.config = config
        self.kind = kind

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        frames = features.shape[1]
        if not MIN_FRAMES <= frames <= MAX_FRAMES:
            raise ValueError(
                f"{frames} feature frames is outside the compiled range [{MIN_FRAMES}, "
                f"{MAX_FRAMES}] (up to {CorpusConfig().max_seconds:g} s of audio)"
            )
        return torch.as_tensor(self._run(features.float()))


def load_compiled(path: Path, config: ConvDFSMNConfig) -> CompiledAsr:
    """An AOTInductor ``.pt2`` from :func:`compilers.asr.compile_asr` (runs without model code)."""
    package = load_package(path)
    return CompiledAsr(lambda x: package(x), config, Path(path).stem)


def onnxruntime_asr(path: Path, config: ConvDFSMNConfig, *, threads: int = 1) -> CompiledAsr:
    """An ONNX Runtime session (CPU, ``threads`` intra-op threads) over :data:`ONNX_FILE`."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {name: x.contiguous().numpy()})[0])

    return CompiledAsr(run, config, "onnxruntime")
