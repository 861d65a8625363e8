"""Transcribe features with a trained model: text plus the time each character was emitted."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

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
) -> Transcript:
    """The transcript of one utterance's log-probabilities ``[T', V]`` (any forward pass's:
    eager, fake-quantized int8 or a compiled package). ``language`` (a name or code the
    alphabet knows, :meth:`~models.asr.model.Alphabet.language_of`) restricts the output to
    that language's characters; ``None`` lets every token through."""
    allowed = alphabet.allowed(language)
    log_probs = restrict(log_probs, allowed)
    times = emission_times(log_probs, subsample)
    ids = beam_decode(log_probs, beam=beam) if beam > 0 else greedy_decode(log_probs)
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
) -> Transcript:
    """One utterance ``[frames, n_mels]``; ``beam`` > 0 uses prefix beam search for the text
    (timings then come from the greedy path and are kept only when the two agree in length);
    ``language`` restricts the output to its characters (:func:`decode`)."""
    log_probs = log_probs_of(model, features)
    return decode(log_probs, alphabet, model.config.subsample, beam=beam, language=language)
