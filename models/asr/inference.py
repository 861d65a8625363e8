"""Transcribe features with a trained model: text plus the time each character was emitted."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models.asr.language_model import LanguageModels, lm_beam_decode
from models.asr.model import BLANK, Alphabet, ConvDFSMN, beam_decode, greedy_decode, restrict

FRAME_SECONDS = 0.010
"""Feature hop (log-mel every 10 ms)."""


@dataclass(frozen=True)
class Transcript:
    text: str
    char_times: list[float]
    """Seconds at which each character of ``text`` was first emitted (greedy path)."""

    def words(self) -> list[dict[str, object]]:
        """Words with start/end seconds (end = the emission time of the word's last character)."""
        out, start, word, end = [], None, "", 0.0
        for char, t in zip(self.text, self.char_times, strict=True):
            if char == " ":
                if word:
                    out.append({"word": word, "start_s": start, "end_s": end})
                word, start = "", None
                continue
            if start is None:
                start = t
            word, end = word + char, t
        if word:
            out.append({"word": word, "start_s": start, "end_s": end})
        return out


def emission_times(log_probs: torch.Tensor, subsample: int) -> list[float]:
    """First output frame of each non-blank run on the greedy path, in seconds."""
    best = log_probs.argmax(-1).tolist()
    times, previous = [], BLANK
    for frame, token in enumerate(best):
        if token != previous and token != BLANK:
            times.append(frame * subsample * FRAME_SECONDS)
        previous = token
    return times


def decode(
    log_probs: torch.Tensor,
    alphabet: Alphabet,
    subsample: int,
    *,
    beam: int = 0,
    language: str | None = None,
    language_models: LanguageModels | None = None,
) -> Transcript:
    """The transcript of one utterance's log-probabilities ``[T', V]`` (any forward pass's:
    eager, fake-quantized int8 or a compiled package). ``language`` (a name or code the
    alphabet knows, :meth:`~models.asr.model.Alphabet.language_of`) restricts the output to
    that language's characters; ``None`` lets every token through. With ``language_models``
    holding an n-gram of that language, the text is their beam search's
    (:func:`~models.asr.language_model.lm_beam_decode`, which ``beam`` does not change)."""
    allowed = alphabet.allowed(language)
    log_probs = restrict(log_probs, allowed)
    times = emission_times(log_probs, subsample)
    ngram = (
        language_models.get(alphabet.language_of(language))
        if language_models is not None and language is not None
        else None
    )
    if ngram is not None:
        assert language_models is not None
        ids = lm_beam_decode(log_probs, alphabet.characters, ngram, language_models.weights)
    elif beam > 0:
        ids = beam_decode(log_probs, beam=beam)
    else:
        ids = greedy_decode(log_probs)
    text = alphabet.decode(ids)
    if len(times) != len(text):
        times = [float("nan")] * len(text)
    return Transcript(text=text, char_times=times)


@torch.inference_mode()
def log_probs_of(model: ConvDFSMN, features: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``[T', V]`` log-probabilities of one utterance ``[frames, n_mels]``."""
    x = torch.as_tensor(np.ascontiguousarray(features), dtype=torch.float32)[None]
    return model(x)[0]


@torch.inference_mode()
def transcribe(
    model: ConvDFSMN,
    alphabet: Alphabet,
    features: np.ndarray | torch.Tensor,
    *,
    beam: int = 0,
    language: str | None = None,
    language_models: LanguageModels | None = None,
) -> Transcript:
    """One utterance ``[frames, n_mels]``; ``beam`` > 0 uses prefix beam search for the text
    (timings then come from the greedy path and are kept only when the two agree in length);
    ``language`` restricts the output to its characters and, with ``language_models``, decodes
    with that language's n-gram (:func:`decode`)."""
    log_probs = log_probs_of(model, features)
    return decode(
        log_probs,
        alphabet,
        model.config.subsample,
        beam=beam,
        language=language,
        language_models=language_models,
    )
