"""Transcribe features with a trained model: text plus the time each character was emitted."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models.asr.model import BLANK, Alphabet, ConvDFSMN, beam_decode, greedy_decode

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


@torch.inference_mode()
def transcribe(
    model: ConvDFSMN,
    alphabet: Alphabet,
    features: np.ndarray | torch.Tensor,
    *,
    beam: int = 0,
) -> Transcript:
    """One utterance ``[frames, n_mels]``; ``beam`` > 0 uses prefix beam search for the text
    (timings then come from the greedy path and are kept only when the two agree in length)."""
    x = torch.as_tensor(np.ascontiguousarray(features), dtype=torch.float32)[None]
    log_probs = model(x)[0]
    times = emission_times(log_probs, model.config.subsample)
    ids = beam_decode(log_probs, beam=beam) if beam > 0 else greedy_decode(log_probs)
    text = alphabet.decode(ids)
    if len(times) != len(text):
        times = [float("nan")] * len(text)
    return Transcript(text=text, char_times=times)
