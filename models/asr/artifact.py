"""The trained ASR model on disk: one ``asr_model.pt`` holding everything needed to transcribe.

Training writes it, evaluation, the compiler passes, serving and the benchmark read it. The file is
a ``torch.save`` of a plain dict (loadable with ``weights_only=True``):

- ``config``: :class:`~models.asr.model.ConvDFSMNConfig` fields;
- ``alphabet``: the output characters, id ``i + 1`` for ``alphabet[i]`` (0 is the CTC blank);
- ``languages``: language name -> its characters (decoding for one language emits only those,
  the space and the blank); a file without it gets them from the characters' scripts
  (:func:`~models.asr.model.script_languages`);
- ``n_mels``: features the model expects (log-mel, 25 ms windows every 10 ms at 16 kHz);
- ``state_dict``: fp32 weights;
- ``quantization``: ``None`` for a float model, else what range-scaled int8 inference needs
  (``bits`` and per-layer ``activation_ranges``, module name -> clipping range of its input);
- ``meta``: free-form facts (training config name, data fingerprint, metrics, MLflow run id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from models.asr.model import Alphabet, ConvDFSMN, ConvDFSMNConfig

FILENAME = "asr_model.pt"


@dataclass
class AsrArtifact:
    model: ConvDFSMN
    alphabet: Alphabet
    n_mels: int
    quantization: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def artifact_file(path: Path) -> Path:
    """``path`` itself when it is a file, else ``path / asr_model.pt``."""
    path = Path(path)
    return path if path.suffix == ".pt" else path / FILENAME


def save_artifact(path: Path, artifact: AsrArtifact) -> Path:
    target = artifact_file(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().clone() for k, v in artifact.model.state_dict().items()}
    payload = {
        "config": artifact.model.config.to_dict(),
        "alphabet": list(artifact.alphabet.characters),
        "languages": {k: list(v) for k, v in artifact.alphabet.languages.items()},
        "n_mels": int(artifact.n_mels),
        "state_dict": state,
        "quantization": artifact.quantization,
        "meta": dict(artifact.meta),
    }
    tmp = target.with_suffix(".tmp")
    torch.save(payload, tmp)
    tmp.replace(target)
    return target


def load_artifact(path: Path) -> AsrArtifact:
    """The model in eval mode; a clear error for a missing or foreign file."""
    target = artifact_file(path)
    if not target.is_file():
        raise FileNotFoundError(f"no ASR model at {target}")
    payload = torch.load(target, map_location="cpu", weights_only=True)
    missing = {"config", "alphabet", "n_mels", "state_dict"} - set(payload)
    if missing:
        raise ValueError(f"{target} is not an ASR model file (missing {sorted(missing)})")
    model = ConvDFSMN(ConvDFSMNConfig(**payload["config"]))
    model.load_state_dict(payload["state_dict"])
    model.eval()
    alphabet = Alphabet(payload["alphabet"], payload.get("languages"))
    if len(alphabet) != model.config.vocab_size:
        raise ValueError(
            f"{target}: alphabet of {len(alphabet)} ids but the model outputs "
            f"{model.config.vocab_size}"
        )
    return AsrArtifact(
        model=model,
        alphabet=alphabet,
        n_mels=int(payload["n_mels"]),
        quantization=payload.get("quantization"),
        meta=dict(payload.get("meta") or {}),
    )
