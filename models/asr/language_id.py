"""Which language an utterance is in, so that decoding needs no label: a small classifier on
features pooled over the utterance.

Each utterance becomes one vector (:func:`utterance_vector`): the mean and standard deviation of
its log-mel features over time, and, from the ASR model's output on the same features, the share
of the non-blank posterior mass on each language's characters and the mean posterior of every
output token over the frames where the model emits something (a character unigram profile: the
strongest cue between languages written in one script). A multinomial logistic regression
(:func:`fit_language_identifier`: standardized inputs, L2 penalty, classes weighted to balance
the languages) maps it to a language group
(:func:`~domains.speech.audio_features.language_group`). :func:`train_language_identifier` fits
one on a corpus's training split with a trained model; :func:`identify` is one utterance's
language. The identifier is stored as JSON (:meth:`LanguageIdentifier.to_json`), like the
model's alphabet: numbers, never a pickle.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from domains.speech.audio_features import language_group
from models.asr.corpus import Utterances, source_of
from models.asr.inference import log_probs_of
from models.asr.model import BLANK, Alphabet, ConvDFSMN
from models.asr.stored_json import parse_stored_json

LANGUAGE_ID_FORMAT = "cascade.asr.language_id/1"
MAX_LANGUAGES = 64
MAX_INPUTS = 65_536
MAX_FILE_BYTES = 64 * 1024 * 1024
EMITTING = 0.5
"""A frame counts as emitting when its blank posterior is below this."""


def utterance_vector(
    features: np.ndarray | torch.Tensor,
    log_probs: torch.Tensor | None = None,
    alphabet: Alphabet | None = None,
) -> np.ndarray:
    """The pooled vector of one utterance (see the module docstring); without ``log_probs``
    only the log-mel statistics."""
    x = torch.as_tensor(features, dtype=torch.float64)
    parts = [x.mean(0), x.std(0, correction=0)]
    if log_probs is not None:
        if alphabet is None:
            raise ValueError("utterance_vector: log_probs need the alphabet they are over")
        posterior = log_probs.detach().to(torch.float64).exp()
        emitting = posterior[posterior[:, BLANK] < EMITTING]
        if len(emitting) == 0:  # nothing emitted: the whole utterance, blank included
            emitting = posterior
        profile = emitting.mean(0)
        characters = profile.clone()
        characters[BLANK] = 0.0
        space = alphabet.encode_known(" ")
        characters[space] = 0.0
        total = float(characters.sum()) or 1.0
        shares = []
        for language in sorted(alphabet.languages):
            ids = alphabet.encode_known("".join(alphabet.languages[language]))
            shares.append(float(characters[ids].sum()) / total)
        parts += [profile, torch.tensor(shares, dtype=torch.float64)]
    return torch.cat(parts).numpy()


@dataclass
class LanguageIdentifier:
    """Standardize, then ``softmax(weight @ x + bias)`` over ``languages``."""

    languages: list[str]
    mean: np.ndarray
    scale: np.ndarray
    weight: np.ndarray
    """``[languages, inputs]``."""
    bias: np.ndarray
    uses_model: bool
    """Whether the vectors hold the ASR model's output (then the same model must make them)."""

    def probabilities(self, vectors: np.ndarray) -> np.ndarray:
        """``[N, languages]`` of ``[N, inputs]`` vectors."""
        vectors = np.atleast_2d(vectors)
        if vectors.shape[1] != len(self.mean):
            raise ValueError(
                f"the language identifier takes {len(self.mean)} inputs, got {vectors.shape[1]}: "
                "make the vectors with the model (and alphabet) it was trained with"
            )
        logits = ((vectors - self.mean) / self.scale) @ self.weight.T + self.bias
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        return exp / exp.sum(axis=1, keepdims=True)

    def predict(self, vectors: np.ndarray) -> list[str]:
        return [self.languages[i] for i in self.probabilities(vectors).argmax(axis=1)]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": LANGUAGE_ID_FORMAT,
            "languages": self.languages,
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "weight": self.weight.tolist(),
            "bias": self.bias.tolist(),
            "uses_model": self.uses_model,
        }

    @classmethod
    def from_json(cls, payload: Any, *, where: str = "language identifier") -> LanguageIdentifier:
        """The identifier of a stored payload; ValueError naming ``where`` and what is wrong
        (every field is checked: its type, its size and that its numbers are finite)."""

        def bad(what: str) -> ValueError:
            return ValueError(f"{where}: {what}; train the model again to write it")

        if not isinstance(payload, dict) or payload.get("format") != LANGUAGE_ID_FORMAT:
            found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
            raise bad(f"not a {LANGUAGE_ID_FORMAT} file (format {found!r})")
        languages = payload.get("languages")
        if (
            not isinstance(languages, list)
            or not 0 < len(languages) <= MAX_LANGUAGES
            or not all(isinstance(v, str) and 0 < len(v) <= 64 for v in languages)
            or len(set(languages)) != len(languages)
        ):
            raise bad(f"languages must be 1-{MAX_LANGUAGES} distinct names of 1-64 characters")
        uses_model = payload.get("uses_model")
        if not isinstance(uses_model, bool):
            raise bad("uses_model must be true or false")

        def numbers(key: str, shape: tuple[int, ...]) -> np.ndarray:
            value = payload.get(key)
            try:
                array = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError):
                raise bad(f"{key} must be numbers") from None
            if array.shape != shape or not np.isfinite(array).all():
                raise bad(f"{key} must be {list(shape)} finite numbers")
            return array

        mean = payload.get("mean")
        if not isinstance(mean, list) or not 0 < len(mean) <= MAX_INPUTS:
            raise bad(f"mean must list 1-{MAX_INPUTS} numbers, one an input")
        inputs = len(mean)
        identifier = cls(
            languages=list(languages),
            mean=numbers("mean", (inputs,)),
            scale=numbers("scale", (inputs,)),
            weight=numbers("weight", (len(languages), inputs)),
            bias=numbers("bias", (len(languages),)),
            uses_model=uses_model,
        )
        if not (identifier.scale > 0).all():
            raise bad("scale must be positive")
        return identifier


