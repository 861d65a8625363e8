"""The registered ASR model as an MLflow pyfunc "from code", for loading the standard way.

A registered ``asr`` version is the run's ``int8`` folder (``asr_model.pt`` and its compiled
package); the register step adds ``MLmodel``, the code file :mod:`models.asr.mlflow_model`, the
signature and an input example there (:func:`save_pyfunc`) before it records the folder's
digests. ``mlflow.pyfunc.load_model("models:/asr/N")`` then runs the code file from the
downloaded folder and :class:`AsrPyfunc` reads ``asr_model.pt`` beside it with
``torch.load(weights_only=True)`` and its alphabet from ``asr_model.vocabulary.json`` (JSON):
nothing is unpickled. It needs this repository's
``models.asr`` importable where it is loaded. The pipeline and the server do not load it this
way: they check the digests and read the files themselves.

Input: a frame with column ``audio``, a 16-bit PCM WAV file (any rate the corpus takes),
base64-encoded. Output: a frame with ``transcript`` (greedy CTC decoding of the int8 model the
registry scores, fake-quantized with its RSQ record) and ``duration_s``.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from mlflow.pyfunc.model import PythonModel, PythonModelContext

from domains.speech.audio_features import SAMPLE_RATE, decode_wav, encode_wav, log_mel, resample
from models.asr.artifact import AsrArtifact, load_artifact
from models.asr.inference import transcribe
from models.asr.model import ConvDFSMN

CODE_FILE = Path(__file__).with_name("mlflow_model.py")
AUDIO_COLUMN = "audio"


class AsrPyfunc(PythonModel):
    """The ASR model in ``folder`` (the registered version's files): base64 WAV in, text out."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.artifact: AsrArtifact | None = None
        self.network: ConvDFSMN | None = None

    def load_context(self, context: PythonModelContext) -> None:
        from models.asr.evaluate import int8_model

        self.artifact = load_artifact(self.folder)
        self.network = int8_model(self.artifact) if self.artifact.quantization else None

    def predict(
        self,
        context: PythonModelContext,
        model_input: pd.DataFrame,
        params: dict[str, Any] | None = None,
    ) -> pd.DataFrame:
        if self.artifact is None:
            raise RuntimeError("AsrPyfunc.predict before load_context; load it via mlflow")
        if AUDIO_COLUMN not in model_input.columns:
            raise ValueError(
                f"ASR input needs column {AUDIO_COLUMN!r} (a base64 16-bit PCM WAV file); "
                f"got {list(model_input.columns)}"
            )
        network = self.network or self.artifact.model
        texts, seconds = [], []
        for row, value in enumerate(model_input[AUDIO_COLUMN]):
            try:
                content = value if isinstance(value, bytes) else base64.b64decode(str(value))
                samples, rate = decode_wav(content)
            except ValueError as exc:
                raise ValueError(f"row {row}: not a 16-bit PCM WAV file: {exc}") from None
            audio = resample(samples, rate)
            features = log_mel(audio, self.artifact.n_mels)
            texts.append(transcribe(network, self.artifact.alphabet, features).text)
            seconds.append(len(audio) / SAMPLE_RATE)
        return pd.DataFrame({"transcript": texts, "duration_s": seconds})


def example_wav(seconds: float = 0.5) -> bytes:
    """A short deterministic 16 kHz mono WAV (two tones): the logged input example."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    signal = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 660 * t)
    return encode_wav(signal, SAMPLE_RATE)


def example_frame() -> pd.DataFrame:
    return pd.DataFrame({AUDIO_COLUMN: [base64.b64encode(example_wav()).decode("ascii")]})


def save_pyfunc(path: Path) -> None:
    """Write the pyfunc's files (``MLmodel``, the code file, signature, input example,
    environment) into the new folder ``path``; they go beside ``asr_model.pt``."""
    import mlflow.pyfunc
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    signature = ModelSignature(
        inputs=Schema([ColSpec("string", AUDIO_COLUMN)]),
        outputs=Schema([ColSpec("string", "transcript"), ColSpec("double", "duration_s")]),
    )
    mlflow.pyfunc.save_model(
        str(path),
        python_model=str(CODE_FILE),
        signature=signature,
        input_example=example_frame(),
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "pandas", "numpy"],
    )
