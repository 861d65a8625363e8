"""A tiny ASR model, saved and compiled once per session for the compiler and serving tests."""

from __future__ import annotations

from pathlib import Path

import torch

from compilers.asr import asr_example, calibrate_activation_ranges, compile_asr
from domains.speech.audio_features import NORMALIZATION
from models.asr.artifact import AsrArtifact, save_artifact
from models.asr.model import Alphabet, ConvDFSMN, ConvDFSMNConfig

ENGLISH = "abcdefghijklmnopqrstuvwxyz'"
MANDARIN = "你好天气"
ALPHABET = Alphabet(
    ENGLISH + MANDARIN + " ",
    {"english": ENGLISH, "mandarin": MANDARIN},
    normalization=NORMALIZATION,
)
"""Two languages, as the real alphabet: decoding restricted to one has something to leave out."""
TINY = ConvDFSMNConfig(
    n_mels=40,
    vocab_size=len(ALPHABET),
    conv_channels=16,
    hidden=24,
    memory=16,
    blocks=2,
    left=4,
    right=1,
    cmvn=True,
)
"""With per-utterance CMVN inside the network, as the trained configs have it: the packages,
ONNX and the server built from it must normalize as the eager model does."""


def tiny_artifact(*, quantized: bool) -> AsrArtifact:
    """Random weights, non-trivial BatchNorm statistics; with ``quantized`` the activation
    ranges a quantization-aware training would store (calibrated here on random features)."""
    torch.manual_seed(0)
    model = ConvDFSMN(TINY).eval()
    for norm in (model.front[1], model.front[4]):
        norm.running_mean.uniform_(-0.5, 0.5)
        norm.running_var.uniform_(0.5, 2.0)
    quantization = None
    if quantized:
        batches = [asr_example(TINY.n_mels, n, seed=n)[0] for n in (50, 300)]
        quantization = {"bits": 8, "activation_ranges": calibrate_activation_ranges(model, batches)}
    return AsrArtifact(
        model=model, alphabet=ALPHABET, n_mels=TINY.n_mels, quantization=quantization
    )


def build_compiled_asr(directory: Path) -> Path:
    """``directory`` with the quantized tiny model, its fp32/int8 packages and ONNX file."""
    save_artifact(directory, tiny_artifact(quantized=True))
    compile_asr(directory, cache_dir=directory / "cache", fast_build=True)
    return directory