def expected_inputs(n_mels: int, alphabet: Alphabet | None) -> int:
    """The length of :func:`utterance_vector` for ``n_mels`` features, with a model's output
    over ``alphabet`` (None: the log-mel statistics only)."""
    statistics = 2 * n_mels
    return statistics if alphabet is None else statistics + len(alphabet) + len(alphabet.languages)


def dump_language_identifier(identifier: LanguageIdentifier) -> bytes:
    """The bytes of ``identifier``'s file (the model file keeps their digest)."""
    return (json.dumps(identifier.to_json(), separators=(",", ":")) + "\n").encode()


def parse_language_identifier(data: bytes, *, where: str) -> LanguageIdentifier:
    """An identifier file's :class:`LanguageIdentifier` (JSON numbers, never a pickle)."""
    payload = parse_stored_json(data, where=where, max_bytes=MAX_FILE_BYTES)
    return LanguageIdentifier.from_json(payload, where=where)


def fit_language_identifier(
    vectors: np.ndarray,
    languages: Sequence[str],
    *,
    l2: float = 1e-2,
    uses_model: bool = False,
) -> LanguageIdentifier:
    """Logistic regression of ``languages`` (grouped, :func:`language_group`) on ``vectors``
    ``[N, inputs]``: scikit-learn's L-BFGS on the class-balanced cross-entropy with an L2
    penalty of strength ``l2`` on the standardized inputs. One language only: it is always the
    answer."""
    from sklearn.linear_model import LogisticRegression

    vectors = np.asarray(vectors, dtype=np.float64)
    if vectors.ndim != 2 or len(vectors) == 0 or len(vectors) != len(languages):
        raise ValueError(
            f"fit_language_identifier needs one vector per language label, got {vectors.shape} "
            f"vectors and {len(languages)} labels"
        )
    groups = [language_group(lang) for lang in languages]
    names = sorted(set(groups))
    mean = vectors.mean(axis=0)
    scale = vectors.std(axis=0)
    scale[scale < 1e-8] = 1.0
    weight = np.zeros((len(names), vectors.shape[1]))
    bias = np.zeros(len(names))
    if len(names) > 1:
        fitted = LogisticRegression(
            C=1.0 / (l2 * len(vectors)), class_weight="balanced", max_iter=500
        ).fit((vectors - mean) / scale, [names.index(g) for g in groups])
        if len(names) == 2:  # one row: the second class's logit against a zero for the first
            weight[1], bias[1] = fitted.coef_[0], fitted.intercept_[0]
        else:
            weight, bias = fitted.coef_.copy(), fitted.intercept_.copy()
    return LanguageIdentifier(
        languages=names, mean=mean, scale=scale, weight=weight, bias=bias, uses_model=uses_model
    )


