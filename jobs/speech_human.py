"""Real human speech that installs offline: the spoken descriptions of Tux Paint's stamps.

Debian's ``tuxpaint-stamps-default`` ships, beside each stamp image, a ``NAME.txt`` caption file
(English on its first line, then ``LANG.utf8=...`` translations) and recordings of people reading
the caption: ``NAME_desc.ogg`` in English, ``NAME_desc_LANG.ogg`` in other languages. The
English clips become a landing batch (16-bit WAV at the clip's rate + ``transcripts.jsonl``) that
:func:`jobs.audio_corpus.build_corpus` treats like any other; their voice names start with
:data:`cascade.audio_features.HUMAN_VOICE_PREFIX`, which the corpus always puts in the test
split: a few dozen clips are too few to train on, and they measure how far a model trained on
synthetic voices carries to people.

    python -m jobs.speech_human --landing DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jobs.speech_synth import write_wav

STAMPS_ROOT = Path("/usr/share/tuxpaint/stamps")
"""Where the Debian package installs the stamps (``infra/install.sh`` installs it)."""
VOICE = "human-tuxpaint-en"


@dataclass(frozen=True)
class HumanClip:
    utterance_id: str
    audio: Path
    text: str


def english_caption(caption_file: Path) -> str | None:
    """The first line of a stamp's caption file, when it is not a ``LANG.utf8=`` line."""
    try:
        lines = caption_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    first = lines[0].strip() if lines else ""
    return first if first and "=" not in first.split(" ")[0] else None


def english_clips(root: Path = STAMPS_ROOT) -> list[HumanClip]:
    """Every English description recording with its caption, in a stable order."""
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root} does not exist: install the Debian package tuxpaint-stamps-default "
            "(infra/install.sh does)"
        )
    clips = []
    for audio in sorted(root.rglob("*_desc.ogg")):
        stem = audio.name.removesuffix("_desc.ogg")
        text = english_caption(audio.with_name(f"{stem}.txt"))
        if text:
            relative = audio.parent.relative_to(root).as_posix().replace("/", "-")
            clips.append(HumanClip(f"tuxpaint-{relative}-{stem}", audio, text))
    return clips


def land_human(landing: Path, root: Path = STAMPS_ROOT) -> int:
    """Decode the English clips to WAV in ``landing`` and append their transcripts."""
    import soundfile

    clips = english_clips(root)
    wav_dir = landing / "wav"
    wav_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for clip in clips:
        samples, rate = soundfile.read(clip.audio, dtype="int16", always_2d=True)
        mono = samples.mean(axis=1).astype(np.int16)
        write_wav(wav_dir / f"{clip.utterance_id}.wav", mono.tobytes(), rate)
        record = {
            "utterance_id": clip.utterance_id,
            "text": clip.text,
            "language": "en",
            "voice": VOICE,
            "source": str(clip.audio),
        }
        lines.append(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
    with (landing / "transcripts.jsonl").open("a", encoding="utf-8") as out:
        out.write("".join(lines))
    return len(clips)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landing", type=Path, required=True)
    parser.add_argument("--stamps", type=Path, default=STAMPS_ROOT)
    args = parser.parse_args(argv)
    print(f"[speech_human] landed {land_human(args.landing, args.stamps)} clips in {args.landing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
