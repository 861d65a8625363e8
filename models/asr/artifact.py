"""The trained ASR model on disk: ``asr_model.pt`` (weights and config) and beside it
``asr_model.vocabulary.json`` (its output alphabet, plain JSON).

Training writes both, evaluation, the compiler passes, serving and the benchmark read them. The
``.pt`` file is a ``torch.save`` of a plain dict (loadable with ``weights_only=True``):

- ``config``: :class:`~models.asr.model.ConvDFSMNConfig` fields;
- ``vocabulary``: ``{"file": NAME, "sha256": DIGEST}``, the vocabulary file beside it and the
  digest of its bytes (a load refuses another file; the ``.pt`` digest, which ties compiled
  packages and served responses to a model, so covers its alphabet too);
- ``n_mels``: features the model expects (log-mel, 25 ms windows every 10 ms at 16 kHz);
- ``state_dict``: fp32 weights;
- ``quantization``: ``None`` for a float model, else what range-scaled int8 inference needs
  (``bits`` and per-layer ``activation_ranges``, module name -> clipping range of its input);
- ``meta``: free-form facts (training config name, data fingerprint, metrics, MLflow run id);
- ``language_model`` (optional): ``{"file": NAME, "sha256": DIGEST}``, the character n-grams
  decoding uses for a known language (:mod:`models.asr.language_model`), beside it as
  ``asr_model.lm.json``; tied to the model file as the vocabulary is.
- ``language_identifier`` (optional): ``{"file": NAME, "sha256": DIGEST}``, the language
  identifier (:mod:`models.asr.language_id`) that picks the language of an utterance given
  without one, beside it as ``asr_model.language_id.json`` (JSON numbers); tied the same way,
  and its inputs must be those the model's vectors have.

The vocabulary file (:meth:`~models.asr.model.Alphabet.to_json`) holds the characters fitted
from the training transcripts (id ``i + 1`` for ``characters[i]``, 0 is the CTC blank), each
language's characters (decoding for one language emits only those, the space and the blank),
the name of the transcript normalization and each character's count in training.

Models stored before alphabets were fitted carry no vocabulary file: their ``.pt`` holds the
fixed alphabet they were trained with as a plain list (``alphabet``, with ``languages`` or
without: then the characters' scripts give them, :func:`~models.asr.model.script_languages`).
Such a model loads with that alphabet, its ``normalization`` is ``None``
(:attr:`~models.asr.model.Alphabet.fitted` is False), and serving and evaluation say so.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from models.asr.language_id import (
    LanguageIdentifier,
    dump_language_identifier,
    expected_inputs,
    parse_language_identifier,
)
from models.asr.language_model import LanguageModels, dump_language_models, parse_language_models
from models.asr.model import Alphabet, ConvDFSMN, ConvDFSMNConfig
from models.asr.stored_json import parse_stored_json

FILENAME = "asr_model.pt"
VOCABULARY_SUFFIX = ".vocabulary.json"
LANGUAGE_MODEL_SUFFIX = ".lm.json"
LANGUAGE_ID_SUFFIX = ".language_id.json"


@dataclass
class AsrArtifact:
    model: ConvDFSMN
    alphabet: Alphabet
    n_mels: int
    quantization: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    language_models: LanguageModels | None = None
    """Character n-grams per language for decoding a known language; None: greedy only."""
    language_identifier: LanguageIdentifier | None = None
    """Picks an utterance's language when none is given; None: such an utterance is decoded
    unrestricted."""


def artifact_file(path: Path) -> Path:
    """``path`` itself when it is a file, else ``path / asr_model.pt``."""
    path = Path(path)
    return path if path.suffix == ".pt" else path / FILENAME


def vocabulary_file(path: Path) -> Path:
    """The vocabulary file of the model file ``path`` (``asr_model.pt`` ->
    ``asr_model.vocabulary.json`` beside it)."""
    target = artifact_file(path)
    return target.with_name(target.stem + VOCABULARY_SUFFIX)


def language_model_file(path: Path) -> Path:
    """The language-model file of the model file ``path`` (``asr_model.lm.json``)."""
    target = artifact_file(path)
    return target.with_name(target.stem + LANGUAGE_MODEL_SUFFIX)


def language_identifier_file(path: Path) -> Path:
    """The language-identifier file of the model file ``path`` (``asr_model.language_id.json``)."""
    target = artifact_file(path)
    return target.with_name(target.stem + LANGUAGE_ID_SUFFIX)


def artifact_files(path: Path) -> list[Path]:
    """The files one stored model is made of (what a copy of it must take): the ``.pt`` and,
    for a model with a fitted alphabet, its vocabulary file, and its language models and
    language identifier when it has them."""
    target = artifact_file(path)
    beside = (
        vocabulary_file(target),
        language_model_file(target),
        language_identifier_file(target),
    )
    return [target, *(p for p in beside if p.is_file())]


def _atomic_write(target: Path, write: Any) -> None:
    tmp = target.with_name(target.name + ".tmp")
    write(tmp)
    tmp.replace(target)


def _write_beside(path: Path, data: bytes) -> dict[str, str]:
    """Write ``data`` to ``path`` and return the entry the model file keeps for it."""
    _atomic_write(path, lambda tmp: tmp.write_bytes(data))
    return {"file": path.name, "sha256": hashlib.sha256(data).hexdigest()}


def save_artifact(path: Path, artifact: AsrArtifact) -> Path:
    """Write the model file and its vocabulary file (the vocabulary first: a model file is
    never there without the vocabulary it names)."""
    target = artifact_file(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(artifact.alphabet.to_json(), ensure_ascii=False, indent=1) + "\n"
    vocabulary = _write_beside(vocabulary_file(target), text.encode("utf-8"))
    optional = {
        "language_model": (
            language_model_file(target),
            None
            if artifact.language_models is None
            else dump_language_models(artifact.language_models),
        ),
        "language_identifier": (
            language_identifier_file(target),
            None
            if artifact.language_identifier is None
            else dump_language_identifier(artifact.language_identifier),
        ),
    }
    beside = {
        key: _write_beside(file, data) for key, (file, data) in optional.items() if data is not None
    }
    state = {k: v.detach().cpu().clone() for k, v in artifact.model.state_dict().items()}
    payload = {
        "config": artifact.model.config.to_dict(),
        "vocabulary": vocabulary,
        "n_mels": int(artifact.n_mels),
        "state_dict": state,
        "quantization": artifact.quantization,
        "meta": dict(artifact.meta),
        **beside,
    }
    _atomic_write(target, lambda tmp: torch.save(payload, tmp))
    for key, (file, _) in optional.items():
        if key not in beside:  # a model saved without one keeps no stale file
            file.unlink(missing_ok=True)
    return target


def _referenced(
    target: Path, reference: Any, key: str, holds: str, what: str
) -> tuple[Path, bytes]:
    """The path and bytes of the file beside ``target`` that its ``key`` entry names, checked
    against the sha256 the entry records."""
    if not isinstance(reference, dict) or not isinstance(reference.get("file"), str):
        raise ValueError(f"{target}: its '{key}' entry must name a file and its sha256")
    path = target.with_name(Path(reference["file"]).name)
    if not path.is_file():
        raise FileNotFoundError(
            f"{target} keeps its {holds} in {path.name}, which is missing; copy that file "
            "with the model (training writes and logs them together)"
        )
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != reference.get("sha256"):
        raise ValueError(
            f"{path} is not the {what} {target.name} was saved with (its sha256 differs); "
            "restore the file saved with the model"
        )
    return path, data


def _stored_language_models(target: Path, payload: dict[str, Any]) -> LanguageModels | None:
    reference = payload.get("language_model")
    if reference is None:
        return None
    path, data = _referenced(
        target, reference, "language_model", "language models", "language model"
    )
    return parse_language_models(data, where=str(path))


def _stored_language_identifier(
    target: Path, payload: dict[str, Any], alphabet: Alphabet
) -> LanguageIdentifier | None:
    reference = payload.get("language_identifier")
    if reference is None:
        return None
    path, data = _referenced(
        target, reference, "language_identifier", "language identifier", "language identifier"
    )
    identifier = parse_language_identifier(data, where=str(path))
    inputs = expected_inputs(int(payload["n_mels"]), alphabet if identifier.uses_model else None)
    unknown = sorted(set(identifier.languages) - set(alphabet.languages))
    if len(identifier.mean) != inputs or unknown:
        raise ValueError(
            f"{path} does not fit {target.name}: it takes {len(identifier.mean)} inputs "
            f"(the model's vectors have {inputs})"
            + (f" and names languages the alphabet lacks ({', '.join(unknown)})" if unknown else "")
            + "; restore the file saved with the model"
        )
    return identifier


def _stored_alphabet(target: Path, payload: dict[str, Any]) -> Alphabet:
    """The model's alphabet: from the vocabulary file its ``.pt`` names, or for a model stored
    before alphabets were fitted, the fixed alphabet listed in the ``.pt`` itself."""
    reference = payload.get("vocabulary")
    if reference is None:
        return Alphabet(payload["alphabet"], payload.get("languages"))
    path, data = _referenced(target, reference, "vocabulary", "alphabet", "vocabulary")
    return Alphabet.from_json(parse_stored_json(data, where=str(path)), where=str(path))


def load_artifact(path: Path) -> AsrArtifact:
    """The model in eval mode; a clear error for a missing or foreign file."""
    target = artifact_file(path)
    if not target.is_file():
        raise FileNotFoundError(f"no ASR model at {target}")
    payload = torch.load(target, map_location="cpu", weights_only=True)
    missing = {"config", "n_mels", "state_dict"} - set(payload)
    if "vocabulary" not in payload and "alphabet" not in payload:
        missing.add("vocabulary")
    if missing:
        raise ValueError(f"{target} is not an ASR model file (missing {sorted(missing)})")
    model = ConvDFSMN(ConvDFSMNConfig(**payload["config"]))
    model.load_state_dict(payload["state_dict"])
    model.eval()
    alphabet = _stored_alphabet(target, payload)
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
        language_models=_stored_language_models(target, payload),
        language_identifier=_stored_language_identifier(target, payload, alphabet),
    )
