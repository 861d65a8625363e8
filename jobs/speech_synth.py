"""Labelled speech at any scale: deterministic utterances synthesized with espeak-ng.

    python -m jobs.speech_synth --count 5 --out /tmp/utterances     # writes WAV + JSON lines

Utterance ``i`` of seed ``s`` is always the same transcript, language, voice, speed and pitch
(:func:`utterance_spec`), and espeak-ng renders the same samples for the same arguments, so a
corpus of any size is reproducible without storing it. Voices combine a language (English
accents, Mandarin) with an espeak-ng voice variant; :func:`voice_of` is the speaker identity the
corpus splits on (train/dev/test voices never overlap).

espeak-ng is a Debian package (``infra/install.sh`` installs it); it renders ~350x real time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from cascade.audio_features import MANDARIN_PHRASES

ESPEAK = "espeak-ng"
ENGLISH = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc")
"""English accents; each combines with every variant into a distinct voice."""
MANDARIN = ("cmn",)
VARIANTS = (
    "m1", "m2", "m3", "m4", "m5", "m6", "m7",
    "f1", "f2", "f3", "f4", "f5",
    "Andy", "Annie", "Alex", "Alicia", "Andrea", "Antonio", "aunty", "belinda",
    "benjamin", "boris", "caleb", "david", "ed", "edward", "gustave", "iven",
)  # fmt: skip
"""espeak-ng voice variants (``--voices=variant``) that sound like a person, not an effect."""
ENGLISH_WORDS = (
    "the a one two three four five six seven eight nine ten red green blue yellow black white "
    "open close start stop play pause next back up down left right yes no hello thanks please "
    "morning evening night today tomorrow weather rain sun cloud wind cold warm hot music song "
    "radio light door window kitchen room house car train bus station ticket time minute hour "
    "call message phone number order pizza coffee tea water milk bread apple orange book movie "
    "news sport game score team city street north south east west turn volume louder quieter"
).split()
MANDARIN_SHARE = 0.25
"""Share of utterances in Mandarin; the rest is English."""


@dataclass(frozen=True, kw_only=True)
class UtteranceSpec:
    """Everything that determines one synthesized utterance."""

    utterance_id: str
    text: str
    language: str
    variant: str
    speed_wpm: int
    """Speaking rate in words per minute (espeak-ng ``-s``)."""
    pitch: int
    """Pitch 0-99 (espeak-ng ``-p``)."""

    @property
    def voice(self) -> str:
        """The espeak-ng ``-v`` argument, and the speaker identity of the utterance."""
        return voice_of(self.language, self.variant)


def voice_of(language: str, variant: str) -> str:
    return f"{language}+{variant}"


def all_voices() -> list[str]:
    """Every voice the generator draws from (language x variant), in a fixed order."""
    return [voice_of(lang, v) for lang in ENGLISH + MANDARIN for v in VARIANTS]


def _rng(seed: int, index: int) -> np.random.Generator:
    # A generator per utterance: utterance i does not depend on how many came before it.
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def utterance_spec(index: int, *, seed: int = 0) -> UtteranceSpec:
    """Utterance ``index`` of the corpus with ``seed``: transcript, voice, speed and pitch."""
    if index < 0:
        raise ValueError(f"utterance index must be >= 0, got {index}")
    rng = _rng(seed, index)
    mandarin = rng.random() < MANDARIN_SHARE
    if mandarin:
        language = MANDARIN[int(rng.integers(len(MANDARIN)))]
        text = "".join(rng.choice(MANDARIN_PHRASES, size=int(rng.integers(2, 7))))
    else:
        language = ENGLISH[int(rng.integers(len(ENGLISH)))]
        text = " ".join(rng.choice(ENGLISH_WORDS, size=int(rng.integers(2, 11))))
    return UtteranceSpec(
        utterance_id=f"s{seed}-u{index:09d}",
        text=text,
        language=language,
        variant=VARIANTS[int(rng.integers(len(VARIANTS)))],
        speed_wpm=int(rng.integers(120, 201)),
        pitch=int(rng.integers(25, 76)),
    )


def espeak_binary() -> str:
    found = shutil.which(ESPEAK)
    if found is None:
        raise FileNotFoundError(
            f"{ESPEAK} is not installed; run infra/install.sh (Debian package espeak-ng)"
        )
    return found


def synthesize(spec: UtteranceSpec, *, timeout_s: float = 60) -> tuple[bytes, int]:
    """``(pcm16 mono bytes, sample rate)`` of ``spec`` rendered by espeak-ng."""
    cmd = [
        espeak_binary(),
        "-v", spec.voice,
        "-s", str(spec.speed_wpm),
        "-p", str(spec.pitch),
        "--stdout",
        spec.text,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"espeak-ng failed for {spec.utterance_id} (voice {spec.voice}): "
            f"{done.stderr.decode(errors='replace')[:300]}"
        )
    return parse_stream_wav(done.stdout)


def parse_stream_wav(data: bytes) -> tuple[bytes, int]:
    """PCM16 mono samples and rate of a WAV stream as espeak-ng writes it to stdout.

    Written as a stream, its RIFF and data sizes are placeholders (0x7fff....), which the
    standard library's reader takes at face value; the samples are whatever follows the
    ``data`` chunk header.
    """
    if len(data) < 44 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("not a RIFF/WAVE stream")
    fmt = data.find(b"fmt ")
    if fmt < 0:
        raise ValueError("WAVE stream without a fmt chunk")
    channels = int.from_bytes(data[fmt + 10 : fmt + 12], "little")
    rate = int.from_bytes(data[fmt + 12 : fmt + 16], "little")
    bits = int.from_bytes(data[fmt + 22 : fmt + 24], "little")
    if (channels, bits) != (1, 16):
        raise ValueError(f"expected 16-bit mono, got {bits}-bit with {channels} channels")
    start = data.find(b"data", fmt)
    if start < 0:
        raise ValueError("WAVE stream without a data chunk")
    pcm = data[start + 8 :]
    return pcm[: len(pcm) - len(pcm) % 2], rate


def write_wav(path: Path, pcm: bytes, rate: int) -> Path:
    """A standard (sized) 16-bit mono WAV file."""
    import wave

    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "utterances.jsonl").open("a") as listing:
        for index in range(args.start, args.start + args.count):
            spec = utterance_spec(index, seed=args.seed)
            pcm, rate = synthesize(spec)
            path = write_wav(args.out / f"{spec.utterance_id}.wav", pcm, rate)
            record = {**asdict(spec), "voice": spec.voice, "path": str(path)}
            record["seconds"] = len(pcm) / 2 / rate
            listing.write(json.dumps(record, ensure_ascii=False) + "\n")
            print(f"{spec.utterance_id} {record['seconds']:.2f}s {spec.voice}: {spec.text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
