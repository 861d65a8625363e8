"""Labelled speech at any scale: deterministic utterances synthesized with espeak-ng, flite and
festival.

    python -m jobs.speech_synth --count 5 --out /tmp/utterances     # writes WAV + JSON lines

Utterance ``i`` of seed ``s`` is always the same transcript, language, voice, speed and pitch
(:func:`utterance_spec`), and espeak-ng renders the same samples for the same arguments, so a
corpus of any size is reproducible without storing it. Voices combine a language (English
accents, Mandarin) with an espeak-ng voice variant; :func:`voice_of` is the speaker identity the
corpus splits on (train/dev/test voices never overlap). A share of the English utterances
(:data:`ENGINE_SHARES`) is spoken by the other synthesizers Debian packages instead: flite's
voices (:data:`FLITE_VOICES`) and festival's diphone voices (:data:`FESTIVAL_VOICES`), whose
voice names (``flite:slt``, ``festival:kal_diphone``) each utterance records like espeak-ng's.

espeak-ng, flite and festival (with festvox-kallpc16k and festvox-kdlpc16k) are Debian packages
(``infra/install.sh`` installs them); espeak-ng and flite render hundreds of times real time,
festival about a second per utterance (mostly its start-up).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from domains.speech.audio_features import MANDARIN_PHRASES

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
ESPEAK_ENGINE, FLITE, FESTIVAL = "espeak-ng", "flite", "festival"
FLITE_VOICES = ("awb", "kal", "kal16", "rms", "slt")
"""flite's built-in voices (``flite -lv``; ``awb_time`` only speaks the time, so it is left out)."""
FESTIVAL_VOICES = ("kal_diphone", "ked_diphone")
"""festival voices of the Debian packages festvox-kallpc16k and festvox-kdlpc16k."""
ENGINE_SHARES = {FLITE: 0.2, FESTIVAL: 0.08}
"""Share of the English utterances each other synthesizer speaks; espeak-ng speaks the rest and
all the Mandarin ones (flite and festival speak English only)."""


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
    """Pitch 0-99 (espeak-ng ``-p``; the other engines map it to a mean pitch in Hz)."""
    engine: str = ESPEAK_ENGINE
    """The synthesizer: ``espeak-ng``, ``flite`` or ``festival`` (``variant`` is then its voice)."""

    @property
    def voice(self) -> str:
        """The speaker identity of the utterance: the espeak-ng ``-v`` argument, or
        ``ENGINE:VOICE`` for flite and festival."""
        return voice_of(self.language, self.variant, self.engine)


def voice_of(language: str, variant: str, engine: str = ESPEAK_ENGINE) -> str:
    if engine == ESPEAK_ENGINE:
        return f"{language}+{variant}"
    return f"{engine}:{variant}"


def all_voices() -> list[str]:
    """Every voice the generator draws from (espeak-ng's language x variant, then flite's and
    festival's), in a fixed order."""
    return (
        [voice_of(lang, v) for lang in ENGLISH + MANDARIN for v in VARIANTS]
        + [voice_of("en-us", v, FLITE) for v in FLITE_VOICES]
        + [voice_of("en-us", v, FESTIVAL) for v in FESTIVAL_VOICES]
    )


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
    spec = UtteranceSpec(
        utterance_id=f"s{seed}-u{index:09d}",
        text=text,
        language=language,
        variant=VARIANTS[int(rng.integers(len(VARIANTS)))],
        speed_wpm=int(rng.integers(120, 201)),
        pitch=int(rng.integers(25, 76)),
    )
    # Drawn after the espeak-ng fields, so the utterances espeak-ng speaks are what they were
    # before the other engines joined.
    engine_draw, voice_draw = rng.random(), rng.random()
    if mandarin:
        return spec
    cumulative = 0.0
    for engine, voices in ((FLITE, FLITE_VOICES), (FESTIVAL, FESTIVAL_VOICES)):
        cumulative += ENGINE_SHARES[engine]
        if engine_draw < cumulative:
            variant = voices[int(voice_draw * len(voices))]
            return replace(spec, engine=engine, language="en-us", variant=variant)
    return spec


def espeak_binary() -> str:
    found = shutil.which(ESPEAK)
    if found is None:
        raise FileNotFoundError(
            f"{ESPEAK} is not installed; run infra/install.sh (Debian package espeak-ng)"
        )
    return found


def _binary(name: str, package: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} is not installed; run infra/install.sh (Debian package {package})"
        )
    return found


def _target_f0(pitch: int) -> int:
    """espeak-ng's 0-99 pitch as a mean f0 in Hz for flite and festival (25-75 -> 110-190)."""
    return int(round(70 + 1.6 * pitch))


def _flite(spec: UtteranceSpec, timeout_s: float) -> tuple[bytes, int]:
    with tempfile.TemporaryDirectory(prefix="flite-") as folder:
        out = Path(folder) / "u.wav"
        cmd = [
            _binary(FLITE, "flite"),
            "-voice", spec.variant,
            "--setf", f"duration_stretch={160 / spec.speed_wpm:.3f}",
            "--setf", f"int_f0_target_mean={_target_f0(spec.pitch)}",
            "-t", spec.text,
            "-o", str(out),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=False)
        if done.returncode != 0 or not out.is_file():
            raise RuntimeError(
                f"flite failed for {spec.utterance_id} (voice {spec.voice}): "
                f"{done.stderr.decode(errors='replace')[:300]}"
            )
        return parse_stream_wav(out.read_bytes())


def _festival(spec: UtteranceSpec, timeout_s: float) -> tuple[bytes, int]:
    f0 = _target_f0(spec.pitch)
    cmd = [
        _binary("text2wave", "festival"),
        "-eval", f"(voice_{spec.variant})",
        "-eval", f"(Parameter.set 'Duration_Stretch {160 / spec.speed_wpm:.3f})",
        "-eval", (
            f"(set! int_lr_params '((target_f0_mean {f0}) (target_f0_std {f0 // 8}) "
            "(model_f0_mean 170) (model_f0_std 34)))"
        ),
    ]  # fmt: skip
    done = subprocess.run(
        cmd, input=spec.text.encode(), capture_output=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0 or b"SIOD ERROR" in done.stderr:
        raise RuntimeError(
            f"festival failed for {spec.utterance_id} (voice {spec.voice}; Debian packages "
            f"festival and festvox-*): {done.stderr.decode(errors='replace')[:300]}"
        )
    return parse_stream_wav(done.stdout)


def synthesize(spec: UtteranceSpec, *, timeout_s: float = 60) -> tuple[bytes, int]:
    """``(pcm16 mono bytes, sample rate)`` of ``spec`` rendered by its engine."""
    if spec.engine == FLITE:
        return _flite(spec, timeout_s)
    if spec.engine == FESTIVAL:
        return _festival(spec, timeout_s)
    if spec.engine != ESPEAK_ENGINE:
        raise ValueError(f"unknown speech synthesizer {spec.engine!r}")
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