def model_vector(
    model: ConvDFSMN | None, alphabet: Alphabet | None, features: np.ndarray | torch.Tensor
) -> np.ndarray:
    """:func:`utterance_vector` of ``features`` with ``model``'s output (None: features only)."""
    if model is None:
        return utterance_vector(features)
    return utterance_vector(features, log_probs_of(model, features), alphabet)


def identifier_draw(data: Utterances, *, per_language: int | None, seed: int) -> list[int]:
    """Indices of at most ``per_language`` utterances of each language group of ``data``
    (``None``: all), drawn with ``seed``. Within a language the draw is split evenly between
    recordings of people and synthetic voices, each taking what the other leaves: drawn in
    proportion, a language whose people are a small part of its utterances would be heard from
    people hardly at all, and the identifier would take a recording of a person as a cue for
    the languages that are mostly people's."""
    rng = np.random.default_rng(seed)
    picked: list[int] = []
    groups = np.array([language_group(lang) for lang in data.languages])
    sources = np.array([source_of(voice) for voice in data.voices])
    for group in sorted(set(groups)):
        parts = [
            np.flatnonzero((groups == group) & (sources == s)) for s in ("people", "synthetic")
        ]
        parts = sorted((part for part in parts if len(part)), key=len)
        budget = per_language
        for left, members in zip(range(len(parts), 0, -1), parts, strict=True):
            if budget is not None:
                take = min(len(members), budget // left)
                members = np.sort(rng.choice(members, take, replace=False))
                budget -= take
            picked.extend(int(i) for i in members)
    return picked


def train_language_identifier(
    model: ConvDFSMN | None,
    alphabet: Alphabet | None,
    data: Utterances,
    *,
    per_language: int | None = 2000,
    seed: int = 0,
) -> LanguageIdentifier:
    """An identifier fitted on ``data`` (a training split): the utterances
    :func:`identifier_draw` picks; with ``model``, its output is in the vectors."""
    if len(data) == 0:
        raise ValueError("no utterances to fit a language identifier on: give a training split")
    picked = identifier_draw(data, per_language=per_language, seed=seed)
    return fit_language_identifier(
        draw_vectors(model, alphabet, data, picked),
        [data.languages[i] for i in picked],
        uses_model=model is not None,
    )


def draw_vectors(
    model: ConvDFSMN | None, alphabet: Alphabet | None, data: Utterances, picked: Sequence[int]
) -> np.ndarray:
    """``[len(picked), inputs]``: :func:`model_vector` of each picked utterance of ``data``."""
    if model is not None:
        model.eval()
    return np.stack([model_vector(model, alphabet, data.features[i].float()) for i in picked])


def identify(
    identifier: LanguageIdentifier,
    model: ConvDFSMN | None,
    alphabet: Alphabet | None,
    features: np.ndarray | torch.Tensor,
) -> str:
    """The language group of one utterance ``[frames, n_mels]``."""
    return identifier.predict(
        model_vector(model if identifier.uses_model else None, alphabet, features)
    )[0]


def identify_output(
    identifier: LanguageIdentifier,
    features: np.ndarray | torch.Tensor,
    log_probs: torch.Tensor,
    alphabet: Alphabet,
) -> str:
    """The language group of one utterance from its features and the output of the forward
    pass that decodes it (an identifier fitted without the model's output uses the features
    only)."""
    output = log_probs if identifier.uses_model else None
    return identifier.predict(utterance_vector(features, output, alphabet))[0]
